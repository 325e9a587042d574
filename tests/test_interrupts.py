"""Ctrl-C in ``synthesize``, ``bench`` and ``distill``: what finished is printed, nothing partial is left, exit 130.

A Ctrl-C is a ``KeyboardInterrupt`` raised in the main thread wherever the program is: here it is raised from
inside the real run (the Nth call of a real step), after earlier outputs were written.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import EN_CLIPS
from cosyvoice_fixtures import write_checkpoint

from specli.cli import main


@pytest.fixture(scope="module")
def cv3(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("cv3") / "ckpt", "cosyvoice3", seed=4)


def _interrupt_on_call(monkeypatch, owner, name: str, n: int) -> None:
    """Make the ``n``-th call of ``owner.name`` raise KeyboardInterrupt (the earlier ones run for real)."""
    real = getattr(owner, name)
    calls = {"n": 0}

    def wrapped(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)


def _invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def _no_partial_files(out: Path) -> None:
    assert not [p for p in out.rglob("*") if p.name.startswith(".") and p.name.endswith((".part", ".tmp"))]


def test_synthesize_ctrl_c_reports_what_finished(tmp_path, cv3, monkeypatch):
    from specli.tts.synthesis import Synthesizer

    lines = tmp_path / "lines.txt"
    lines.write_text("one two\nthree four\nfive six\n")
    _interrupt_on_call(monkeypatch, Synthesizer, "synthesize", 2)
    out = tmp_path / "out"
    res = _invoke(["synthesize", str(lines), "--format", "npy", "--model", str(cv3), "-o", str(out), "--sampler", "greedy"])
    assert res.exit_code == 130, res.stderr
    assert "interrupted: utterances: 1 ok, 0 failed, 0 skipped" in res.stderr and "rerun resumes" in res.stderr
    assert sorted(p.name for p in out.glob("*.npy")) == ["lines_00001.npy"]
    _no_partial_files(out)
    res = _invoke(["synthesize", str(lines), "--format", "npy", "--model", str(cv3), "-o", str(out), "--sampler", "greedy"])
    assert res.exit_code == 0 and "2 ok, 0 failed, 1 skipped" in res.stderr  # the rerun resumes


def test_synthesize_sigterm_is_handled_as_ctrl_c(tmp_path, cv3, monkeypatch):
    """A real SIGTERM to this process in the second utterance: the summary prints, exit 143, the rerun resumes."""
    from specli.tts.synthesis import Synthesizer

    lines = tmp_path / "lines.txt"
    lines.write_text("one two\nthree four\nfive six\n")
    real, calls = Synthesizer.synthesize, []

    def terminated_in_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode, inside this call
        return real(*args, **kwargs)

    def unhandled(*_a):  # the default action would end the test run itself
        raise AssertionError("SIGTERM reached the test's own handler: the command did not handle it")

    monkeypatch.setattr(Synthesizer, "synthesize", terminated_in_the_second)
    previous = signal.signal(signal.SIGTERM, unhandled)
    out = tmp_path / "out"
    args = ["synthesize", str(lines), "--format", "npy", "--model", str(cv3), "-o", str(out), "--sampler", "greedy"]
    try:
        res = _invoke(args)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert res.exit_code == 143, res.stderr
    assert "interrupted: utterances: 1 ok, 0 failed, 0 skipped" in res.stderr and "rerun resumes" in res.stderr
    assert sorted(p.name for p in out.glob("*.npy")) == ["lines_00001.npy"]
    _no_partial_files(out)
    monkeypatch.undo()
    res = _invoke(args)
    assert res.exit_code == 0 and "2 ok, 0 failed, 1 skipped" in res.stderr  # the rerun resumes


def test_distill_data_and_train_ctrl_c_name_what_a_rerun_resumes(tmp_path, cv3, monkeypatch):
    import specli.distill.loop as loop
    import specli.distill.speech_data as speech_data

    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(["a b c", "d e f", "g h i", "j k l"]) + "\n")
    data = ["distill", "data", str(texts), "--preset", "cosyvoice3-ar", "--model", str(cv3), "--out",
            str(tmp_path / "d"), "--per-shard", "1", "--sampler", "greedy", "-q"]
    with monkeypatch.context() as m:
        _interrupt_on_call(m, speech_data, "decode_request", 3)
        res = _invoke(data)
    assert res.exit_code == 130, res.stderr
    assert f"interrupted: 2 shard(s) written to {tmp_path / 'd'}; the same command resumes" in res.stderr
    assert json.loads((tmp_path / "d" / "manifest.json").read_text())["next_shard"] == 2
    res = _invoke(data)
    assert res.exit_code == 0 and "2 already done" in res.stderr

    train = ["distill", "train", str(tmp_path / "d"), "--preset", "cosyvoice3-ar", "--model", str(cv3),
             "--drafter", "dspark", "--steps", "4", "--anchors", "4", "--markov-rank", "8", "--draft-vocab", "256",
             "--checkpoint-every", "1", "--batch", "1", "--out", str(tmp_path / "drafter"), "-q"]
    with monkeypatch.context() as m:
        _interrupt_on_call(m, loop, "write_checkpoint", 3)  # the third checkpoint a drafter's training writes
        res = _invoke(train)
    assert res.exit_code == 130, res.stderr
    assert f"checkpoints so far are in {tmp_path / 'drafter' / 'checkpoints'}" in res.stderr
    assert list((tmp_path / "drafter" / "checkpoints").iterdir())
    _no_partial_files(tmp_path / "drafter")


@pytest.mark.slow
def test_bench_ctrl_c_keeps_the_measured_runs(tmp_path, monkeypatch):
    from specli.bench.runlog import RunLog

    _interrupt_on_call(monkeypatch, RunLog, "add", 2)  # the first measured run is on disk, then Ctrl-C
    out = tmp_path / "bench"
    res = _invoke(["bench", str(EN_CLIPS[2]), "--presets", "whisper-tiny.en-ar", "--repeat", "2", "--no-warmup",
                   "--threads", "1", "--dtype", "float32", "--out", str(out), "-q"])
    runs = out / "runs.jsonl"
    assert res.exit_code == 130, res.stderr
    assert f"interrupted: 1 measured run(s) kept in {runs}; `specli bench --from-runs {runs}`" in res.stderr
    rebuilt = _invoke(["bench", "--from-runs", str(runs), "--out", str(tmp_path / "rebuilt"), "--no-plots"])
    assert rebuilt.exit_code == 0, rebuilt.stderr
    assert json.loads((tmp_path / "rebuilt" / "report.json").read_text())["summaries"][0]["utterances"] == 1


def test_bench_synthesis_ctrl_c_exits_130(tmp_path, cv3, monkeypatch):
    from specli.tts.synthesis import Synthesizer

    lines = tmp_path / "lines.txt"
    lines.write_text("one two\nthree four\n")
    preset = tmp_path / "tiny-ar.toml"
    preset.write_text(f'family = "cosyvoice"\nmodel = "{cv3}"\nsampler = "greedy"\n')
    _interrupt_on_call(monkeypatch, Synthesizer, "synthesize", 2)  # the first utterance is measured, then Ctrl-C
    res = _invoke(["bench", str(lines), "--presets", str(preset), "--repeat", "1", "--no-warmup",
                   "--out", str(tmp_path / "b"), "-q"])
    assert res.exit_code == 130 and "interrupted: no report written" in res.stderr
    assert not (tmp_path / "b" / "report.json").exists()
