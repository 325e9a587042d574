"""`specli transcribe --model <tiny Qwen2-Audio dir>` end to end: Click runner (a subprocess where the HF cache
is read from the environment at import), every writer,
a > 30 s file in two 30-s windows (one segment each, carrying its token ids), resume, batch sizes, the pool
preset (lossless: the same text as plain decoding), missing files (exit 3)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from conftest import EN_CLIPS, SAMPLES
from qwen2_audio_fixtures import long_clip, write_tiny_qwen2_audio
from specli.cli import main

REPO = SAMPLES.parent
# random weights: no fallback re-decodes; float32: batch rows equal batch-1 rows (bf16 near-ties may flip)
FAST = ("--temperature-increment-on-fallback", "0", "--language", "en", "--dtype", "float32")
SUMMARY = re.compile(r"files: (\d+) ok, (\d+) failed, (\d+) skipped")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_qwen2_audio(tmp_path_factory.mktemp("qwen2-audio-cli") / "tiny")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """samples/en and a 40-s file made of its clips."""
    root = tmp_path_factory.mktemp("qwen2-audio-inputs")
    shutil.copytree(SAMPLES / "en", root / "en")
    long_clip(EN_CLIPS, root / "en" / "long.wav", seconds=40.0)
    return root / "en"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _records(out_dir) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in out_dir.glob("*.json")}


def test_transcribe_all_formats_and_a_long_file(tiny_dir, inputs, tmp_path):
    res = run("transcribe", "--model", tiny_dir, inputs, "-f", "all", "-o", tmp_path, *FAST)
    assert res.exit_code == 0, res.output
    assert SUMMARY.search(res.output).groups() == ("6", "0", "0")
    for ext in ("txt", "json", "srt", "vtt", "tsv"):
        assert (tmp_path / f"long.{ext}").is_file()
    rec = _records(tmp_path)["long"]
    assert rec["duration"] > 30.0 and rec["stats"]["windows"] == 2
    segs = rec["segments"]
    assert [(s["start"], s["end"]) for s in segs] == [(0.0, 30.0), (30.0, pytest.approx(rec["duration"], abs=0.01))]
    assert all(s["tokens"] and max(s["tokens"]) < 264 for s in segs)
    srt = (tmp_path / "long.srt").read_text()
    assert "00:00:00,000 --> 00:00:30,000" in srt and "00:00:30,000 --> 00:00:4" in srt
    short = _records(tmp_path)["queue-youarenext"]
    assert len(short["segments"]) == 1 and short["segments"][0]["start"] == 0.0


def test_resume_batch_sizes_and_the_pool_preset_agree(tiny_dir, inputs, tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert run("transcribe", "--model", tiny_dir, inputs, "-f", "json", "-o", a, "--batch-size", "1",
               *FAST).exit_code == 0
    again = run("transcribe", "--model", tiny_dir, inputs, "-f", "json", "-o", a, "--batch-size", "1", *FAST)
    assert SUMMARY.search(again.output).groups() == ("0", "0", "6")  # resumed: nothing to redo
    assert run("transcribe", "--model", tiny_dir, inputs, "-f", "json", "-o", b, "--batch-size", "3",
               *FAST).exit_code == 0
    res = run("transcribe", "--preset", "qwen2-audio-pool", "--model", tiny_dir, inputs, "-f", "json", "-o", c,
              "--batch-size", "2", *FAST)
    assert res.exit_code == 0, res.output
    ra, rb, rc = _records(a), _records(b), _records(c)
    tokens = {k: [s["tokens"] for s in r["segments"]] for k, r in ra.items()}
    assert tokens == {k: [s["tokens"] for s in r["segments"]] for k, r in rb.items()}
    assert tokens == {k: [s["tokens"] for s in r["segments"]] for k, r in rc.items()}


def test_instruction_changes_the_prompt_and_redoes(tiny_dir, inputs, tmp_path):
    clip = inputs / "queue-youarenext.wav"
    assert run("transcribe", "--model", tiny_dir, clip, "-o", tmp_path, *FAST).exit_code == 0
    res = run("transcribe", "--model", tiny_dir, clip, "-o", tmp_path, "--instruction", "Transcribe this.", *FAST)
    assert res.exit_code == 0 and "redoing" in res.output
    whisper = run("transcribe", "--preset", "whisper-tiny.en-ar", clip, "-o", tmp_path / "w", "--instruction", "x")
    assert whisper.exit_code == 2 and "instruction" in whisper.output


def test_srt_and_no_loading_bar(tiny_dir, inputs, tmp_path, capfd):
    res = run("transcribe", "--model", tiny_dir, inputs / "long.wav", "-f", "srt", "-o", tmp_path, "--threads", "1",
              *FAST)
    assert res.exit_code == 0, res.output
    srt = (tmp_path / "long.srt").read_text()
    assert srt.startswith("1\n00:00:00,000 --> 00:00:30,000\n") and "\n2\n00:00:30,000 --> " in srt
    assert "Loading weights" not in res.output + capfd.readouterr().err  # library code shows nothing


def test_missing_files_exit_3(tiny_dir, inputs, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    (broken / "tokenizer.json").unlink()
    res = run("transcribe", "--model", broken, inputs / "queue-youarenext.wav", "-o", tmp_path, *FAST)
    assert res.exit_code == 3 and "tokenizer.json" in res.output
    res = run("transcribe", "--preset", "qwen2-audio-ar", inputs / "queue-youarenext.wav", "-o", tmp_path,
              "--model", "qwen2-audio-nowhere")
    assert res.exit_code == 3 and "never downloads" in res.output


def test_names_resolve_offline_from_the_hf_cache_and_models_dir(tiny_dir, inputs, tmp_path):
    """`--preset qwen2-audio-ar` (model "qwen2-audio") from a Hugging Face cache snapshot, and
    `--model NAME` under $SPECLI_MODELS_DIR (claimed by the family, so its default preset runs)."""
    repo = tmp_path / "hub" / "models--Qwen--Qwen2-Audio-7B-Instruct"
    shutil.copytree(tiny_dir, repo / "snapshots" / "0123abc")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    shutil.copytree(tiny_dir, tmp_path / "models" / "my-qwen")
    clip = inputs / "queue-youarenext.wav"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1",
           "SPECLI_MODELS_DIR": str(tmp_path / "models")}
    for args, out in ((["--preset", "qwen2-audio-ar"], "hub-out"), (["--model", "my-qwen"], "dir-out")):
        proc = subprocess.run([sys.executable, "-m", "specli", "transcribe", *args, str(clip), "-f", "json",
                               "-o", str(tmp_path / out), "--threads", "1", *FAST],
                              cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr
        assert "Loading weights" not in proc.stderr  # a fresh process: library code shows nothing
    hub, named = (json.loads((tmp_path / d / "queue-youarenext.json").read_text()) for d in ("hub-out", "dir-out"))
    assert hub["segments"][0]["tokens"] == named["segments"][0]["tokens"]


def test_translate_beam_and_sampling_run(tiny_dir, inputs, tmp_path):
    clip = inputs / "queue-youarenext.wav"
    for args in (["translate"], ["transcribe", "--beam-size", "2"], ["transcribe", "--temperature", "0.5"]):
        res = run(*args, "--model", tiny_dir, clip, "-o", tmp_path / args[-1], *FAST)
        assert res.exit_code == 0, res.output
    res = run("transcribe", "--model", tiny_dir, clip, "-o", tmp_path, "--word-timestamps", *FAST)
    assert res.exit_code == 2 and "word timestamps" in res.output
