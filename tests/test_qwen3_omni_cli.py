"""`specli transcribe|translate --model <tiny Qwen3-Omni dir>` end to end: every writer, a > 30 s file in two
30-s windows, batch sizes and the pool preset (lossless: the same tokens as plain decoding), translate, srt,
missing files (exit 3)."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner

from conftest import EN_CLIPS, SAMPLES
from qwen2_audio_fixtures import long_clip
from qwen3_omni_fixtures import write_tiny_qwen3_omni
from specli.cli import main

FAST = ("--temperature-increment-on-fallback", "0", "--language", "en", "--dtype", "float32")
SUMMARY = re.compile(r"files: (\d+) ok, (\d+) failed, (\d+) skipped")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    # seed 3: random weights that write visible text in both windows of the 40-s file (blank segments are dropped)
    return write_tiny_qwen3_omni(tmp_path_factory.mktemp("qwen3-omni-cli") / "tiny", seed=3)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3-omni-inputs")
    shutil.copytree(SAMPLES / "en", root / "en")
    long_clip(EN_CLIPS, root / "en" / "long.wav", seconds=40.0)
    return root / "en"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _tokens(out_dir) -> dict[str, list]:
    return {p.stem: [s["tokens"] for s in json.loads(p.read_text())["segments"]] for p in out_dir.glob("*.json")}


def test_transcribe_all_formats_and_a_long_file(tiny_dir, inputs, tmp_path):
    res = run("transcribe", "--model", tiny_dir, inputs, "-f", "all", "-o", tmp_path, *FAST)
    assert res.exit_code == 0, res.output
    assert SUMMARY.search(res.output).groups() == ("6", "0", "0")
    rec = json.loads((tmp_path / "long.json").read_text())
    assert rec["duration"] > 30.0 and rec["stats"]["windows"] == 2
    assert [(s["start"], s["end"]) for s in rec["segments"]] == [
        (0.0, 30.0), (30.0, pytest.approx(rec["duration"], abs=0.01))]
    for ext in ("txt", "srt", "vtt", "tsv"):
        assert (tmp_path / f"long.{ext}").is_file()


def test_batch_sizes_and_the_pool_preset_agree(tiny_dir, inputs, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert run("transcribe", "--model", tiny_dir, inputs, "-f", "json", "-o", a, "--batch-size", "1",
               *FAST).exit_code == 0
    res = run("transcribe", "--preset", "qwen3-omni-pool", "--model", tiny_dir, inputs, "-f", "json", "-o", b,
              "--batch-size", "3", *FAST)
    assert res.exit_code == 0, res.output
    assert _tokens(a) == _tokens(b)


def test_srt_translate_and_missing_files(tiny_dir, inputs, tmp_path):
    res = run("transcribe", "--model", tiny_dir, inputs / "long.wav", "-f", "srt", "-o", tmp_path, "--threads", "1",
              *FAST)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "long.srt").read_text().startswith("1\n00:00:00,000 --> 00:00:30,000\n")
    clip = inputs / "queue-youarenext.wav"
    res = run("translate", "--model", tiny_dir, clip, "-o", tmp_path / "tr", *FAST)
    assert res.exit_code == 0, res.output
    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    (broken / "tokenizer.json").unlink()
    res = run("transcribe", "--model", broken, clip, "-o", tmp_path, *FAST)
    assert res.exit_code == 3 and "tokenizer.json" in res.output
