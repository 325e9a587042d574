"""``specli distill data|train``: an option of the other preset family, given explicitly, is a usage error
(exit 2) naming it and the preset's family, before any work; its default, not given, is no error."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from specli.cli import main

WHISPER, SYNTHESIS = "whisper-tiny.en-ar", "cosyvoice3-ar"


def _cli(*args) -> object:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize(("preset", "flags", "named", "family"), [
    (WHISPER, ["--text", "hello", "--model", "cosyvoice3"], ["--text", "--model"], "Whisper"),
    (WHISPER, ["--seed", "0"], ["--seed"], "Whisper"),  # explicit, even at its default value
    (WHISPER, ["--sampler", "greedy", "--aux-layers", "1,2", "--per-shard", "4"],
     ["--sampler", "--aux-layers", "--per-shard"], "Whisper"),
    (SYNTHESIS, ["--no-timestamps", "--batch-size", "2"], ["--no-timestamps", "--batch-size"], "synthesis"),
    (SYNTHESIS, ["--task", "translate", "--language", "es", "--dtype", "float32"],
     ["--task", "--language", "--dtype"], "synthesis"),
])
def test_data_refuses_the_other_familys_flags(tmp_path, preset, flags, named, family):
    out = tmp_path / "out"
    res = _cli("distill", "data", tmp_path / "missing-input", "--preset", preset, *flags, "--out", out)
    assert res.exit_code == 2, res.output
    assert ", ".join(named) in res.stderr and f"is a {family} preset" in res.stderr and preset in res.stderr
    assert not out.exists()  # before any work


@pytest.mark.parametrize(("preset", "flags", "named", "family"), [
    (WHISPER, ["--drafter", "eagle3", "--markov-rank", "8"], ["--drafter", "--markov-rank"], "Whisper"),
    (WHISPER, ["--model", "cosyvoice3", "--layers", "1", "--block", "4", "--anchors", "8"],
     ["--model", "--layers", "--block", "--anchors"], "Whisper"),
    (SYNTHESIS, ["--feature-noise", "0.1", "--dropout", "0.2"], ["--feature-noise", "--dropout"], "synthesis"),
    (SYNTHESIS, ["--precision", "bfloat16", "--init", "whisper-tiny.en-eagle", "--val-windows", "4", "--dtype",
                 "float32"], ["--val-windows", "--dtype", "--precision", "--init"], "synthesis"),
])
def test_train_refuses_the_other_familys_flags(tmp_path, preset, flags, named, family):
    out = tmp_path / "head"
    res = _cli("distill", "train", tmp_path, "--preset", preset, *flags, "--out", out)
    assert res.exit_code == 2, res.output
    assert ", ".join(named) in res.stderr and f"is a {family} preset" in res.stderr and preset in res.stderr
    assert not out.exists()


@pytest.mark.parametrize("preset", [WHISPER, SYNTHESIS])
def test_shared_flags_and_defaults_are_no_error(tmp_path, preset):
    """Only explicit flags count: with none of the other family's, the command gets to its own work (here
    it fails on the empty data directory, not on a flag)."""
    res = _cli("distill", "train", tmp_path, "--preset", preset, "--steps", "1", "--batch", "2", "--epochs", "1",
               "--draft-vocab", "16", "--checkpoint-every", "5", "--out", tmp_path / "head")
    assert "only for" not in res.stderr
    assert res.exit_code != 0 and ("no distillation shards" in res.stderr or "not speech distillation data"
                                   in res.stderr)


def test_help_says_which_flags_belong_to_which_family():
    for command in ("data", "train"):
        text = _cli("distill", command, "--help").output
        assert "Whisper presets only:" in text and "Synthesis presets only:" in text
    assert "Whisper presets: matmul precision" in " ".join(_cli("distill", "train", "--help").output.split())


def test_eval_is_for_whisper_presets(tmp_path: Path):
    res = _cli("distill", "eval", tmp_path, "--preset", SYNTHESIS)
    assert res.exit_code == 2 and "Whisper presets" in res.stderr
