"""Real bundled weights, real speech: the lean target and its greedy decoding equal transformers'."""

from __future__ import annotations

import pytest
import torch
import transformers

from conftest import EN_CLIPS, ES_CLIPS
from specli.audio import load_audio, window_features
from specli.engines.greedy import greedy_decode
from specli.engines.targets.whisper_rules import WhisperLogitRules

CASES = [
    ("whisper-tiny.en", EN_CLIPS[0], "en"),
    ("whisper-tiny.en", EN_CLIPS[2], "en"),
    ("whisper-tiny.en", EN_CLIPS[4], "en"),
    ("whisper-base", EN_CLIPS[1], "en"),
    ("whisper-base", EN_CLIPS[3], "en"),
    ("whisper-base", ES_CLIPS[1], "es"),
]

_HF: dict = {}


def _hf(model):
    if model.name not in _HF:
        _HF[model.name] = transformers.WhisperForConditionalGeneration.from_pretrained(model.path).eval()
    return _HF[model.name]


@pytest.mark.parametrize("name,clip,language", CASES, ids=lambda v: getattr(v, "name", v))
def test_greedy_equals_transformers_generate_and_logits_match(whisper_models, name, clip, language):
    model = whisper_models(name)
    hf = _hf(model)
    sp = model.special
    feats = window_features(load_audio(clip), model.target.dims.n_mels)
    kwargs = {"language": language, "task": "transcribe"} if sp.multilingual else {}
    with torch.no_grad():
        ref = hf.generate(feats, do_sample=False, num_beams=1, **kwargs)[0].tolist()
    ref = [t for t in ref if t < sp.eot]  # generated text tokens (no prompt, no eot/padding)
    prompt = sp.prompt(language)
    target = model.target
    res = greedy_decode(target, target.start(target.encode(feats)), prompt, WhisperLogitRules.for_model(sp),
                        sp.eot, 224, sp.no_speech)
    assert res.finished
    assert res.tokens == ref, (model.tokenizer.decode(res.tokens), model.tokenizer.decode(ref))
    assert len(ref) > 3
    # every position of the decoded sequence, scored in one pass, equals transformers' logits (fp32)
    full = torch.tensor([prompt + res.tokens])
    with torch.no_grad():
        hf_logits = hf(input_features=feats, decoder_input_ids=full).logits
    lean = target.score(target.start(target.encode(feats)), full).logits
    assert (lean - hf_logits).abs().max() < 1e-4


def test_language_detection_and_text(whisper_models):
    from specli.engines.language import detect_language

    model = whisper_models("whisper-base")
    for clip, lang in ((EN_CLIPS[0], "en"), (ES_CLIPS[0], "es")):
        state = model.target.start(model.target.encode(window_features(load_audio(clip), 80)))
        probs = detect_language(model.target, state, model.special)
        assert next(iter(probs)) == lang
        assert state.cache.length == 0
        assert abs(sum(probs.values()) - 1.0) < 1e-4
