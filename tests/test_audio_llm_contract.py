"""The audio-LLM family contract, over ``audio_llm_families.FAMILIES`` (Qwen2-Audio, Qwen3-ASR, the Qwen3-Omni
thinker; each a tiny random checkpoint in the layout transformers saves): after the prompt's prefill the lean decoder
gives transformers' ``generate(do_sample=False)`` tokens and its logits step by step; speculative decoding equals
plain decoding with drafters always right, always wrong, random trees and the n-gram pool (greedy, batch 1 and
ragged batch rows) and keeps the target's law (sampling); a broken or absent checkpoint is named in the error.
Each family's own file (test_qwen2_audio, test_qwen3_asr, test_qwen3_omni) tests its quirks. A new family is one
entry of ``FAMILIES``."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from audio_llm_drafters import DRAFTERS, OracleDrafter, RandomTreeDrafter, make_drafter
from audio_llm_families import FAMILIES, clip, window
from conftest import examples
from specli.core.batched import RowJob, decode_all
from specli.core.drafters.batched import PerRowDrafters
from specli.core.greedy import greedy_decode
from specli.core.logits import SamplingParams
from specli.core.speculative import SpecOptions, speculative_decode
from specli.errors import ModelLoadError

NAMES = sorted(FAMILIES)
# (family, clip, seconds, language, task): each family's windows checked against transformers' generate
GENERATE = [("qwen2-audio", 0, None, "en", "transcribe"), ("qwen2-audio", 1, 3.3, "en", "transcribe"),
            ("qwen2-audio", 2, 0.9, "en", "transcribe"),
            ("qwen3-asr", 0, None, "en", "transcribe"), ("qwen3-asr", 1, 3.3, None, "transcribe"),
            ("qwen3-asr", 2, 0.3, "en", "transcribe"),
            ("qwen3-omni", 0, None, "en", "transcribe"), ("qwen3-omni", 1, 3.3, None, "transcribe"),
            ("qwen3-omni", 2, 0.3, "fr", "translate")]


def _frame_mask(mel: torch.Tensor, frames: int) -> torch.Tensor:
    return (torch.arange(mel.shape[2]) < frames).long()[None]


@pytest.mark.parametrize(("family", "clip_index", "seconds", "language", "task"), GENERATE,
                         ids=[f"{f}-clip{c}-{s or 'all'}s-{lang}-{t}" for f, c, s, lang, t in GENERATE])
def test_lean_greedy_equals_transformers_generate(audio_llm, family, clip_index, seconds, language, task):
    fam = audio_llm(family)
    job, state, mel, frames = window(fam.model, clip(clip_index, seconds), max_new=24, language=language, task=task)
    ours = greedy_decode(fam.model.target, state, job)
    ids = torch.tensor([job.prompt])
    out = fam.hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), input_features=mel,
                          **{fam.family.mask_arg: _frame_mask(mel, frames)}, max_new_tokens=24, do_sample=False)
    theirs = out[0, ids.shape[1]:].tolist()
    assert ours.tokens + [job.eot] * ours.finished == theirs
    assert len(theirs) >= 10


@pytest.mark.parametrize("family", NAMES)
def test_logits_step_by_step(audio_llm, family):
    fam = audio_llm(family)
    target = fam.model.target
    job, state, mel, frames = window(fam.model, clip(1, 12.0), max_new=16)
    tokens = greedy_decode(target, state, job).tokens
    seq = torch.tensor([list(job.prompt) + tokens])
    extra = {"attention_mask": torch.ones_like(seq)} if fam.family.forward_attention_mask else {}
    with torch.no_grad():
        ref = fam.hf(input_ids=seq, input_features=mel, **{fam.family.mask_arg: _frame_mask(mel, frames)},
                     **extra).logits[0]
    state.cache.crop(0)
    n = len(job.prompt)
    torch.testing.assert_close(target.score(state, seq[:, :n]).logits[0], ref[:n], atol=2e-4, rtol=1e-4)
    for i in range(n, seq.shape[1]):  # one token a step, as decoding scores them
        step = target.score(state, seq[:, i : i + 1]).logits[0, 0]
        torch.testing.assert_close(step, ref[i], atol=2e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def spec_window(audio_llm):
    """(job, state) of the first ``seconds`` of clip 3 per family, 40 new tokens; the state's cache emptied."""
    windows: dict = {}

    def get(family: str, seconds: float):
        fam = audio_llm(family)
        if (family, seconds) not in windows:
            windows[family, seconds] = window(fam.model, clip(3, seconds), max_new=40,
                                              language=fam.family.spec_language)
        job, state, _mel, _frames = windows[family, seconds]
        state.cache.crop(0)
        return job, state

    return get


@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("family", NAMES)
def test_speculative_greedy_equals_greedy(audio_llm, spec_window, family, name):
    target, vocab = audio_llm(family).model.target, FAMILIES[family].vocab

    @examples(5)
    @given(seconds=st.sampled_from([2.0, 7.5]), max_draft=st.sampled_from([1, 2, 3, 5, 8]),
           max_new=st.integers(1, 40), seed=st.integers(0, 1000))
    def check(seconds, max_draft, max_new, seed):
        job, state = spec_window(family, seconds)
        job = replace(job, max_new_tokens=max_new)
        ref = greedy_decode(target, state, job)
        state.cache.crop(0)
        out = speculative_decode(target, state, job, make_drafter(name, ref.tokens, job.eot, seed, vocab),
                                 SpecOptions(max_draft=max_draft))
        assert out.tokens == ref.tokens and out.finished == ref.finished
        assert out.sum_logprob == pytest.approx(ref.sum_logprob, abs=1e-3)
        if name == "always-right":  # every step emits max_draft accepted tokens + 1
            assert out.stats.verify_steps == -(-out.stats.tokens // (max_draft + 1))
        if name == "always-wrong":
            assert out.stats.accepted == 0

    check()


@pytest.mark.parametrize("drafter", ["none", "random-tree"])
@pytest.mark.parametrize("family", NAMES)
def test_ragged_batch_rows_equal_batch_1(audio_llm, family, drafter):
    """Windows of different lengths (prompts of different lengths) decoded as rows of one batch, joining as
    slots free up, plain or speculative with random trees: each row equals its batch-1 greedy decode."""
    model, vocab = audio_llm(family).model, FAMILIES[family].vocab
    windows = [window(model, clip(i, s), max_new=n, language=lang)
               for i, s, n, lang in ((0, None, 20, "en"), (1, 2.05, 9, None), (2, 0.3, 30, "en"), (3, 7.5, 14, None))]
    ref = {key: greedy_decode(model.target, state, job) for key, (job, state, _m, _f) in enumerate(windows)}
    rows = [RowJob(key, state.audio, job) for key, (job, state, _m, _f) in enumerate(windows)]
    seeds = iter(range(100))
    spec = {} if drafter == "none" else {
        "drafter": PerRowDrafters(lambda: RandomTreeDrafter(next(seeds), vocab)), "options": SpecOptions(max_draft=5)}
    got = dict(decode_all(model.target, rows, 3, **spec))
    for key, res in ref.items():
        assert got[key].tokens == res.tokens and got[key].finished == res.finished, key


@pytest.mark.parametrize("family", NAMES)
def test_speculative_sampling_keeps_the_first_token_law(audio_llm, spec_window, family):
    """Rejection sampling of a wrong drafter's tokens: the first token's frequencies match the target's
    filtered distribution (TV within 3 sigma of the empirical bound)."""
    target, vocab = audio_llm(family).model.target, FAMILIES[family].vocab
    job, state = spec_window(family, 2.0)
    job = replace(job, max_new_tokens=2, sampling=SamplingParams(temperature=0.5))
    probs = (target.score(state, torch.tensor([list(job.prompt)])).logits[0, -1] / 0.5).softmax(-1)
    state.cache.crop(0)
    ref = greedy_decode(target, state, replace(job, sampling=SamplingParams()))
    counts = torch.zeros(vocab)
    runs = 300
    gen = torch.Generator().manual_seed(0)
    for _ in range(runs):
        state.cache.crop(0)
        out = speculative_decode(target, state, replace(job, generator=gen),
                                 OracleDrafter(ref.tokens + [job.eot], vocab), SpecOptions(max_draft=2))
        counts[out.tokens[0] if out.tokens else job.eot] += 1
    tv = 0.5 * (counts / runs - probs).abs().sum()
    support = int((probs > 1e-3).sum())
    assert float(tv) < 3 * 0.5 * (support / runs) ** 0.5


@pytest.mark.parametrize("family", NAMES)
def test_missing_files_name_them(audio_llm, family, tmp_path):
    fam = audio_llm(family)
    broken = tmp_path / "broken"
    shutil.copytree(fam.dir, broken)
    for name in ("model.safetensors", *fam.family.missing):
        (broken / name).unlink()
    with pytest.raises(ModelLoadError) as err:
        fam.family.load(str(broken), "float32")
    assert err.value.exit_code == 3
    for message in fam.family.missing_messages:
        assert message in str(err.value)
    with pytest.raises(ModelLoadError, match=fam.family.nowhere_message):
        fam.family.load(fam.family.nowhere(tmp_path), "float32")
