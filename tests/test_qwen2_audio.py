"""Qwen2-Audio's quirks (test_audio_llm_contract runs the family contract: transformers' generate and logits,
speculative == greedy, the first-token law, missing files): a tiny random ``Qwen2AudioForConditionalGeneration``
saved as a local HF directory loads its untied head and chat template; its features are specli's log-mel; a base
model without a chat template prompts with the audio first; the instruction is a resume setting only when given."""

from __future__ import annotations

import pytest
import torch

from audio_llm_families import clip, window
from qwen2_audio_fixtures import N_MELS, write_tiny_qwen2_audio
from specli.core.greedy import greedy_decode
from specli.models.qwen2_audio.loader import load_qwen2_audio


@pytest.fixture(scope="module")
def model(audio_llm):
    return audio_llm("qwen2-audio").model


@pytest.fixture(scope="module")
def hf(audio_llm):
    return audio_llm("qwen2-audio").hf


@pytest.mark.parametrize("n_mels", [N_MELS, 128])
def test_features_are_the_feature_extractors(model, n_mels):
    from transformers import WhisperFeatureExtractor

    audio = clip(0)
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


def test_instructions_and_a_base_model_without_chat_template(tmp_path):
    from specli.models.qwen2_audio.text import default_instruction

    assert default_instruction("transcribe", "en") == "Detect the language and recognize the speech: <|en|>"
    assert default_instruction("translate", None) == "Detect the language and translate the speech into English:"
    base = load_qwen2_audio(str(write_tiny_qwen2_audio(tmp_path / "base", chat=False)), "float32")
    assert base.tokenizer.template is None and base.tokenizer.eot == base.tokenizer.special.end_of_text
    job, state, _mel, _frames = window(base, clip(0, 1.0), max_new=5)
    sp = base.tokenizer.special
    assert list(job.prompt[:2]) == [sp.audio_bos, sp.audio] and job.prompt.count(sp.audio) == 25  # 100 frames: 50 after conv, 25 pooled
    assert len(greedy_decode(base.target, state, job).tokens) <= 5


def test_resume_settings_name_the_instruction_only_when_given():
    from specli.asr.pipeline import option_settings
    from specli.asr.windows import TranscribeOptions

    assert "instruction" not in option_settings(TranscribeOptions())  # Whisper outputs made before still resume
    assert option_settings(TranscribeOptions(instruction="Transcribe."))["instruction"] == "Transcribe."
