"""Real weights, real speech, over (preset x dtype): every speculative whisper preset (EAGLE head: chain, adaptive,
dynamic tree; n-gram pool: chain, recycling; a whisper-tiny.en drafter: chain, adaptive, recycling, sparse tree)
gives its AR preset's tokens, token for token, greedy, on whisper-tiny.en and whisper-base, in float32 and in int8
(weight-only; as `--dtype int8` runs it, the draft model in int8 too), and some draft token is accepted. One AR
reference per (model, dtype, clip, language) serves every preset. int8 transcripts stay close to float32's (the
quantisation is not garbage); bf16 greedy is deterministic and its own reference. A new dtype is one entry of
``DTYPES``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import pytest
import torch
from click.testing import CliRunner

from conftest import EN_CLIPS, ES_CLIPS
from specli.models.speech import DecodingOptions
from specli.asr.strategies import build_decoder, load_engine
from specli.asr.windows import TranscribeOptions, transcribe_stream
from specli.cli import main
from specli.io.audio import iter_audio_chunks
from specli.models.whisper.loader import load_whisper
from specli.presets import Preset, available_presets, load_preset

# the Whisper presets (real bundled weights); the audio-LLM presets are checked on tiny models (test_qwen2_audio*)
SPECULATIVE = [n for n in available_presets() if load_preset(n).draft.strategy != "ar" and load_preset(n).family == "whisper"]
# float32: per model (base's third, Spanish, clip only for the pool, which draws on what it has seen)
FP32_CLIPS = {"whisper-base": [EN_CLIPS[0], EN_CLIPS[4], ES_CLIPS[0]], "whisper-tiny.en": [EN_CLIPS[1], EN_CLIPS[3]]}
# int8: two bundled clips, read speech (pocketsphinx-testdata) and a telephone prompt (asterisk-core-sounds-en),
# installed by CI
REAL = [Path("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0890.wav"),
        Path("/usr/share/asterisk/sounds/en/vm-options.wav")]
INT8_CLIPS = [EN_CLIPS[0], EN_CLIPS[3], *(p for p in REAL if p.exists())]
_BY_CLIP = "by-clip"  # `_tokens`' default language: Spanish clips in Spanish on a multilingual model, else detected


@dataclass(frozen=True)
class DtypeRun:
    """How one dtype's losslessness run goes."""

    clips: Callable[[Preset], list[Path]]  # the clips a preset decodes (each round)
    language: str | None  # the transcription language (`_BY_CLIP`: from the clip, see `_tokens`)
    as_run: Callable[[Preset], Preset]  # the preset as that dtype runs it


DTYPES = {
    "float32": DtypeRun(lambda p: FP32_CLIPS[p.model] if p.draft.drafter == "pool" else FP32_CLIPS[p.model][:2], _BY_CLIP,
                        lambda p: p),
    "int8": DtypeRun(lambda p: INT8_CLIPS, "en", lambda p: replace(p, dtype="int8")),
}


def _language(model, clip: Path, language: str | None) -> str | None:
    """The transcription language of ``clip`` (``_BY_CLIP``: Spanish for the Spanish samples on a multilingual
    model, else detected)."""
    if language == _BY_CLIP:
        return "es" if "/es/" in str(clip) and model.special.multilingual else None
    return language


def _tokens(model, clip: Path, decode=None, language: str | None = _BY_CLIP):
    """(tokens per segment, decode stats) of ``clip``, greedy at every window (no temperature fallback): the outputs
    must match token for token (the AR reference: conftest's ``ar_reference``, the same call without ``decode``)."""
    language = _language(model, clip, language)
    opts = TranscribeOptions(language=language, decoding=DecodingOptions(temperatures=(0.0,)))
    res = transcribe_stream(model, iter_audio_chunks(clip), opts, **({} if decode is None else {"decode": decode}))
    return [s.tokens for s in res.segments], res.stats.decode


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", SPECULATIVE)
def test_preset_transcripts_identical_to_ar(whisper_models, ar_reference, name, dtype):
    run = DTYPES[dtype]
    preset = run.as_run(load_preset(name))
    model = whisper_models(preset.model, dtype)
    assert model.target.dtype == getattr(torch, dtype)
    decode = build_decoder(preset, model, "en")
    forwards = tokens = 0
    for _round in range(2 if preset.draft.drafter == "pool" else 1):  # a second round lets the pool draw on the first
        for clip in run.clips(preset):
            got, stats = _tokens(model, clip, decode, run.language)
            want = ar_reference(preset.model, dtype, clip, _language(model, clip, run.language))
            assert got == want, (name, dtype, clip.name)
            forwards += stats.target_forwards
            tokens += stats.tokens
    assert forwards < tokens, f"{name} ({dtype}): no draft token was ever accepted"


def test_int8_text_is_close_to_float32(ar_reference):
    """Not a WER benchmark (benchmarks/bench_int8.py is): int8 and fp32 tiny.en agree on most tokens."""
    for clip in INT8_CLIPS:
        a = [t for seg in ar_reference("whisper-tiny.en", "int8", clip, "en") for t in seg]
        b = [t for seg in ar_reference("whisper-tiny.en", "float32", clip, "en") for t in seg]
        same = sum(x == y for x, y in zip(a, b))
        assert same >= 0.8 * max(len(a), len(b)), (clip.name, same, len(a), len(b))


def test_bfloat16_greedy_is_deterministic_and_its_own_reference():
    """bf16 is a different numeric model: speculative bf16 must equal AR bf16, run after run."""
    model = load_whisper("whisper-tiny.en", "bfloat16")
    decode = build_decoder(load_preset("whisper-tiny.en-pool"), model)
    for clip in FP32_CLIPS["whisper-tiny.en"]:
        first, _ = _tokens(model, clip)
        again, _ = _tokens(model, clip)
        assert first == again
        assert _tokens(model, clip, decode)[0] == first


def test_dtype_int8_through_the_engine_and_the_cli(tmp_path):
    engine = load_engine(load_preset("whisper-base-tinyen-chain"), dtype="int8", device="cpu")
    assert engine.preset.dtype == "int8" and engine.model.target.dtype == torch.int8
    assert engine.decode.drafter.drafter.target.dtype == torch.int8  # the draft model in the asked dtype too
    args = ["transcribe", str(EN_CLIPS[2]), "--preset", "whisper-tiny.en-eagle-asr", "--dtype", "int8", "--device",
            "cpu", "-o", str(tmp_path), "--threads", "1"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    from specli.io.resume import read_sidecar, sidecar_path

    assert read_sidecar(sidecar_path(tmp_path / EN_CLIPS[2].stem)).settings["dtype"] == "int8"
    assert (tmp_path / f"{EN_CLIPS[2].stem}.txt").read_text().strip()
