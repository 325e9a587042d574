"""``specli bench`` peers in their own worker processes (issue 26): the presets' process never imports
CTranslate2, a preset times the same with or without a peer beside it, and a worker that dies, hangs or
cannot start is a clean skip (or a clean error before measuring), never a hung benchmark."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import EN_CLIPS, SAMPLES
from specli.bench.peer_worker import KILL_TIMEOUT, PeerAnswer, PeerWorker, call_timeout
from specli.bench.peers import BenchError, PeerSpec, PeerTarget
from specli.bench.runner import BenchOptions, run_bench
from specli.cli import main
from specli.io.audio import load_audio

pytestmark = pytest.mark.slow

ROOT = SAMPLES.parent
PRESET = "whisper-tiny.en-ar"
PEER = "faster-whisper:int8"
CLIPS = [str(EN_CLIPS[2]), str(EN_CLIPS[4])]  # 3.0 s and 4.9 s
#: How far a preset's decode time with a peer beside it may be from its time alone (either way): noise on
#: a shared 2-core machine stays well inside; CTranslate2 in the same process moved it 1.5x to 16x.
BOUND = 1.4

# Runs in a fresh interpreter: the test process itself may hold CTranslate2 (other tests build peers in it).
# Alternates a bench of the preset alone and one with the peer beside it, ROUNDS times each.
SCRIPT = """
import json, multiprocessing, os, sys
from specli.bench.runner import BenchOptions, run_bench

clips, rounds, threads = sys.argv[1:3], int(sys.argv[3]), int(sys.argv[4])
alone, beside, processes = [], [], []
for _ in range(rounds):
    for peers, into in (((), alone), (("%(peer)s",), beside)):
        opts = BenchOptions(("%(preset)s",), peers=peers, repeat=3, threads=threads, language="en", dtype="float32")
        report = run_bench(clips, opts)
        into.append({s["system"]: s for s in report["summaries"]}["%(preset)s"]["decode_seconds"])
        if peers:
            processes.append(report["machine"].get("processes"))
print(json.dumps({
    "alone": alone, "beside": beside, "processes": processes, "pid": os.getpid(),
    "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("ctranslate2", "faster_whisper")),
    "children": [p.pid for p in multiprocessing.active_children()],
}))
""" % {"peer": PEER, "preset": PRESET}


def _fresh_process_bench(rounds: int, threads: int = 2) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *CLIPS, str(rounds), str(threads)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_peer_beside_a_preset_changes_neither_its_process_nor_its_timing():
    """Structure: the peer ran in another process, which is gone after the bench, and the presets' process
    never imported CTranslate2 or faster-whisper. Timing: the preset's decode phase (sum over the clips of
    the median-repeat seconds) with the peer beside it is within BOUND of the preset alone, either way
    (medians over alternating rounds; three more rounds when the first three are outside, so one loaded
    moment on a shared 2-core machine does not decide). Two-sided because CTranslate2 in the presets'
    process moved their timing both ways: ~1.5x slower on the project's bench machine (issue 26); on a
    loaded 2-core test machine this very check gave ratios of 0.06-0.48 with the previous in-process code
    (whose runs without a peer imported CTranslate2 too, for its version, and were the slow ones)."""
    got = _fresh_process_bench(rounds=3)
    assert got["modules"] == [], got["modules"]
    for processes in got["processes"]:
        worker = processes["peers"][PEER]
        assert processes["pid"] == got["pid"] and worker["pid"] != got["pid"]
        assert worker["torch_threads"] == 2 and not _alive(worker["pid"])
    assert got["children"] == []  # every worker was stopped and reaped
    ratio = statistics.median(got["beside"]) / statistics.median(got["alone"])
    if not 1 / BOUND < ratio < BOUND:
        more = _fresh_process_bench(rounds=3)
        ratio = statistics.median(got["beside"] + more["beside"]) / statistics.median(got["alone"] + more["alone"])
    assert 1 / BOUND < ratio < BOUND, (ratio, got)


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
    pipe's buffer, waits to be read)."""
    worker = PeerWorker(PeerSpec("faster-whisper", "int8"), tiny_target, 1, "transcribe")
    pid = worker.ready().pid
    audio = load_audio(EN_CLIPS[0])
    if clip_sent:
        assert worker.transcribe("a", audio, "en", False, timeout=120).status == "ok"
    os.kill(pid, signal.SIGSTOP)
    t0 = time.perf_counter()
    got = worker.transcribe("a", audio, "en", False, timeout=1.5)
    why = "no answer within 1.5 s" if clip_sent else "it took no request within 1.5 s"
    assert got == PeerAnswer("gone", reason=f"{PEER} stopped: {why}")
    assert time.perf_counter() - t0 < 1.5 + KILL_TIMEOUT + 3.0 and not _alive(pid)
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


def _peer_children() -> list[multiprocessing.Process]:
    return [p for p in multiprocessing.active_children() if p.name.startswith("specli-bench-peer-")]


def test_a_worker_killed_mid_bench_leaves_clean_skips(tmp_path):
    """The peer's worker dies after its first measured run: the rest of its runs are skipped with the
    reason, warned once per file, the preset is measured throughout, and no worker is left."""
    lines: list[str] = []

    def progress(line: str) -> None:
        if line.startswith(f"pass 1/2 file 1/2 {PEER}:"):
            (child,) = _peer_children()
            os.kill(child.pid, signal.SIGKILL)

    opts = BenchOptions((PRESET,), peers=(PEER,), repeat=2, warmup=False, threads=1, language="en")
    report = run_bench(CLIPS, opts, progress=progress, runs_path=tmp_path / "runs.jsonl", warn=lines.append)
    reason = f"{PEER} stopped: the worker process died (signal SIGKILL)"
    assert lines == [f"{PEER} skipped {CLIPS[1]} (pass 1/2): {reason}", f"{PEER} skipped {CLIPS[0]} (pass 2/2): {reason}"]
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
