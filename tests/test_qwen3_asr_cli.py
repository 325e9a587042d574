"""`specli transcribe --model <tiny Qwen3-ASR dir>` end to end through Click's runner: every writer, a
> 30 s file in two 30-s windows (one segment each), resume, batch sizes, the pool preset (lossless: the same
tokens as plain decoding), the language detected by the model itself, names under $SPECLI_MODELS_DIR, missing
files (exit 3), translate refused (exit 2)."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner

from conftest import EN_CLIPS, SAMPLES
from qwen2_audio_fixtures import long_clip
from qwen3_asr_fixtures import write_tiny_qwen3_asr
from specli.cli import main

# random weights: no fallback re-decodes; float32: batch rows equal batch-1 rows (bf16 near-ties may flip)
FAST = ("--temperature-increment-on-fallback", "0", "--language", "en", "--dtype", "float32")
SUMMARY = re.compile(r"files: (\d+) ok, (\d+) failed, (\d+) skipped")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    # seed 3: random weights that write visible text in both windows of the 40-s file (others may write only
    # blanks or control bytes in one, and blank segments are dropped)
    return write_tiny_qwen3_asr(tmp_path_factory.mktemp("qwen3-asr-cli") / "tiny", seed=3)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """samples/en and a 40-s file made of its clips."""
    root = tmp_path_factory.mktemp("qwen3-asr-inputs")
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
    for ext in ("txt", "json", "srt", "vtt", "tsv"):
        assert (tmp_path / f"long.{ext}").is_file()
    rec = json.loads((tmp_path / "long.json").read_text())
    assert rec["duration"] > 30.0 and rec["stats"]["windows"] == 2
    segs = rec["segments"]
    assert [(s["start"], s["end"]) for s in segs] == [(0.0, 30.0), (30.0, pytest.approx(rec["duration"], abs=0.01))]
    assert all(s["tokens"] and max(s["tokens"]) < 264 for s in segs)
    assert "00:00:00,000 --> 00:00:30,000" in (tmp_path / "long.srt").read_text()


def test_resume_batch_sizes_and_the_pool_preset_agree(tiny_dir, inputs, tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert run("transcribe", "--model", tiny_dir, inputs, "-f", "json", "-o", a, "--batch-size", "1",
               *FAST).exit_code == 0
    again = run("transcribe", "--model", tiny_dir, inputs, "-f", "json", "-o", a, "--batch-size", "1", *FAST)
    assert SUMMARY.search(again.output).groups() == ("0", "0", "6")  # resumed: nothing to redo
    assert run("transcribe", "--model", tiny_dir, inputs, "-f", "json", "-o", b, "--batch-size", "3",
               *FAST).exit_code == 0
    res = run("transcribe", "--preset", "qwen3-asr-pool", "--model", tiny_dir, inputs, "-f", "json", "-o", c,
              "--batch-size", "2", *FAST)
    assert res.exit_code == 0, res.output
    assert _tokens(a) == _tokens(b) == _tokens(c)


def test_srt_and_no_loading_bar(tiny_dir, inputs, tmp_path, capfd):
    res = run("transcribe", "--model", tiny_dir, inputs / "long.wav", "-f", "srt", "-o", tmp_path, "--threads", "1",
              *FAST)
    assert res.exit_code == 0, res.output
    srt = (tmp_path / "long.srt").read_text()
    assert srt.startswith("1\n00:00:00,000 --> 00:00:30,000\n") and "\n2\n00:00:30,000 --> " in srt
    assert "Loading weights" not in res.output + capfd.readouterr().err  # library code shows nothing


def test_names_under_models_dir_and_missing_files(tiny_dir, inputs, tmp_path, monkeypatch):
    shutil.copytree(tiny_dir, tmp_path / "models" / "my-asr")
    clip = inputs / "queue-youarenext.wav"
    monkeypatch.setenv("SPECLI_MODELS_DIR", str(tmp_path / "models"))  # read when a name is resolved
    res = run("transcribe", "--model", "my-asr", clip, "-f", "json", "-o", tmp_path / "named", "--threads", "1", *FAST)
    assert res.exit_code == 0, res.output
    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    (broken / "tokenizer.json").unlink()
    res = run("transcribe", "--model", broken, clip, "-o", tmp_path, *FAST)
    assert res.exit_code == 3 and "tokenizer.json" in res.output
    res = run("transcribe", "--preset", "qwen3-asr-ar", clip, "-o", tmp_path, "--model", "qwen3-asr-nowhere")
    assert res.exit_code == 3 and "never downloads" in res.output


def test_translate_is_refused_context_redoes_and_the_model_may_name_the_language(tiny_dir, inputs, tmp_path):
    clip = inputs / "queue-youarenext.wav"
    own = run("transcribe", "--model", tiny_dir, clip, "-f", "json", "-o", tmp_path / "own",
              "--temperature-increment-on-fallback", "0")  # no prefill: the model writes language <Name><asr_text>
    assert own.exit_code == 0, own.output
    res = run("translate", "--model", tiny_dir, clip, "-o", tmp_path, *FAST)
    assert res.exit_code == 2 and "only transcribes" in res.output
    assert run("transcribe", "--model", tiny_dir, clip, "-o", tmp_path, *FAST).exit_code == 0
    res = run("transcribe", "--model", tiny_dir, clip, "-o", tmp_path, "--instruction", "Names: Elinor.", *FAST)
    assert res.exit_code == 0 and "redoing" in res.output
