"""Real weights, real speech, int8 (weight-only) targets: every speculative whisper preset (EAGLE head, n-gram pool,
whisper-tiny.en drafter; chains and trees) gives int8 AR's tokens, token for token, greedy, on whisper-tiny.en and
whisper-base; int8 transcripts stay close to float32's (the quantisation is not garbage)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conftest import EN_CLIPS
from click.testing import CliRunner

from specli.asr.fallback import DecodingOptions
from specli.asr.strategies import build_decoder, load_engine
from specli.asr.windows import TranscribeOptions, transcribe_stream
from specli.cli import main
from specli.io.audio import iter_audio_chunks
from specli.models.whisper.loader import load_whisper
from specli.presets import available_presets, load_preset

# read speech (pocketsphinx-testdata) and a telephone prompt (asterisk-core-sounds-en), installed by CI
REAL = [Path("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0890.wav"),
        Path("/usr/share/asterisk/sounds/en/vm-options.wav")]
CLIPS = [EN_CLIPS[0], EN_CLIPS[3], *(p for p in REAL if p.exists())]
# every speculative whisper preset: EAGLE (chain, adaptive, dynamic tree), n-gram pool (chain, recycling), a
# whisper-tiny.en drafter (chain, adaptive, recycling, sparse tree); each drafts for an int8 target
PRESETS = [n for n in available_presets() if load_preset(n).family == "whisper" and load_preset(n).strategy != "ar"]
_MODELS: dict = {}
_AR: dict = {}


def _model(name: str):
    if name not in _MODELS:
        _MODELS[name] = load_whisper(name, "int8")
    return _MODELS[name]


def _tokens(model, clip: Path, decode=None) -> tuple[list[list[int]], object]:
    opts = TranscribeOptions(language="en", decoding=DecodingOptions(temperatures=(0.0,)))
    res = transcribe_stream(model, iter_audio_chunks(clip), opts, **({} if decode is None else {"decode": decode}))
    return [s.tokens for s in res.segments], res.stats.decode


@pytest.mark.parametrize("name", PRESETS)
def test_int8_speculative_equals_int8_ar(name):
    preset = replace(load_preset(name), dtype="int8")  # as `--dtype int8` runs it: a draft model in int8 too
    model = _model(preset.model)
    assert model.target.dtype == torch.int8
    decode = build_decoder(preset, model, "en")
    forwards = tokens = 0
    for _round in range(2 if preset.drafter == "pool" else 1):  # a second round lets the pool draw on the first
        for clip in CLIPS:
            key = (preset.model, clip)
            if key not in _AR:
                _AR[key] = _tokens(model, clip)[0]
            got, stats = _tokens(model, clip, decode)
            assert got == _AR[key], (name, clip.name)
            forwards += stats.target_forwards
            tokens += stats.tokens
    assert forwards < tokens, f"{name}: no draft token was ever accepted"


def test_int8_text_is_close_to_float32(whisper_models):
    """Not a WER benchmark (benchmarks/bench_int8.py is): int8 and fp32 tiny.en agree on most tokens."""
    int8, fp32 = _model("whisper-tiny.en"), whisper_models("whisper-tiny.en")
    for clip in CLIPS:
        a = [t for seg in _tokens(int8, clip)[0] for t in seg]
        b = [t for seg in _tokens(fp32, clip)[0] for t in seg]
        same = sum(x == y for x, y in zip(a, b))
        assert same >= 0.8 * max(len(a), len(b)), (clip.name, same, len(a), len(b))


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
