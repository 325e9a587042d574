"""A new speech family is one package plus one registry entry: the test-only ``toy_asr`` family (tests/toy_asr)
transcribes through ``specli transcribe`` (Click runner, in-process) with no change anywhere in ``specli/``."""

from __future__ import annotations

import json
import wave

import pytest
import torch
from click.testing import CliRunner

from conftest import EN_CLIPS
from speech_toy import EOS, SOS
from specli.cli import main
from specli.io.audio import load_audio
from specli.models.registry import FAMILIES, Family
from toy_asr import MAX_NEW, load_toy_asr

ENTRY = Family("toy-asr", "transcribe", "specli.presets.audio_llm:AudioLLMPreset", "toy_asr:load_toy_asr")


@pytest.fixture
def toy_family(monkeypatch):
    monkeypatch.setitem(FAMILIES, ENTRY.name, ENTRY)


def _expected(model, path) -> str:
    """The clip's text by hand: the family's features and encoder pick the table, then greedy from sos."""
    hooks, audio = model.speech_hooks(), load_audio(path)
    mel, frames = hooks.features(audio)
    decoder = model.target.decoders[int(float(model.target.encode(mel, [frames])) > -0.5)]
    tokens = [SOS]
    while len(tokens) <= MAX_NEW and (tokens[-1] != EOS or len(tokens) == 1):
        tokens.append(int(decoder.next_logits(tokens).argmax()))
    return model.tokenizer.decode([t for t in tokens[1:] if t != EOS])


def test_a_family_in_one_package_transcribes_through_the_cli(toy_family, tmp_path):
    preset = tmp_path / "toy.toml"
    preset.write_text('family = "toy-asr"\nmodel = "toy-3"\nstrategy = "ar"\ndrafter = "none"\ndtype = "float32"\n')
    silence = tmp_path / "silence.wav"  # a quiet window: the other table
    with wave.open(str(silence), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000), w.writeframes(bytes(2 * 32000))
    clips = [*EN_CLIPS[:2], silence]
    res = CliRunner().invoke(main, ["transcribe", "--preset", str(preset), *map(str, clips), "-f", "json",
                                    "-o", str(tmp_path / "out"), "--temperature-increment-on-fallback", "0"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    model = load_toy_asr("toy-3")
    with torch.no_grad():
        want = {c.stem: _expected(model, c) for c in clips}
    got = {c.stem: json.loads((tmp_path / "out" / f"{c.stem}.json").read_text())["text"] for c in clips}
    assert got == want and len(set(want.values())) == 2  # both tables, picked by the audio


def test_the_family_refuses_what_it_cannot_do(toy_family, tmp_path):
    preset = tmp_path / "toy.toml"
    preset.write_text('family = "toy-asr"\nmodel = "toy-3"\nstrategy = "ar"\ndrafter = "none"\n')
    res = CliRunner().invoke(main, ["translate", "--preset", str(preset), str(EN_CLIPS[0]),
                                    "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and "cannot translate" in res.output
