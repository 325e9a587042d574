"""Qwen3-ASR target: a tiny random ``Qwen3ASRForConditionalGeneration`` saved as a local HF directory loads through
specli's loader; prompts and features are exactly ``Qwen3ASRProcessor.apply_transcription_request``'s; the lean
Qwen3 decoder after the prompt's prefill gives transformers' ``generate(do_sample=False)`` tokens and its logits
step by step; speculative decoding equals plain decoding with drafters always right, always wrong, random trees
and the n-gram pool (greedy, batch 1 and ragged batch rows), and keeps the target's law (sampling)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from audio_llm_drafters import DRAFTERS, OracleDrafter, RandomTreeDrafter, make_drafter
from conftest import EN_CLIPS
from qwen3_asr_fixtures import CHAT_TEMPLATE, VOCAB, write_tiny_qwen3_asr
from specli.core.batched import RowJob, decode_all
from specli.core.drafters.batched import PerRowDrafters
from specli.core.greedy import greedy_decode
from specli.core.logits import SamplingParams
from specli.core.speculative import SpecOptions, speculative_decode
from specli.errors import ModelLoadError, UsageError
from specli.models.qwen3_asr.loader import load_qwen3_asr
from specli.models.aut import audio_positions
from specli.models.speech import WindowPrompt


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_qwen3_asr(tmp_path_factory.mktemp("qwen3-asr") / "tiny")


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_qwen3_asr(str(tiny_dir), "float32")


@pytest.fixture(scope="module")
def hf(tiny_dir):
    from transformers import Qwen3ASRForConditionalGeneration

    return Qwen3ASRForConditionalGeneration.from_pretrained(str(tiny_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def processor(tiny_dir):
    from transformers import AutoTokenizer, Qwen3ASRFeatureExtractor, Qwen3ASRProcessor

    return Qwen3ASRProcessor(feature_extractor=Qwen3ASRFeatureExtractor.from_pretrained(str(tiny_dir)),
                             tokenizer=AutoTokenizer.from_pretrained(str(tiny_dir)), chat_template=CHAT_TEMPLATE)


def _clip(i: int = 0, seconds: float | None = None) -> np.ndarray:
    audio, _ = sf.read(str(EN_CLIPS[i]), dtype="float32")
    return audio if seconds is None else audio[: int(seconds * 16000)]


def _window(model, audio: np.ndarray, max_new: int = 24, language: str | None = "en", context: str | None = None):
    """(job, state, mel, frames) of one window of ``audio``."""
    hooks = model.speech_hooks()
    mel, frames = hooks.features(audio)
    job = hooks.window_job(WindowPrompt("transcribe", language, (), (), True, (-1,), max_new, frames, None,
                                        instruction=context))
    state = model.target.start(model.target.encode(mel, [frames]))
    return job, state, mel, frames


@pytest.mark.parametrize(("clip", "seconds", "language", "context"),
                         [(0, None, "en", None), (1, 3.3, None, None), (2, 0.3, "English", "Names: Elinor, Marianne."),
                          (4, 30.0, "fr", None)])
def test_prompt_and_features_are_the_processors(model, processor, clip, seconds, language, context):
    audio = _clip(clip, seconds)
    job, _state, mel, frames = _window(model, audio, language=language, context=context)
    ref = processor.apply_transcription_request(audio=audio, language=language, prompt=context)
    assert list(job.prompt) == ref["input_ids"][0].tolist()
    n = ref["input_features"].shape[2]
    torch.testing.assert_close(mel[..., :n], ref["input_features"], atol=0, rtol=0)
    assert not mel[..., n:].any() and frames == int(ref["input_features_mask"].sum())
    assert job.prompt.count(model.tokenizer.special.audio) == audio_positions(frames)


def test_loader_builds_qwen3_blocks(model, hf):
    dims = model.target.dims
    assert dims.head_dim == 24 and dims.heads * dims.head_dim != dims.hidden  # explicit head_dim
    assert all(b.q_norm is not None and b.k_norm is not None for b in model.target.lm.blocks)
    assert dims.tie_embeddings and torch.equal(model.target.lm.head.weight, hf.lm_head.weight)
    assert model.target.audio_ctx == 390 and model.tokenizer.eot == model.tokenizer.special.im_end


def test_batched_encode_equals_each_window_alone(model):
    mels, frames = zip(*(model.speech_hooks().features(_clip(i, s)) for i, s in ((0, None), (1, 2.05), (3, 30.0))))
    together = model.target.encode(torch.cat(mels), list(frames))
    for row, (mel, f) in enumerate(zip(mels, frames)):
        alone = model.target.encode(mel, [f])
        n = audio_positions(f)
        torch.testing.assert_close(together[row, :n], alone[0, :n], atol=1e-5, rtol=1e-5)


def _hf_generate(hf, job, mel, frames, max_new):
    ids = torch.tensor([job.prompt])
    out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), input_features=mel,
                      input_features_mask=(torch.arange(mel.shape[2]) < frames).long()[None],
                      max_new_tokens=max_new, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize(("clip", "seconds", "language"), [(0, None, "en"), (1, 3.3, None), (2, 0.3, "en")])
def test_lean_greedy_equals_transformers_generate(model, hf, clip, seconds, language):
    job, state, mel, frames = _window(model, _clip(clip, seconds), max_new=24, language=language)
    ours = greedy_decode(model.target, state, job)
    theirs = _hf_generate(hf, job, mel, frames, 24)
    assert ours.tokens + [job.eot] * ours.finished == theirs
    assert len(theirs) >= 10


def test_logits_step_by_step(model, hf):
    job, state, mel, frames = _window(model, _clip(1, 12.0), max_new=16)
    tokens = greedy_decode(model.target, state, job).tokens
    seq = torch.tensor([list(job.prompt) + tokens])
    with torch.no_grad():
        ref = hf(input_ids=seq, input_features=mel,
                 input_features_mask=(torch.arange(mel.shape[2]) < frames).long()[None]).logits[0]
    state.cache.crop(0)
    n = len(job.prompt)
    out = model.target.score(state, seq[:, :n])
    torch.testing.assert_close(out.logits[0], ref[:n], atol=2e-4, rtol=1e-4)
    for i in range(n, seq.shape[1]):  # one token a step, as decoding scores them
        step = model.target.score(state, seq[:, i : i + 1]).logits[0, 0]
        torch.testing.assert_close(step, ref[i], atol=2e-4, rtol=1e-4)


WINDOWS: dict = {}


def _cached_window(model, seconds: float):
    if seconds not in WINDOWS:
        WINDOWS[seconds] = _window(model, _clip(3, seconds), max_new=40, language=None)
    job, state, _mel, _frames = WINDOWS[seconds]
    state.cache.crop(0)
    return job, state


@settings(max_examples=5, deadline=None)
@given(seconds=st.sampled_from([2.0, 7.5]), max_draft=st.sampled_from([1, 2, 3, 5, 8]),
       max_new=st.integers(1, 40), seed=st.integers(0, 1000))
@pytest.mark.parametrize("name", DRAFTERS)
def test_speculative_greedy_equals_greedy(model, name, seconds, max_draft, max_new, seed):
    job, state = _cached_window(model, seconds)
    job = replace(job, max_new_tokens=max_new)
    ref = greedy_decode(model.target, state, job)
    state.cache.crop(0)
    out = speculative_decode(model.target, state, job, make_drafter(name, ref.tokens, job.eot, seed, VOCAB),
                             SpecOptions(max_draft=max_draft))
    assert out.tokens == ref.tokens and out.finished == ref.finished
    assert out.sum_logprob == pytest.approx(ref.sum_logprob, abs=1e-3)
    if name == "always-right":  # every step emits max_draft accepted tokens + 1
        assert out.stats.verify_steps == -(-out.stats.tokens // (max_draft + 1))
    if name == "always-wrong":
        assert out.stats.accepted == 0


@pytest.mark.parametrize("drafter", ["none", "random-tree"])
def test_ragged_batch_rows_equal_batch_1(model, drafter):
    """Windows of different lengths (prompts of different lengths) decoded as rows of one batch, joining as
    slots free up, plain or speculative with random trees: each row equals its batch-1 greedy decode."""
    windows = [_window(model, _clip(i, s), max_new=n, language=lang)
               for i, s, n, lang in ((0, None, 20, "en"), (1, 2.05, 9, None), (2, 0.3, 30, "en"), (3, 7.5, 14, None))]
    ref = {}
    for key, (job, state, _mel, _frames) in enumerate(windows):
        ref[key] = greedy_decode(model.target, state, job)
    rows = [RowJob(key, state.audio, job) for key, (job, state, _mel, _frames) in enumerate(windows)]
    seeds = iter(range(100))
    spec = {} if drafter == "none" else {
        "drafter": PerRowDrafters(lambda: RandomTreeDrafter(next(seeds), VOCAB)), "options": SpecOptions(max_draft=5)}
    got = dict(decode_all(model.target, rows, 3, **spec))
    for key, res in ref.items():
        assert got[key].tokens == res.tokens and got[key].finished == res.finished


def test_speculative_sampling_keeps_the_first_token_law(model):
    """Rejection sampling of a wrong drafter's tokens: the first token's frequencies match the target's
    filtered distribution (TV within 3 sigma of the empirical bound)."""
    job, state = _cached_window(model, 2.0)
    job = replace(job, max_new_tokens=2, sampling=SamplingParams(temperature=0.5))
    probs = (model.target.score(state, torch.tensor([list(job.prompt)])).logits[0, -1] / 0.5).softmax(-1)
    state.cache.crop(0)
    ref = greedy_decode(model.target, state, replace(job, sampling=SamplingParams()))
    counts = torch.zeros(VOCAB)
    runs = 300
    gen = torch.Generator().manual_seed(0)
    for _ in range(runs):
        state.cache.crop(0)
        out = speculative_decode(model.target, state, replace(job, generator=gen),
                                 OracleDrafter(ref.tokens + [job.eot], VOCAB), SpecOptions(max_draft=2))
        counts[out.tokens[0] if out.tokens else job.eot] += 1
    tv = 0.5 * (counts / runs - probs).abs().sum()
    support = int((probs > 1e-3).sum())
    assert float(tv) < 3 * 0.5 * (support / runs) ** 0.5


def test_text_drops_the_models_language_prefix_and_knows_its_languages(model):
    tok = model.tokenizer
    ids = tok.encode("language English") + [tok.special.asr_text] + tok.encode("Hello there.") + [tok.eot]
    assert tok.decode(ids) == "Hello there."
    assert tok.decode(tok.encode("no tag")) == "no tag"
    hooks = model.speech_hooks()
    hooks.check_support("tiny", "transcribe", "yue")
    with pytest.raises(UsageError, match="only transcribes"):
        hooks.check_support("tiny", "translate", "en")
    with pytest.raises(UsageError, match="does not know language 'xx'"):
        hooks.check_support("tiny", "transcribe", "xx")


def test_missing_files_name_them(tiny_dir, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    (broken / "model.safetensors").unlink()
    (broken / "processor_config.json").unlink()  # the feature extractor's settings (transformers >= 5)
    with pytest.raises(ModelLoadError) as err:
        load_qwen3_asr(str(broken), "float32")
    assert err.value.exit_code == 3
    assert "model.safetensors" in str(err.value)
    assert "preprocessor_config.json (or processor_config.json with a feature_extractor entry)" in str(err.value)
    with pytest.raises(ModelLoadError, match="not found"):
        load_qwen3_asr(str(tmp_path / "nowhere"), "float32")
    (tmp_path / "nochat").mkdir()
    shutil.copytree(tiny_dir, tmp_path / "nochat" / "m")
    (tmp_path / "nochat" / "m" / "chat_template.jinja").unlink()
    with pytest.raises(ModelLoadError, match="no chat template"):
        load_qwen3_asr(str(tmp_path / "nochat" / "m"), "float32")
