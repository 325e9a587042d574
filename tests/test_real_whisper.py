"""Real bundled weights, real speech: the lean target and its greedy decoding equal transformers'."""

from __future__ import annotations

import pytest
import torch
import transformers

from conftest import EN_CLIPS, ES_CLIPS
from specli.core.job import DecodeJob, Probe
from specli.io.audio import load_audio, window_features
from specli.core.greedy import greedy_decode
from specli.models.whisper.rules import WhisperLogitRules

# How far two correct fp32 implementations may differ. Both compute the same math in float32 but sum in
# different orders (oneDNN packed kernels vs ATen's, blocked differently per thread count and CPU ISA), so
# their logits differ by accumulated rounding only. Under the usual random-walk model a length-K dot product
# carries a relative error of about sqrt(K) * u (u = 2**-24, fp32 unit roundoff); every layer adds its own
# and they add up at most linearly through the residual stream, relative to the scale of what is summed.
# So a logit row may differ by LAYERS * sqrt(K_MAX) * u * max|logit of the row|, with K_MAX the widest
# reduction (the FFN's 4 * d_model, or cross-attention over 1500 encoder positions) and LAYERS the encoder
# plus decoder blocks: 1.9e-5 (tiny.en) and 3.2e-5 (base) of the row's largest |logit|. Measured on this
# machine: at most 3.5e-6 of it (7.3e-5 absolute, logits up to 70), the same at 1 and 2 threads. A fixed
# absolute 1e-4 had no headroom (another CPU measured exactly 1.0e-4). Decisions must agree exactly: the
# argmax of every position is compared as well.
U32 = 2.0**-24


def _logit_tolerance(target) -> float:  # noqa: ANN001 - WhisperTarget
    """Allowed max |lean - transformers| of a logit row, relative to the row's max |logit|."""
    dims = target.dims
    widest = max(4 * dims.d_model, dims.audio_ctx)
    return (dims.encoder_layers + dims.decoder_layers) * widest**0.5 * U32


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
    res = greedy_decode(target, target.start(target.encode(feats)),
                        DecodeJob(prompt, WhisperLogitRules.for_model(sp), sp.eot, 224, probe=Probe(0, sp.no_speech)))
    assert res.finished
    assert res.tokens == ref, (model.tokenizer.decode(res.tokens), model.tokenizer.decode(ref))
    assert len(ref) > 3
    # every position of the decoded sequence, scored in one pass, equals transformers' logits (fp32)
    # within accumulation-order error, at one and at two threads
    full = torch.tensor([prompt + res.tokens])
    rel = _logit_tolerance(target)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with torch.no_grad():
                hf_logits = hf(input_features=feats, decoder_input_ids=full).logits[0]  # [n, vocab]
            lean = target.score(target.start(target.encode(feats)), full).logits[0]  # [n, vocab]
            row_err = (lean - hf_logits).abs().amax(-1)  # [n]
            row_scale = hf_logits.abs().amax(-1)  # [n]
            worst = float((row_err / row_scale).max())
            assert worst <= rel, f"{threads} threads: max |diff| / max |logit| = {worst:.3g} > {rel:.3g}"
            assert torch.equal(lean.argmax(-1), hf_logits.argmax(-1)), f"{threads} threads"
    finally:
        torch.set_num_threads(before)


def test_language_detection_and_text(whisper_models):
    from specli.models.whisper.language import detect_language

    model = whisper_models("whisper-base")
    for clip, lang in ((EN_CLIPS[0], "en"), (ES_CLIPS[0], "es")):
        state = model.target.start(model.target.encode(window_features(load_audio(clip), 80)))
        probs = detect_language(model.target, state, model.special)
        assert next(iter(probs)) == lang
        assert state.cache.length == 0
        assert abs(sum(probs.values()) - 1.0) < 1e-4
