"""``specli bench`` peers in their own worker processes (issue 26): the presets' process never imports
CTranslate2, every worker is reaped, and a worker that dies, hangs or cannot start is a clean skip (or a clean
error before measuring), never a hung benchmark. Structure only: what a peer beside a preset does to its timing
is measured by benchmarks/bench_peer_beside.py, not asserted here."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import EN_CLIPS, SAMPLES
from specli.bench.peer_worker import PeerAnswer, PeerWorker, call_timeout
from specli.bench.peers import BenchError, PeerSpec, PeerTarget
from specli.bench.runner import BenchOptions, run_bench
from specli.cli import main
from specli.io.audio import load_audio

# Peer worker processes, SIGKILL / SIGSTOP sent to them: on one xdist worker with the other tests that start
# their own process trees (tests/test_sharding.py), never two such trees at once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("own-processes")]

ROOT = SAMPLES.parent
PRESET = "whisper-tiny.en-ar"
PEER = "faster-whisper:int8"
CLIPS = [str(EN_CLIPS[2]), str(EN_CLIPS[4])]  # 3.0 s and 4.9 s

# Runs in a fresh interpreter: the test process itself may hold CTranslate2 (other tests build peers in it).
# One bench of the preset with the peer beside it, at two threads asked for (the environment says one).
SCRIPT = """
import json, multiprocessing, os, sys
from specli.bench.runner import BenchOptions, run_bench

opts = BenchOptions(("%(preset)s",), peers=("%(peer)s",), repeat=1, warmup=False, threads=2, language="en",
                    dtype="float32")
report = run_bench(sys.argv[1:], opts)
print(json.dumps({
    "summaries": report["summaries"], "processes": report["machine"].get("processes"), "pid": os.getpid(),
    "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("ctranslate2", "faster_whisper")),
    "children": [p.pid for p in multiprocessing.active_children()],
}))
""" % {"peer": PEER, "preset": PRESET}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _peer_children() -> list[multiprocessing.Process]:
    return [p for p in multiprocessing.active_children() if p.name.startswith("specli-bench-peer-")]


def test_a_peer_beside_a_preset_runs_in_a_worker_the_presets_process_never_imports():
    """The peer ran in another process, at the threads asked for, which is gone after the bench; the presets'
    process never imported CTranslate2 or faster-whisper; both systems decoded both clips."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *CLIPS], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["modules"] == [], got["modules"]
    worker = got["processes"]["peers"][PEER]
    assert got["processes"]["pid"] == got["pid"] and worker["pid"] != got["pid"]
    assert worker["torch_threads"] == 2 and not _alive(worker["pid"])
    assert got["children"] == []  # every worker was stopped and reaped
    assert {s["system"]: (s["utterances"], s["skipped"]) for s in got["summaries"]} == {PRESET: (2, 0), PEER: (2, 0)}


@pytest.fixture(scope="module")
def tiny_target(whisper_models):
    return PeerTarget.of(whisper_models("whisper-tiny.en"))


def test_worker_answers_with_its_own_timing_and_a_killed_worker_is_gone(tiny_target):
    """The clip crosses the pipe once, the text and seconds come from the worker; SIGKILL makes this and
    every later request answer 'gone' with the signal, at once."""
    worker = PeerWorker(PeerSpec("faster-whisper", "int8"), tiny_target, 1, "transcribe")
    try:
        ready = worker.ready()
        assert (ready.name, ready.dtype, ready.batched, ready.torch_threads) == (PEER, "int8", False, 1)
        assert ready.pid != os.getpid() and _alive(ready.pid)
        audio = load_audio(EN_CLIPS[0])
        first = worker.transcribe("a", audio, "en", False, timeout=120)
        assert first.status == "ok" and "first in line" in first.texts[0].lower() and 0 < first.seconds < 120
        again = worker.transcribe("a", audio[:10], "en", False, timeout=120)  # held by the worker: not resent
        assert again.texts == first.texts
        os.kill(ready.pid, signal.SIGKILL)
        gone = worker.transcribe("b", audio, "en", False, timeout=120)
        assert gone.status == "gone" and gone.reason == f"{PEER} stopped: the worker process died (signal SIGKILL)"
        assert worker.transcribe_files([str(EN_CLIPS[0])], ["en"], False, 1, timeout=120) == gone
        assert not _alive(ready.pid)
    finally:
        worker.close()
    worker.close()  # twice: nothing happens


@pytest.mark.parametrize("clip_sent", [True, False])
def test_a_hung_worker_is_stopped_after_its_timeout(tiny_target, clip_sent):
    """A worker that stops answering (SIGSTOP: it cannot even be terminated) is killed after the time limit,
    whether it holds the clip already (the request waits for an answer) or not (the clip, larger than the
    pipe's buffer, waits to be read): the call returns (pytest-timeout fails a hang), the worker is reaped,
    and later requests answer the same at once."""
    worker = PeerWorker(PeerSpec("faster-whisper", "int8"), tiny_target, 1, "transcribe")
    pid = worker.ready().pid
    audio = load_audio(EN_CLIPS[0])
    if clip_sent:
        assert worker.transcribe("a", audio, "en", False, timeout=120).status == "ok"
    os.kill(pid, signal.SIGSTOP)
    got = worker.transcribe("a", audio, "en", False, timeout=1.5)
    why = "no answer within 1.5 s" if clip_sent else "it took no request within 1.5 s"
    assert got == PeerAnswer("gone", reason=f"{PEER} stopped: {why}")
    assert not _alive(pid) and _peer_children() == []
    assert worker.transcribe("b", audio, "en", False, timeout=120) == got
    worker.close()


def test_a_peer_that_cannot_start_is_an_error_before_measuring():
    target = PeerTarget("not-a-model", Path("/nonexistent"), "cpu", "float32")
    worker = PeerWorker(PeerSpec("faster-whisper"), target, 1, "transcribe")
    with pytest.raises(BenchError, match="peer faster-whisper could not start: peer 'faster-whisper' needs a "
                                         "bundled or CTranslate2 model, not 'not-a-model'"):
        worker.ready()
    assert worker.gone is not None and worker.transcribe("a", load_audio(EN_CLIPS[0]), "en", False, 5).status == "gone"


def test_answers_become_skip_reasons_and_a_bug_stops_the_bench():
    assert PeerAnswer("cannot", reason="too long").skip_reason("hf") == "too long"
    assert PeerAnswer("failed", reason="RuntimeError: x").skip_reason("hf") == "hf failed: RuntimeError: x"
    assert PeerAnswer("gone", reason="hf stopped: why").skip_reason("hf") == "hf stopped: why"
    with pytest.raises(BenchError, match="hf raised an unexpected error in its worker process:\nTraceback"):
        PeerAnswer("error", reason="Traceback (most recent call last): ...\n").skip_reason("hf")
    assert call_timeout(10.0) == 300.0 + 20.0 * 10.0 and call_timeout(10.0, 2.5) == 2.5


#: The peer's call limit in the hung-worker bench: its first call (a 3-s clip, ~0.5 s at one thread) must fit.
HUNG_LIMIT = 15.0


@pytest.mark.parametrize("sig, why", [
    (signal.SIGKILL, "the worker process died (signal SIGKILL)"),
    (signal.SIGSTOP, f"it took no request within {HUNG_LIMIT:g} s"),  # hung: the next clip waits to be read
], ids=["killed", "hung"])
def test_a_worker_killed_or_hung_mid_bench_leaves_clean_skips(tmp_path, sig, why):
    """The peer's worker dies (or hangs) after its first measured run: the rest of its runs are skipped with
    the reason, warned once per file, the preset is measured throughout, and no worker is left."""
    lines: list[str] = []

    def progress(line: str) -> None:
        if line.startswith(f"pass 1/2 file 1/2 {PEER}:"):
            (child,) = _peer_children()
            os.kill(child.pid, sig)

    opts = BenchOptions((PRESET,), peers=(PEER,), repeat=2, warmup=False, threads=1, language="en",
                        peer_timeout=HUNG_LIMIT)
    report = run_bench(CLIPS, opts, progress=progress, runs_path=tmp_path / "runs.jsonl", warn=lines.append)
    reason = f"{PEER} stopped: {why}"
    assert lines == [f"{PEER} skipped {CLIPS[1]} (pass 1/2): {reason}",
                     f"{PEER} skipped {CLIPS[0]} (pass 2/2): {reason}"]
    summaries = {s["system"]: s for s in report["summaries"]}
    assert (summaries[PRESET]["utterances"], summaries[PRESET]["skipped"]) == (2, 0)
    assert (summaries[PEER]["utterances"], summaries[PEER]["skipped"]) == (1, 2)  # files run, files with a skip
    assert {(s["file"], tuple(s["repeats"]), s["reason"]) for s in report["skipped"]} == {
        (CLIPS[0], (1,), reason), (CLIPS[1], (0, 1), reason)}
    assert _peer_children() == []


def test_throughput_mode_skips_a_peer_past_its_timeout(tmp_path):
    """--batch-sizes with --peer-timeout too short for a call: the peer's archive runs are skipped (warned,
    in report.json and report.md), the preset's rows are measured, the command exits 0."""
    out = tmp_path / "bench"
    result = CliRunner().invoke(main, ["bench", *CLIPS, "--presets", PRESET, "--peers", "faster-whisper-batched:int8",
                                       "--batch-sizes", "1,2", "--peer-timeout", "0.001", "--repeat", "1",
                                       "--no-warmup", "--threads", "1", "--language", "en", "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    reason = "faster-whisper-batched:int8 stopped: no answer within 0.001 s"
    assert f"warning: faster-whisper-batched:int8 skipped batch size 1 (pass 1/1): {reason}" in result.stderr
    assert "warning: 2 peer run(s) skipped" in result.stderr
    report = json.loads((out / "report.json").read_text())
    assert [(s["batch_size"], s["reason"]) for s in report["skipped"]] == [(1, reason), (2, reason)]
    assert {(r["system"], r["batch_size"]) for r in report["throughput"]} == {(PRESET, 1), (PRESET, 2)}
    md = (out / "report.md").read_text()
    assert "## Skipped runs" in md and f"| faster-whisper-batched:int8 | 2 | 1 | {reason} |" in md
    assert "each peer in its own worker process: faster-whisper-batched:int8 pid" in md
