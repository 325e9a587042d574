"""Qwen3-Omni thinker target: a tiny random ``Qwen3OmniMoeForConditionalGeneration`` (8 experts top-2, a vision
tower of depth 1, no talker) saved as a local HF directory loads through specli's loader; the grouped MoE equals
transformers' sparse block (with and without norm_topk_prob); 1-D RoPE at position + the row's delta equals the
3-D M-RoPE for text positions, per batch row; the lean decoder after the prompt's prefill gives the thinker's
``generate(do_sample=False)`` tokens and its logits step by step; speculative decoding equals plain decoding
(always right / always wrong / random trees / n-gram pool; batch 1 and ragged batches) and keeps the target's
law (sampling)."""

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
from qwen3_omni_fixtures import IDS, VOCAB, write_tiny_qwen3_omni
from specli.core.batched import RowJob, decode_all
from specli.core.drafters.batched import PerRowDrafters
from specli.core.greedy import greedy_decode
from specli.core.logits import SamplingParams
from specli.core.speculative import SpecOptions, speculative_decode
from specli.errors import ModelLoadError, UsageError
from specli.models.aut import audio_positions
from specli.models.moe import MoE
from specli.models.qwen3_omni.loader import load_qwen3_omni
from specli.models.speech import WindowPrompt


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_qwen3_omni(tmp_path_factory.mktemp("qwen3-omni") / "tiny")


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_qwen3_omni(str(tiny_dir), "float32")


@pytest.fixture(scope="module")
def thinker(tiny_dir):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    hf = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(tiny_dir), dtype=torch.float32,
                                                              enable_audio_output=False).eval()
    assert not hasattr(hf, "talker")  # enable_audio_output=False: the talker is never built
    return hf.thinker


def _clip(i: int = 0, seconds: float | None = None) -> np.ndarray:
    audio, _ = sf.read(str(EN_CLIPS[i]), dtype="float32")
    return audio if seconds is None else audio[: int(seconds * 16000)]


def _window(model, audio: np.ndarray, max_new: int = 24, language: str | None = "en", task: str = "transcribe"):
    hooks = model.speech_hooks()
    mel, frames = hooks.features(audio)
    job = hooks.window_job(WindowPrompt(task, language, (), (), True, (-1,), max_new, frames, None))
    state = model.target.start(model.target.encode(mel, [frames]))
    return job, state, mel, frames


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_grouped_moe_equals_the_sparse_block(thinker, norm_topk_prob):
    block = thinker.model.language_model.layers[0].mlp
    block.gate.norm_topk_prob = norm_topk_prob
    try:
        weights = {f"m.{k}": v for k, v in block.state_dict().items()}
        moe = MoE(weights, "m", torch.float32, 2, norm_topk_prob)
        x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            torch.testing.assert_close(moe(x), block(x), atol=1e-5, rtol=1e-5)
        assert 2 <= moe.experts_touched <= 8
    finally:
        block.gate.norm_topk_prob = True


def test_loader_builds_moe_blocks_without_the_talker(model):
    blocks = model.target.lm.blocks
    assert [b.moe is not None for b in blocks] == [True, False, True]  # mlp_only_layers=[1]: dense
    assert model.target.dims.head_dim == 16 and not model.target.dims.tie_embeddings
    assert model.target.dims.moe.top_k == 2 and model.target.audio_ctx == 390


def test_mrope_with_equal_axes_is_1d_rope(model, thinker):
    rotary = thinker.model.language_model.rotary_emb  # interleaved M-RoPE, sections [2, 3, 3]
    pos = torch.tensor([[0, 5, 17, 389, 1000], [3, 4, 7, 8, 2047]])
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), pos[None].expand(3, -1, -1))
    ours_cos, ours_sin = model.target.lm._rope(pos)
    torch.testing.assert_close(ours_cos[:, 0], cos, atol=0, rtol=0)
    torch.testing.assert_close(ours_sin[:, 0], sin, atol=0, rtol=0)
    cos3, _ = rotary(torch.zeros(1), torch.stack([pos, pos + 1, pos]))  # unequal axes: not 1-D RoPE
    assert not torch.equal(cos3, cos)


def test_text_positions_are_position_plus_row_delta_per_batch_row(model, thinker):
    """A ragged batch (left padding) of an audio prompt, an image prompt and a short audio prompt: for each row,
    the text after the last multimodal block has equal 3-D ids = index + that row's delta (so decoding at
    cache position + delta with 1-D RoPE is exact); the audio prompts' delta is 0 and equals ours."""
    a, b = _window(model, _clip(0, 2.0))[0], _window(model, _clip(1, 0.7))[0]
    image = [IDS["<|im_start|>"], 10, IDS["<|vision_start|>"], *[IDS["<|image_pad|>"]] * 4, IDS["<|vision_end|>"],
             *range(20, 30), IDS["<|im_end|>"]]
    rows = [list(a.prompt), image, list(b.prompt)]
    width = max(map(len, rows))
    ids = torch.tensor([[IDS["<|endoftext|>"]] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    audio_frames = torch.tensor([200, 70])
    positions, deltas = thinker.model.get_rope_index(ids, image_grid_thw=torch.tensor([[1, 4, 4]]),
                                                     attention_mask=mask, audio_seqlens=audio_frames)
    assert deltas[1].item() < 0 and deltas[0].item() == deltas[2].item() == 0  # the image row is ragged in RoPE
    for r, row in enumerate(rows):
        real = positions[:, r, width - len(row):]  # [3, n]
        last_mm = max(i for i, t in enumerate(row) if t in (IDS["<|audio_end|>"], IDS["<|vision_end|>"]))
        text = real[:, last_mm + 1:]
        index = torch.arange(last_mm + 1, len(row))
        assert torch.equal(text[0], text[1]) and torch.equal(text[1], text[2])
        assert torch.equal(text[0].long(), index + int(deltas[r]))
    for prompt in (a.prompt, b.prompt):
        assert model.target.prompt_rope_delta(torch.tensor(prompt)) == 0
    with pytest.raises(ValueError, match="image or video tokens"):
        model.target.prompt_rope_delta(torch.tensor(image))


def _hf_generate(thinker, job, mel, frames, max_new):
    ids = torch.tensor([job.prompt])
    out = thinker.generate(input_ids=ids, attention_mask=torch.ones_like(ids), input_features=mel,
                           feature_attention_mask=(torch.arange(mel.shape[2]) < frames).long()[None],
                           max_new_tokens=max_new, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize(("clip", "seconds", "language", "task"),
                         [(0, None, "en", "transcribe"), (1, 3.3, None, "transcribe"), (2, 0.3, "fr", "translate")])
def test_lean_greedy_equals_transformers_generate(model, thinker, clip, seconds, language, task):
    job, state, mel, frames = _window(model, _clip(clip, seconds), max_new=24, language=language, task=task)
    assert job.prompt.count(IDS["<|audio_pad|>"]) == audio_positions(frames)
    ours = greedy_decode(model.target, state, job)
    theirs = _hf_generate(thinker, job, mel, frames, 24)
    assert ours.tokens + [job.eot] * ours.finished == theirs
    assert len(theirs) >= 10


def test_logits_step_by_step(model, thinker):
    job, state, mel, frames = _window(model, _clip(1, 12.0), max_new=16)
    tokens = greedy_decode(model.target, state, job).tokens
    seq = torch.tensor([list(job.prompt) + tokens])
    with torch.no_grad():
        ref = thinker(input_ids=seq, attention_mask=torch.ones_like(seq), input_features=mel,
                      feature_attention_mask=(torch.arange(mel.shape[2]) < frames).long()[None]).logits[0]
    state.cache.crop(0)
    n = len(job.prompt)
    torch.testing.assert_close(model.target.score(state, seq[:, :n]).logits[0], ref[:n], atol=2e-4, rtol=1e-4)
    for i in range(n, seq.shape[1]):
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
    if name == "always-right":
        assert out.stats.verify_steps == -(-out.stats.tokens // (max_draft + 1))
    if name == "always-wrong":
        assert out.stats.accepted == 0


@pytest.mark.parametrize("drafter", ["none", "random-tree"])
def test_ragged_batch_rows_equal_batch_1(model, drafter):
    windows = [_window(model, _clip(i, s), max_new=n, language=lang)
               for i, s, n, lang in ((0, None, 20, "en"), (1, 2.05, 9, None), (2, 0.3, 30, "en"), (3, 7.5, 14, None))]
    ref = {key: greedy_decode(model.target, state, job) for key, (job, state, _m, _f) in enumerate(windows)}
    rows = [RowJob(key, state.audio, job) for key, (job, state, _m, _f) in enumerate(windows)]
    seeds = iter(range(100))
    spec = {} if drafter == "none" else {
        "drafter": PerRowDrafters(lambda: RandomTreeDrafter(next(seeds), VOCAB)), "options": SpecOptions(max_draft=5)}
    got = dict(decode_all(model.target, rows, 3, **spec))
    for key, res in ref.items():
        assert got[key].tokens == res.tokens and got[key].finished == res.finished


def test_speculative_sampling_keeps_the_first_token_law(model):
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
    assert float(tv) < 3 * 0.5 * (int((probs > 1e-3).sum()) / runs) ** 0.5


def test_instructions_languages_and_missing_files(model, tiny_dir, tmp_path):
    import shutil

    from specli.models.qwen3_omni.text import default_instruction

    assert default_instruction("transcribe", "en") == "Transcribe the English audio into text."
    assert default_instruction("translate", None) == "Translate the audio into English text."
    with pytest.raises(UsageError, match="does not know language"):
        model.speech_hooks().check_support("tiny", "transcribe", "xx")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError) as err:
        load_qwen3_omni(str(broken), "float32")
    assert err.value.exit_code == 3 and "model.safetensors" in str(err.value)
    with pytest.raises(ModelLoadError, match="never downloads"):
        load_qwen3_omni("qwen3-omni-nowhere", "float32")
