"""Issue 42, transcription's half: nothing stale, no wrong data, errors before work, signals and pipes.

A replaced recording is redone on resume; a cut Ogg and a float WAV with NaN fail alone with a reason; JSON
output is strict; an output path that cannot be made is a usage error before any model loads; audio behind a
symlinked directory is found; SIGTERM and a closed stdout stop the run with a summary; stale ``.part`` files
are removed. SIGTERM and the closed pipe are about the process, so they run a real ``python -m specli``.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner
from test_cli_robustness import SHORT, SUMMARY, TINY, _check_interrupted_outputs, copy_clips, run, visible
from test_cli_robustness import no_model_load  # noqa: F401 (a fixture, used by name)

from specli.asr.pipeline import discover
from specli.asr.windows import FileResult, FileStats, Segment
from specli.asr.writers import to_json
from specli.cli import main
from specli.core.types import DecodeStats

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _no_constant(name: str):
    raise ValueError(f"not strict JSON: {name}")


def strict(text: str):
    """``json.loads`` that refuses NaN, Infinity and -Infinity (Python's parser takes them by default)."""
    return json.loads(text, parse_constant=_no_constant)


def strict_records(stdout: str) -> list[dict]:
    return [strict(line) for line in stdout.splitlines()]


# --- input fingerprints -------------------------------------------------------------------------------

def test_a_replaced_recording_is_redone_on_resume(tmp_path):
    call = tmp_path / "in" / "call.wav"
    call.parent.mkdir()
    shutil.copy(SHORT[0], call)  # "he was not an ill disposed young man" (tiny.en: "old-sposed")
    out = tmp_path / "out"
    args = ("transcribe", call, *TINY, "-o", out, "-f", "json", "--jsonl", "-")
    first = run(*args)
    assert first.exit_code == 0, first.stderr
    assert "young man" in strict_records(first.stdout)[0]["text"]

    shutil.copy(SHORT[1], call)  # another recording under the same name
    second = run(*args)
    assert second.exit_code == 0, second.stderr
    assert f"redoing {call}: input changed (size " in second.stderr
    (rec,) = strict_records(second.stdout)
    assert "amiable" in rec["text"] and "amiable" in strict((out / "call.json").read_text())["text"]

    again = run(*args)  # the same file: skipped, its record read back
    assert "redoing" not in again.stderr and strict_records(again.stdout) == [rec]
    shutil.copy(call, tmp_path / "copy.wav")
    shutil.copy(tmp_path / "copy.wav", call)  # the same bytes with a new mtime: nothing to redo
    assert "redoing" not in run(*args).stderr

    audio, rate = sf.read(call, dtype="int16")
    sf.write(call, audio[::-1], rate, subtype="PCM_16")  # same size, other content
    reversed_ = run(*args)
    assert f"redoing {call}: input changed (same size, other content)" in reversed_.stderr, reversed_.stderr


def test_the_same_name_from_another_directory_is_redone(tmp_path):
    day_a, day_b = (copy_clips(tmp_path / d, [c])[0].rename(tmp_path / d / "call.wav")
                    for d, c in (("dayA", SHORT[0]), ("dayB", SHORT[1])))
    out = tmp_path / "out"
    assert run("transcribe", day_a, *TINY, "-o", out).exit_code == 0
    res = run("transcribe", day_b, *TINY, "-o", out, "--jsonl", "-")
    assert res.exit_code == 0 and f"redoing {day_b}: input changed" in res.stderr, res.stderr
    assert "amiable" in (out / "call.txt").read_text() and "amiable" in strict_records(res.stdout)[0]["text"]


def test_resume_compares_the_recorded_input(tmp_path):
    from specli.io.resume import SourceFile, decide, sidecar_path, write_sidecar

    src = tmp_path / "a.wav"
    src.write_bytes(b"first take")
    os.utime(src, ns=(10**18, 10**18))
    base = tmp_path / "a"
    txt, srt = base.with_name("a.txt"), base.with_name("a.srt")
    settings = {"preset": "p"}
    source = SourceFile(src)
    write_sidecar(sidecar_path(base), settings, {txt: "one\n"}, {}, source.identity())
    txt.write_text("one\n")
    assert decide([txt], base, settings, source=source).skip
    assert decide([txt], base, settings).skip  # no input given: settings only, as before

    src.write_bytes(b"other take")  # same size, new mtime, other bytes
    assert decide([txt], base, settings, source=source).redo_reason == "input changed (same size, other content)"
    assert decide([txt], base, settings, "skip-existing", source=source).skip
    # the srt of the new input is recorded: the txt of the old one is not kept in the sidecar beside it
    write_sidecar(sidecar_path(base), settings, {srt: "1\n"}, {}, source.identity())
    srt.write_text("1\n")
    why = decide([txt, srt], base, settings, source=source).redo_reason
    assert why == "a.txt was made with other settings or input"
    assert decide([srt], base, settings, source=source).skip
    assert source.identity()["mtime_ns"] is None  # modified just now: compared by content next time
    os.utime(src, ns=(10**18, 10**18))  # the same file, its mtime now recorded: the srt entry is kept beside
    write_sidecar(sidecar_path(base), settings, {txt: "two\n"}, {}, source.identity())
    txt.write_text("two\n")
    assert decide([txt, srt], base, settings, source=source).skip
    src.unlink()
    assert decide([srt], base, settings, source=source).redo_reason.startswith("input changed (cannot read it")


# --- audio checks and strict JSON ---------------------------------------------------------------------

def test_a_cut_ogg_and_a_nan_wav_fail_alone_with_a_reason(tmp_path):
    src = tmp_path / "in"
    good = copy_clips(src, SHORT[:1])[0]
    audio, rate = sf.read(SHORT[1], dtype="float32")
    full = tmp_path / "full.ogg"
    sf.write(full, audio, rate, format="OGG", subtype="VORBIS")
    cut = src / "cut.ogg"
    cut.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    audio[[100, 2000, 9000]] = [np.nan, np.inf, -np.inf]
    nan = src / "nan.wav"
    sf.write(nan, audio, rate, subtype="FLOAT")
    out = tmp_path / "out"

    res = run("transcribe", cut, good, nan, *TINY, "-o", out, "-f", "json", "--jsonl", "-")
    assert res.exit_code == 1, res.stderr
    failed = [line for line in res.stderr.splitlines() if line.startswith("failed:")]
    assert failed == [f"failed: {cut}: truncated Ogg file: its last page has no end-of-stream mark",
                      f"failed: {nan}: non-finite samples (NaN or Inf), the first at 0.006 s"], res.stderr
    (rec,) = strict_records(res.stdout)
    assert rec["source"] == str(good) and "young man" in rec["text"]
    assert visible(out) == [f"{good.stem}.json"]
    strict((out / f"{good.stem}.json").read_text())
    strict((out / f".{good.stem}.specli").read_text())
    assert SUMMARY.match(res.stderr.strip().splitlines()[-1]).groups()[:3] == ("1", "2", "0")


def test_json_output_is_strict_when_numbers_are_not_finite():
    from specli.asr.writers import json_line

    segment = Segment(0.0, 1.0, " hi", (1, 2), float("-inf"), float("nan"), float("inf"))
    result = FileResult("en", float("nan"), [segment], FileStats(audio_seconds=1.0, decode=DecodeStats(tokens=2)))
    for text in (to_json(result, "a.wav"), json_line({"x": float("nan"), "y": [float("inf"), 1.5]})):
        strict(text)
    rec = strict(to_json(result, "a.wav"))
    assert rec["language_probability"] is None and rec["segments"][0]["avg_logprob"] is None
    assert strict(json_line({"x": float("nan"), "y": [float("inf"), 1.5]})) == {"x": None, "y": [None, 1.5]}


# --- checks before work -------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["name-too-long", "proc"])
def test_an_output_directory_that_cannot_be_made_is_a_usage_error(tmp_path, no_model_load, where):
    if where == "proc" and os.geteuid() != 0:
        pytest.skip("as another user os.access already refuses /proc; root is the case that got past it")
    out = Path("/proc/specli-out") if where == "proc" else tmp_path / ("x" * 300) / "out"
    res = CliRunner().invoke(main, ["transcribe", str(SHORT[0]), *TINY, "-o", str(out)])
    assert res.exit_code == 2, res.output
    reason = "No such file or directory" if where == "proc" else "File name too long"
    assert f"cannot create the output directory {out}: cannot " in res.output and reason in res.output
    assert not os.path.exists(out) and os.listdir(tmp_path) == []  # the probe left nothing


def test_a_run_manifest_that_cannot_be_written_is_a_usage_error(tmp_path, no_model_load):
    blocker = tmp_path / "afile"
    blocker.write_text("a file")
    res = CliRunner().invoke(main, ["transcribe", str(SHORT[0]), *TINY, "-o", str(tmp_path / "out"),
                                    "--run-manifest", str(blocker / "m.jsonl")])
    assert res.exit_code == 2, res.output
    assert f"cannot create the run manifest's directory {blocker}: {blocker} is not a directory" in res.output
    assert not (tmp_path / "out").exists()


def test_audio_behind_a_symlinked_directory_is_found_once(tmp_path):
    real = tmp_path / "real" / "fr"
    copy_clips(real, SHORT[:1])
    top = tmp_path / "in"
    top.mkdir()
    (top / "fr").symlink_to(real, target_is_directory=True)
    (top / "loop").symlink_to(top, target_is_directory=True)  # a loop: walked once, no hang
    (top / "zz").symlink_to(real, target_is_directory=True)  # a second link to one place: its files once
    found, bad = discover([str(top)])
    assert bad == [] and found == [(top / "fr" / f"{SHORT[0].stem}-0.wav", top)]


# --- over-long names and stale temporary files --------------------------------------------------------

def test_an_over_long_output_name_is_reported_by_its_path(tmp_path):
    clip = Path(shutil.copy(SHORT[0], tmp_path / ("L" * 250 + ".wav")))  # its sidecar's name is over 255 bytes
    out = tmp_path / "out"
    res = run("transcribe", clip, *TINY, "-o", out)
    assert res.exit_code == 1
    (failed,) = [line for line in res.stderr.splitlines() if line.startswith("failed:")]
    assert failed == f"failed: {clip}: cannot write {out / clip.stem}.txt: File name too long", failed
    assert os.listdir(out) == []


def test_stale_part_files_of_this_runs_outputs_are_removed(tmp_path):
    clip = copy_clips(tmp_path / "in", SHORT[:1])[0]
    out = tmp_path / "out"
    assert run("transcribe", clip, *TINY, "-o", out).exit_code == 0
    stale = [out / f".{clip.stem}.txt.0123abcd.part", out / f"..{clip.stem}.specli.89abcdef.part"]  # SIGKILL left
    others = [out / ".other.txt.0123abcd.part", out / f".{clip.stem}.txt.notours.part"]  # not this run's
    for p in stale + others:
        p.write_text("partial")
    live = out / f".{clip.stem}.txt.fedcba98.part"  # being written by a live process: its lock is held
    fd = os.open(live, os.O_WRONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        res = run("transcribe", clip, *TINY, "-o", out)
        assert res.exit_code == 0 and "0 ok, 0 failed, 1 skipped" in res.stderr, res.stderr
        assert not any(p.exists() for p in stale) and all(p.exists() for p in others) and live.exists()
    finally:
        os.close(fd)


# --- signals and pipes --------------------------------------------------------------------------------

def _start(args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specli", *map(str, args), "--threads", "1"], text=True,
                            stderr=subprocess.PIPE, **kwargs)


@pytest.mark.slow
def test_sigterm_mid_batch_prints_the_summary_and_exits_143(tmp_path):
    clips = copy_clips(tmp_path / "in", SHORT, copies=4)
    out = tmp_path / "out"
    # one file at a time: batched, all files can finish together, before the signal (the run then ends 143 after
    # its complete summary, and there is no mid-batch to check)
    proc = _start(["transcribe", tmp_path / "in", *TINY, "-o", out, "-f", "json", "--batch-size", "1"],
                  stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not (out.is_dir() and visible(out)):
            assert proc.poll() is None and time.monotonic() < deadline, "no output before the end"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)  # what timeout, systemd and Kubernetes send
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr
    done = _check_interrupted_outputs(out, stderr, len(clips))
    res = run("transcribe", tmp_path / "in", *TINY, "-o", out, "-f", "json")  # the rerun does the rest
    assert SUMMARY.match(res.stderr.strip().splitlines()[-1]).groups()[:3] == (
        str(len(clips) - done), "0", str(done))


@pytest.mark.slow
def test_a_closed_stdout_pipe_ends_the_run_with_a_message(tmp_path):
    clips = copy_clips(tmp_path / "in", SHORT, copies=2)
    proc = _start(["transcribe", *clips, *TINY, "-o", tmp_path / "out", "--jsonl", "-", "--batch-size", "1"],
                  stdout=subprocess.PIPE)
    try:
        first = proc.stdout.readline()  # as `| head -n 1` does: one record, then the reader goes
        proc.stdout.close()
        stderr = proc.stderr.read()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert strict(first)["source"] == str(clips[0])
    assert proc.returncode == 141, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert lines[0].startswith("stopped: standard output was closed (broken pipe); files: 2 ok, 0 failed"), stderr
