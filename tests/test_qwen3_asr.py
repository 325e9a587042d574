"""Qwen3-ASR's quirks (test_audio_llm_contract runs the family contract: transformers' generate and logits,
speculative == greedy at batch 1 and in ragged batches, the first-token law, missing files): a tiny random
``Qwen3ASRForConditionalGeneration`` saved as a local HF directory loads its Qwen3 blocks (explicit head_dim, q/k
norms, tied head); prompts and features are exactly ``Qwen3ASRProcessor.apply_transcription_request``'s; batched
encoding equals each window alone; text drops the model's language prefix; a checkpoint without a chat template
is named."""

from __future__ import annotations

import pytest
import torch

from audio_llm_families import clip, window
from qwen3_asr_fixtures import CHAT_TEMPLATE
from specli.errors import ModelLoadError, UsageError
from specli.models.aut import audio_positions
from specli.models.qwen3_asr.loader import load_qwen3_asr


@pytest.fixture(scope="module")
def model(audio_llm):
    return audio_llm("qwen3-asr").model


@pytest.fixture(scope="module")
def hf(audio_llm):
    return audio_llm("qwen3-asr").hf


@pytest.fixture(scope="module")
def processor(audio_llm):
    from transformers import AutoTokenizer, Qwen3ASRFeatureExtractor, Qwen3ASRProcessor

    tiny_dir = audio_llm("qwen3-asr").dir
    return Qwen3ASRProcessor(feature_extractor=Qwen3ASRFeatureExtractor.from_pretrained(str(tiny_dir)),
                             tokenizer=AutoTokenizer.from_pretrained(str(tiny_dir)), chat_template=CHAT_TEMPLATE)


@pytest.mark.parametrize(("clip_index", "seconds", "language", "context"),
                         [(0, None, "en", None), (1, 3.3, None, None), (2, 0.3, "English", "Names: Elinor, Marianne."),
                          (4, 30.0, "fr", None)])
def test_prompt_and_features_are_the_processors(model, processor, clip_index, seconds, language, context):
    audio = clip(clip_index, seconds)
    job, _state, mel, frames = window(model, audio, language=language, context=context)
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
    mels, frames = zip(*(model.speech_hooks().features(clip(i, s)) for i, s in ((0, None), (1, 2.05), (3, 30.0))))
    together = model.target.encode(torch.cat(mels), list(frames))
    for row, (mel, f) in enumerate(zip(mels, frames)):
        alone = model.target.encode(mel, [f])
        n = audio_positions(f)
        torch.testing.assert_close(together[row, :n], alone[0, :n], atol=1e-5, rtol=1e-5)


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


def test_a_checkpoint_without_a_chat_template_is_named(audio_llm, tmp_path):
    import shutil

    (tmp_path / "nochat").mkdir()
    shutil.copytree(audio_llm("qwen3-asr").dir, tmp_path / "nochat" / "m")
    (tmp_path / "nochat" / "m" / "chat_template.jinja").unlink()
    with pytest.raises(ModelLoadError, match="no chat template"):
        load_qwen3_asr(str(tmp_path / "nochat" / "m"), "float32")
