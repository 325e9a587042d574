"""Sharding a batch between processes (specli/io/sharding.py): the split and gather of two real gloo ranks, the
run manifest's order and totals, and `torchrun --nproc_per_node 2 -m specli transcribe` over real clips:
every file once, outputs equal to a single process, a killed rank's files finished by a rerun."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import EN_CLIPS, SAMPLES
from specli.cli import main
from specli.errors import UsageError
from specli.io.sharding import DEFAULT_MANIFEST, ShardedRun, launched_world_size, manifest_rows, run_totals

REPO = SAMPLES.parent
# --batch-size 1: the ranks batch other files together than one process does, and batched products round
# log-probabilities differently (json fields); batch N == batch 1 is tested in test_batch_pipeline.py
TINY = ("--preset", "whisper-tiny.en-ar", "--threads", "1", "--no-progress", "--batch-size", "1")
FORMATS = ("txt", "srt", "vtt", "tsv", "json")
RUN_TIMEOUT = 240  # seconds for one torchrun on a loaded 2-core machine (each took 9-11 s in CI)

# torchrun launches (a launcher and two ranks each): on one xdist worker with the other tests that start
# their own process trees (tests/test_bench_peer_process.py), never two such trees at once.
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.xdist_group("own-processes")]


# --- pure parts -------------------------------------------------------------------------------------------

def test_world_size_comes_from_the_launcher_environment():
    assert launched_world_size({}) == 1
    assert launched_world_size({"WORLD_SIZE": "1"}) == 1
    assert launched_world_size({"WORLD_SIZE": "4"}) == 4
    with pytest.raises(UsageError):
        launched_world_size({"WORLD_SIZE": "two"})


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 12).flatmap(lambda n: st.tuples(st.just(n), st.permutations(range(n)), st.integers(0, n))))
def test_manifest_rows_are_in_input_order_whatever_order_they_arrive_in(case):
    n, order, reported = case
    labels = [f"in{i}" for i in range(n)]
    arrived = [{"index": i, "input": labels[i], "status": "ok", "record": {"x": i}} for i in order[:reported]]
    rows = manifest_rows(labels, arrived)
    assert [r["input"] for r in rows] == labels
    assert [r["index"] for r in rows] == list(range(n))
    done = set(order[:reported])
    assert [r["status"] for r in rows] == ["ok" if i in done else "not-run" for i in range(n)]
    assert all("record" not in r for r in rows)  # records go to --jsonl, not into the manifest


def test_an_input_reported_twice_is_an_error():
    with pytest.raises(ValueError, match="two ranks"):
        manifest_rows(["a", "b"], [{"index": 1, "status": "ok"}, {"index": 1, "status": "ok"}])


def test_totals_count_statuses_and_list_failures():
    rows = [{"input": "a", "status": "ok", "audio_seconds": 1.5}, {"input": "b", "status": "failed", "error": "bad"},
            {"input": "c", "status": "skipped"}, {"input": "d", "status": "not-run"},
            {"input": "e", "status": "ok", "audio_seconds": 2.0}]
    t = run_totals(rows, world=2, wall_seconds=3.0)
    assert (t["inputs"], t["ok"], t["failed"], t["skipped"], t["not_run"]) == (5, 2, 1, 1, 1)
    assert t["audio_seconds"] == 3.5 and t["world_size"] == 2
    assert t["failures"] == [{"input": "b", "error": "bad"}]


# --- two real gloo ranks (forked; a free port) ------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, folder: str, queue) -> None:
    os.environ.update({"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo",
                       "OMP_NUM_THREADS": "1"})
    try:
        out = []
        for n in (0, 1, 2, 7):
            labels = [f"file{i}" for i in range(n)]
            run = ShardedRun.start(labels, None, Path(folder) / f"n{n}")
            for i in run.take(list(range(n))):
                run.add({"input": labels[i], "status": "failed" if i == n - 1 else "ok"})  # the last one fails
            report = run.finish()
            out.append((n, run.mine, report.rows, report.exit_code))
        try:
            ShardedRun.start([f"only-rank-{rank}"], None, Path(folder))
            out.append("accepted different inputs")
        except UsageError as exc:
            out.append(str(exc))
        queue.put((rank, out))
    except BaseException as exc:  # report anything to the test instead of hanging it
        queue.put((rank, repr(exc)))
        raise


def test_two_ranks_split_contiguously_gather_in_order_and_agree_on_the_exit_code(tmp_path):
    ctx = multiprocessing.get_context("fork")
    queue, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, str(tmp_path), queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        results = dict(queue.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(isinstance(v, list) for v in results.values()), results
    for case0, case1 in zip(results[0][:-1], results[1][:-1]):
        n, mine0, rows0, code0 = case0
        _, mine1, rows1, code1 = case1
        assert mine0 + mine1 == list(range(n))  # contiguous, disjoint, covering, rank 0 first
        assert len(mine0) - len(mine1) in (0, 1)
        assert rows0 == rows1  # every rank has the whole report
        assert [r["input"] for r in rows0] == [f"file{i}" for i in range(n)]
        assert [r["rank"] for r in rows0] == [0] * len(mine0) + [1] * len(mine1)
        assert code0 == code1 == (1 if n else 0)  # rank 1's failure is rank 0's exit code too
        manifest = tmp_path / f"n{n}" / DEFAULT_MANIFEST  # the default, written by rank 0 only
        lines = [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines()]
        assert lines[:-1] == rows0 and lines[-1]["summary"]["failed"] == (1 if n else 0)
    assert all("different inputs" in results[r][-1] for r in (0, 1))


# --- the CLI in one process -------------------------------------------------------------------------------

def run(*args, env: dict | None = None, input: str | None = None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env, input=input, catch_exceptions=False)


def test_single_process_run_manifest_lists_inputs_in_order(tmp_path):
    out, missing = tmp_path / "out", tmp_path / "missing.wav"
    res = run("transcribe", missing, EN_CLIPS[2], "-o", out, "--run-manifest", tmp_path / "run.jsonl", *TINY)
    assert res.exit_code == 1, res.stderr
    lines = [json.loads(x) for x in (tmp_path / "run.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [(r["input"], r["status"], r["rank"]) for r in lines[:-1]] == [
        (str(missing), "failed", 0), (str(EN_CLIPS[2]), "ok", 0)]
    assert lines[1]["outputs"] == [str(out / f"{EN_CLIPS[2].stem}.txt")]
    assert lines[-1]["summary"]["ok"] == 1 and lines[-1]["summary"]["failures"][0]["input"] == str(missing)
    assert not (out / DEFAULT_MANIFEST).exists()  # without a launcher there is no default manifest


def test_stdin_paths_are_refused_under_a_launcher(tmp_path):
    res = run("transcribe", "-", "-o", tmp_path, *TINY, env={"WORLD_SIZE": "2"}, input=f"{EN_CLIPS[0]}\n")
    assert res.exit_code == 2 and "stdin" in res.stderr
    res = run("synthesize", "-", "-o", tmp_path, env={"WORLD_SIZE": "2"}, input="hello\n")
    assert res.exit_code == 2 and "stdin" in res.stderr


# --- torchrun --nproc_per_node 2 -m specli ----------------------------------------------------------------

def _torchrun(*args, **popen) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "specli", *map(str, args)]
    return subprocess.Popen(cmd, cwd=REPO, env=env, **popen)


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"torchrun did not finish in {RUN_TIMEOUT} s:\n{err}")
    return proc.returncode, out, err


def _manifest(path: Path) -> tuple[list[dict], dict]:
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    return lines[:-1], lines[-1]["summary"]


def _comparable(text: str, fmt: str) -> object:
    """An output without what differs between runs of the same decode: timings, and the source path."""
    if fmt != "json":
        return text
    data = json.loads(text)
    data.pop("stats", None)
    data.pop("source", None)
    return data


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The single-process reference: every format of the English clips."""
    out = tmp_path_factory.mktemp("single")
    res = run("transcribe", SAMPLES / "en", "-o", out, "-f", "all", *TINY)
    assert res.exit_code == 0, res.stderr
    return {(stem.stem, fmt): _comparable((out / f"{stem.stem}.{fmt}").read_text(encoding="utf-8"), fmt)
            for stem in EN_CLIPS for fmt in FORMATS}


def _assert_equal_to_single(out: Path, single: dict) -> None:
    produced = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file() and not p.name.startswith("."))
    for rel in produced:
        if rel.name == DEFAULT_MANIFEST:
            continue
        stem, fmt = rel.stem, rel.suffix[1:]
        assert _comparable((out / rel).read_text(encoding="utf-8"), fmt) == single[(stem, fmt)], rel


@pytest.mark.slow
def test_two_torchrun_ranks_transcribe_every_file_once_as_one_process_does(tmp_path, single):
    clips = tmp_path / "clips"
    clips.mkdir()
    for c in EN_CLIPS:
        shutil.copy(c, clips / c.name)
    (clips / "zz-broken.wav").write_bytes(b"RIFF not really a wave file" * 40)  # sorted last: rank 1's share
    out = tmp_path / "out"
    proc = _torchrun("transcribe", clips, "-o", out, "-f", "all", "--jsonl", "-", *TINY,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    code, stdout, stderr = _finish(proc)
    assert code == 1, stderr  # rank 1's broken file fails the whole run
    inputs = sorted(clips.iterdir())
    rows, summary = _manifest(out / DEFAULT_MANIFEST)
    assert [r["input"] for r in rows] == [str(p) for p in inputs]  # each input exactly once, in input order
    assert [r["rank"] for r in rows] == [0, 0, 0, 1, 1, 1]
    assert [r["status"] for r in rows] == ["ok"] * 5 + ["failed"]
    assert (summary["ok"], summary["failed"], summary["world_size"]) == (5, 1, 2)
    assert "rank 0: files: 3 ok, 0 failed" in stderr and "rank 1: files: 2 ok, 1 failed" in stderr
    assert "all 2 ranks: 5 ok, 1 failed" in stderr
    records = [json.loads(line) for line in stdout.splitlines()]  # rank 0 prints every rank's, in input order
    assert [r["source"] for r in records] == [str(p) for p in inputs[:5]]
    _assert_equal_to_single(out, single)
    assert len([p for p in out.iterdir() if p.suffix == ".txt"]) == 5


def _rank_pid(parent: int, rank: int) -> int | None:
    """The pid of the torchrun worker of ``rank`` (a child of ``parent`` whose environment has RANK=rank)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (d / "environ").read_bytes().split(b"\0") if ppid == parent else []
        except (OSError, ValueError, IndexError):
            continue
        if f"RANK={rank}".encode() in env:
            return int(d.name)
    return None


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the rank's process through /proc")
def test_a_killed_rank_is_finished_by_a_rerun(tmp_path, single):
    clips = tmp_path / "clips"
    for sub in ("a", "b"):  # ten real clips: rank 0 gets a/, rank 1 gets b/
        (clips / sub).mkdir(parents=True)
        for c in EN_CLIPS:
            shutil.copy(c, clips / sub / c.name)
    out = tmp_path / "out"
    args = ("transcribe", clips, "-o", out, "-f", "json", *TINY)
    with open(tmp_path / "killed.err", "wb") as err:
        proc = _torchrun(*args, stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + RUN_TIMEOUT
            while not any((out / "b").glob("*.json")):  # rank 1 has finished its first file
                assert proc.poll() is None, (tmp_path / "killed.err").read_text()
                assert time.monotonic() < deadline, "rank 1 wrote nothing in time"
                time.sleep(0.02)
            pid = _rank_pid(proc.pid, 1)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=RUN_TIMEOUT)
        finally:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*.json")}
    assert 1 <= len(list((out / "b").glob("*.json"))) < len(EN_CLIPS)  # killed in the middle of its share
    assert not (out / DEFAULT_MANIFEST).exists()

    code, _, stderr = _finish(_torchrun(*args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    assert code == 0, stderr
    rows, summary = _manifest(out / DEFAULT_MANIFEST)
    inputs = sorted(p for p in clips.rglob("*.wav"))
    assert [r["input"] for r in rows] == [str(p) for p in inputs]
    done_before = {str(clips / p.relative_to(out).with_suffix(".wav")) for p in before}
    assert {r["input"] for r in rows if r["status"] == "skipped"} == done_before  # not redone
    assert {r["input"] for r in rows if r["status"] == "ok"} == {str(p) for p in inputs} - done_before
    assert summary["failed"] == 0 and summary["not_run"] == 0
    assert {p: p.stat().st_mtime_ns for p in before} == before
    _assert_equal_to_single(out, single)
    assert len(list(out.rglob("*.json"))) == 2 * len(EN_CLIPS)


@pytest.mark.slow
def test_two_torchrun_ranks_synthesize_the_same_tokens_as_one_process(tmp_path):
    from cosyvoice_fixtures import write_checkpoint

    ckpt = write_checkpoint(tmp_path / "ckpt", "cosyvoice2", seed=3)
    lines = tmp_path / "lines.txt"
    lines.write_text("hello there\nok then\n\nsome more words\nyes\nthe last one\n", encoding="utf-8")
    args = ("synthesize", lines, "--format", "npy", "--model", ckpt, "--sampler", "ras", "--seed", "7", "--threads", "1")
    one = run(*args, "-o", tmp_path / "one")
    assert one.exit_code == 1, one.stderr  # the empty line
    code, _, stderr = _finish(_torchrun(*args, "-o", tmp_path / "two", stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True))
    assert code == 1, stderr
    rows, summary = _manifest(tmp_path / "two" / DEFAULT_MANIFEST)
    assert [r["input"] for r in rows] == [f"{lines}:{n}" for n in range(1, 7)]
    assert [r["rank"] for r in rows] == [0, 0, 0, 1, 1, 1]
    assert [r["status"] for r in rows] == ["ok", "ok", "failed", "ok", "ok", "ok"]
    assert (summary["ok"], summary["failed"]) == (5, 1)
    produced = sorted(p.name for p in (tmp_path / "two").glob("*.npy"))
    assert produced == sorted(p.name for p in (tmp_path / "one").glob("*.npy")) and len(produced) == 5
    for name in produced:  # each utterance's RNG comes from (seed, id): the split changes nothing
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
