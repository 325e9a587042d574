"""Qwen2-Audio target: a tiny random ``Qwen2AudioForConditionalGeneration`` saved as a local HF directory loads
through specli's loader; its features are specli's log-mel; the lean decoder after the prompt's prefill gives
transformers' ``generate(do_sample=False)`` tokens and its logits step by step; speculative decoding equals
plain decoding with drafters always right, always wrong, random trees and the n-gram pool (greedy), and keeps
the target's law (sampling)."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import EN_CLIPS
from qwen2_audio_fixtures import N_MELS, VOCAB, write_tiny_qwen2_audio
from specli.core.drafters.base import DraftProposal
from specli.core.drafters.ngram import NgramDrafter, NgramPool
from specli.core.greedy import greedy_decode
from specli.core.logits import SamplingParams
from specli.core.speculative import SpecOptions, speculative_decode
from specli.errors import ModelLoadError
from specli.models.qwen2_audio.loader import load_qwen2_audio
from specli.models.speech import WindowPrompt


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_qwen2_audio(tmp_path_factory.mktemp("qwen2-audio") / "tiny")


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_qwen2_audio(str(tiny_dir), "float32")


@pytest.fixture(scope="module")
def hf(tiny_dir):
    from transformers import Qwen2AudioForConditionalGeneration

    return Qwen2AudioForConditionalGeneration.from_pretrained(str(tiny_dir), dtype=torch.float32).eval()


def _clip(i: int = 0, seconds: float | None = None) -> np.ndarray:
    audio, _ = sf.read(str(EN_CLIPS[i]), dtype="float32")
    return audio if seconds is None else audio[: int(seconds * 16000)]


def _window(model, audio: np.ndarray, max_new: int = 24, language: str | None = "en"):
    """(job, state, mel, frames) of one window of ``audio``."""
    hooks = model.speech_hooks()
    mel, frames = hooks.features(audio)
    job = hooks.window_job(WindowPrompt("transcribe", language, (), (), True, (-1,), max_new, frames, None))
    state = model.target.start(model.target.encode(mel, [frames]))
    return job, state, mel, frames


@pytest.mark.parametrize("n_mels", [N_MELS, 128])
def test_features_are_the_feature_extractors(model, n_mels):
    from transformers import WhisperFeatureExtractor

    audio = _clip(0)
    ref = WhisperFeatureExtractor(feature_size=n_mels)(audio, sampling_rate=16000, return_tensors="pt",
                                                        padding="max_length", return_attention_mask=True)
    mel, frames = model.speech_hooks().features(audio) if n_mels == N_MELS else (None, None)
    if mel is None:
        from specli.io.audio import window_features
        mel = window_features(audio, n_mels)
    torch.testing.assert_close(mel, ref["input_features"], atol=2e-5, rtol=0)
    if frames is not None:
        assert frames == int(ref["attention_mask"].sum())


def test_loader_reads_the_untied_head_and_template(model, hf):
    assert not model.target.dims.tie_embeddings  # text_config.tie_word_embeddings (the logits tests use the head)
    assert not torch.equal(hf.lm_head.weight, hf.model.language_model.embed_tokens.weight)
    assert model.tokenizer.template is not None and model.tokenizer.eot == model.tokenizer.special.im_end
    text = model.tokenizer.render("Detect the language and recognize the speech: <|en|>")
    assert "Audio 1: <|audio_bos|><|AUDIO|><|audio_eos|>\nDetect the language" in text
    assert text.endswith("<|im_start|>assistant\n")


def _hf_generate(hf, job, mel, frames, max_new):
    ids = torch.tensor([job.prompt])
    out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), input_features=mel,
                      feature_attention_mask=(torch.arange(mel.shape[2]) < frames).long()[None],
                      max_new_tokens=max_new, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize(("clip", "seconds"), [(0, None), (1, 3.3), (2, 0.9)])
def test_lean_greedy_equals_transformers_generate(model, hf, clip, seconds):
    job, state, mel, frames = _window(model, _clip(clip, seconds), max_new=24)
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
                 feature_attention_mask=(torch.arange(mel.shape[2]) < frames).long()[None]).logits[0]
    state.cache.crop(0)
    n = len(job.prompt)
    out = model.target.score(state, seq[:, :n])
    torch.testing.assert_close(out.logits[0], ref[:n], atol=2e-4, rtol=1e-4)
    for i in range(n, seq.shape[1]):  # one token a step, as decoding scores them
        step = model.target.score(state, seq[:, i : i + 1]).logits[0, 0]
        torch.testing.assert_close(step, ref[i], atol=2e-4, rtol=1e-4)


class OracleDrafter:
    """Proposes the reference continuation (always right), or each of its tokens plus one (always wrong)."""

    def __init__(self, reference: list[int], wrong: bool = False) -> None:
        self.reference, self.wrong = reference, wrong

    def start(self, state, prompt: list[int]) -> None:
        self.prompt_len = len(prompt)

    def propose(self, request) -> DraftProposal:
        done = len(request.tokens) - request.prompt_len
        tokens = self.reference[done : done + request.budget]
        if self.wrong:
            tokens = [(t + 1) % VOCAB for t in tokens]
        return DraftProposal(tokens, list(range(-1, len(tokens) - 1)), [1.0] * len(tokens))

    def commit(self, tokens: list[int]) -> None:
        pass


class RandomTreeDrafter:
    """Random trees of random tokens (seeded)."""

    def __init__(self, seed: int) -> None:
        self.g = torch.Generator().manual_seed(seed)

    def start(self, state, prompt: list[int]) -> None:
        pass

    def propose(self, request) -> DraftProposal:
        n = int(torch.randint(0, request.budget + 1, (1,), generator=self.g))
        parents = [int(torch.randint(-1, i, (1,), generator=self.g)) if i else -1 for i in range(n)]
        return DraftProposal(torch.randint(0, VOCAB, (n,), generator=self.g).tolist(), parents, [1.0] * n)

    def commit(self, tokens: list[int]) -> None:
        pass


def _drafter(name: str, reference: list[int], eot: int, seed: int):
    if name == "always-right":
        return OracleDrafter(reference + [eot])
    if name == "always-wrong":
        return OracleDrafter(reference + [eot], wrong=True)
    if name == "random-tree":
        return RandomTreeDrafter(seed)
    pool = NgramPool(3)
    pool.add(reference[: len(reference) // 2] * 2)  # half right, then wrong
    return NgramDrafter(pool, eot)


WINDOWS: dict = {}


def _cached_window(model, seconds: float):
    if seconds not in WINDOWS:
        WINDOWS[seconds] = _window(model, _clip(3, seconds), max_new=40)
    job, state, _mel, _frames = WINDOWS[seconds]
    state.cache.crop(0)
    return job, state


@settings(max_examples=5, deadline=None)
@given(seconds=st.sampled_from([2.0, 7.5]), max_draft=st.sampled_from([1, 2, 3, 5, 8]),
       max_new=st.integers(1, 40), seed=st.integers(0, 1000))
@pytest.mark.parametrize("name", ["always-right", "always-wrong", "random-tree", "ngram-pool"])
def test_speculative_greedy_equals_greedy(model, name, seconds, max_draft, max_new, seed):
    from dataclasses import replace

    job, state = _cached_window(model, seconds)
    job = replace(job, max_new_tokens=max_new)
    ref = greedy_decode(model.target, state, job)
    state.cache.crop(0)
    out = speculative_decode(model.target, state, job, _drafter(name, ref.tokens, job.eot, seed),
                             SpecOptions(max_draft=max_draft))
    assert out.tokens == ref.tokens and out.finished == ref.finished
    assert out.sum_logprob == pytest.approx(ref.sum_logprob, abs=1e-3)
    if name == "always-right":  # every step emits max_draft accepted tokens + 1
        assert out.stats.verify_steps == -(-out.stats.tokens // (max_draft + 1))
    if name == "always-wrong":
        assert out.stats.accepted == 0


def test_speculative_sampling_keeps_the_first_token_law(model):
    """Rejection sampling of a wrong drafter's tokens: the first token's frequencies match the target's
    filtered distribution (TV within 3 sigma of the empirical bound)."""
    from dataclasses import replace

    job, state = _cached_window(model, 2.0)
    params = SamplingParams(temperature=0.5)
    job = replace(job, max_new_tokens=2, sampling=params)
    state.cache.crop(0)
    probs = (model.target.score(state, torch.tensor([list(job.prompt)])).logits[0, -1] / 0.5).softmax(-1)
    state.cache.crop(0)
    ref = greedy_decode(model.target, state, replace(job, sampling=SamplingParams()))
    counts = torch.zeros(VOCAB)
    runs = 300
    gen = torch.Generator().manual_seed(0)
    for _ in range(runs):
        state.cache.crop(0)
        out = speculative_decode(model.target, state, replace(job, generator=gen),
                                 OracleDrafter(ref.tokens + [job.eot]), SpecOptions(max_draft=2))
        counts[out.tokens[0] if out.tokens else job.eot] += 1
    tv = 0.5 * (counts / runs - probs).abs().sum()
    support = int((probs > 1e-3).sum())
    assert float(tv) < 3 * 0.5 * (support / runs) ** 0.5


def test_missing_files_name_them(tiny_dir, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    (broken / "model.safetensors").unlink()
    (broken / "processor_config.json").unlink()  # the feature extractor's settings (transformers >= 5)
    with pytest.raises(ModelLoadError) as err:
        load_qwen2_audio(str(broken), "float32")
    assert err.value.exit_code == 3
    assert "model.safetensors" in str(err.value)
    assert "preprocessor_config.json (or processor_config.json with a feature_extractor entry)" in str(err.value)
    with pytest.raises(ModelLoadError, match="not found"):
        load_qwen2_audio(str(tmp_path / "nowhere"), "float32")


def test_instructions_and_a_base_model_without_chat_template(tmp_path):
    from specli.models.qwen2_audio.text import default_instruction

    assert default_instruction("transcribe", "en") == "Detect the language and recognize the speech: <|en|>"
    assert default_instruction("translate", None) == "Detect the language and translate the speech into English:"
    base = load_qwen2_audio(str(write_tiny_qwen2_audio(tmp_path / "base", chat=False)), "float32")
    assert base.tokenizer.template is None and base.tokenizer.eot == base.tokenizer.special.end_of_text
    job, state, _mel, _frames = _window(base, _clip(0, 1.0), max_new=5)
    sp = base.tokenizer.special
    assert list(job.prompt[:2]) == [sp.audio_bos, sp.audio] and job.prompt.count(sp.audio) == 25  # 100 frames: 50 after conv, 25 pooled
    assert len(greedy_decode(base.target, state, job).tokens) <= 5


def test_resume_settings_name_the_instruction_only_when_given():
    from specli.asr.pipeline import option_settings
    from specli.asr.windows import TranscribeOptions

    assert "instruction" not in option_settings(TranscribeOptions())  # Whisper outputs made before still resume
    assert option_settings(TranscribeOptions(instruction="Transcribe."))["instruction"] == "Transcribe."
