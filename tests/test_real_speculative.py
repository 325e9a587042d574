"""Real weights, real speech: every speculative preset's transcript is identical to its AR preset's."""

from __future__ import annotations

import pytest

from conftest import EN_CLIPS, ES_CLIPS
from specli.io.audio import iter_audio_chunks
from specli.asr.fallback import DecodingOptions
from specli.asr.strategies import build_decoder
from specli.asr.windows import TranscribeOptions, transcribe_stream
from specli.presets import available_presets, load_preset

# the Whisper presets (real bundled weights); qwen2-audio presets are checked on a tiny model (test_qwen2_audio*)
SPECULATIVE = [n for n in available_presets() if load_preset(n).strategy != "ar" and load_preset(n).family == "whisper"]
CLIPS = {"whisper-base": [EN_CLIPS[0], EN_CLIPS[4], ES_CLIPS[0]], "whisper-tiny.en": [EN_CLIPS[1], EN_CLIPS[3]]}
_REF: dict = {}


def _tokens(model, clip, decode=None):
    # greedy at every window (no temperature fallback): the outputs must match token for token
    opts = TranscribeOptions(language="es" if "/es/" in str(clip) and model.special.multilingual else None,
                             decoding=DecodingOptions(temperatures=(0.0,)))
    kwargs = {} if decode is None else {"decode": decode}
    res = transcribe_stream(model, iter_audio_chunks(clip), opts, **kwargs)
    return [s.tokens for s in res.segments], res.stats.decode


@pytest.mark.parametrize("name", SPECULATIVE)
def test_preset_transcripts_identical_to_ar(whisper_models, name):
    preset = load_preset(name)
    model = whisper_models(preset.model)
    decode = build_decoder(preset, model, "en")
    forwards = tokens = 0
    rounds = 2 if preset.drafter == "pool" else 1  # a second round lets the pool draw on the first
    clips = CLIPS[preset.model] if preset.drafter == "pool" else CLIPS[preset.model][:2]
    for _round in range(rounds):
        for clip in clips:
            key = (preset.model, clip)
            if key not in _REF:
                _REF[key] = _tokens(model, clip)[0]
            got, stats = _tokens(model, clip, decode)
            assert got == _REF[key], (name, clip.name)
            forwards += stats.target_forwards
            tokens += stats.tokens
    assert forwards < tokens, f"{name}: no draft token was ever accepted"


def test_bfloat16_greedy_is_deterministic_and_its_own_reference():
    """bf16 is a different numeric model: speculative bf16 must equal AR bf16, run after run."""
    from specli.models.whisper.loader import load_whisper

    model = load_whisper("whisper-tiny.en", "bfloat16")
    decode = build_decoder(load_preset("whisper-tiny.en-pool"), model)
    for clip in CLIPS["whisper-tiny.en"]:
        first, _ = _tokens(model, clip)
        again, _ = _tokens(model, clip)
        assert first == again
        assert _tokens(model, clip, decode)[0] == first
