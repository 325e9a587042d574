"""Bad inputs are reported one line each on stderr, the batch goes on, and the exit status says so."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner

from conftest import EN_CLIPS
from specli.asr.pipeline import discover, plan_outputs, run_batch
from specli.cli import main
from specli.asr.windows import TranscribeOptions

TINY = ("--preset", "whisper-tiny.en-ar")
SUMMARY = re.compile(r"files: (\d+) ok, (\d+) failed, (\d+) skipped")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run(*args, input: str | None = None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)


@pytest.fixture
def bad(tmp_path):
    """Every kind of bad input, in a folder with a long name (messages must not wrap)."""
    root = tmp_path / ("a-folder-with-a-rather-long-name-so-that-messages-exceed-eighty-columns" * 2)
    root.mkdir()
    clip = EN_CLIPS[4].read_bytes()
    paths = {
        "zero": root / "zero.wav",
        "truncated": root / "truncated.wav",
        "text": root / "text.wav",
        "xyz": root / "data.xyz",
        "no_audio_dir": root / "notes",
        "missing": root / "missing.wav",
    }
    paths["zero"].write_bytes(b"")
    paths["truncated"].write_bytes(clip[: len(clip) // 3])
    paths["text"].write_text("this is not audio\n" * 50)
    paths["xyz"].write_bytes(bytes(range(256)) * 40)
    paths["no_audio_dir"].mkdir()
    (paths["no_audio_dir"] / "readme.txt").write_text("no audio here\n")
    (paths["no_audio_dir"] / "sub").mkdir()
    return paths


REASONS = {
    "zero": "empty",
    "truncated": "truncated",
    "text": "unsupported or corrupt",
    "xyz": "unsupported or corrupt",
    "no_audio_dir": "no audio",
    "missing": "no such file",
}


def visible(folder) -> list[str]:
    """Output names, without the hidden resume sidecars (``.<name>.specli``)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def _summary(stderr: str) -> tuple[int, int, int]:
    m = SUMMARY.search(stderr.strip().splitlines()[-1])
    assert m, stderr
    return tuple(map(int, m.groups()))


def test_every_bad_input_reported_and_good_files_still_transcribed(bad, tmp_path):
    good_dir = tmp_path / "good"
    good_dir.mkdir()
    good = [shutil.copy(c, good_dir / c.name) for c in EN_CLIPS[2:4]]
    for c in EN_CLIPS[2:4]:
        shutil.copy(c.with_suffix(".txt"), good_dir / f"{c.stem}.txt")  # references, not audio: ignored
    shutil.copy(bad["zero"], good_dir / "also-empty.flac")  # a bad file inside a good folder
    out = tmp_path / "out"
    inputs = [bad["zero"], good_dir, bad["truncated"], bad["text"], bad["xyz"], bad["no_audio_dir"], bad["missing"]]
    res = run("transcribe", *inputs, *TINY, "-o", out, "--jsonl", "-")

    assert res.exit_code != 0
    lines = res.stderr.splitlines()
    for kind, path in bad.items():
        mentioning = [line for line in lines if str(path) in line]
        assert len(mentioning) == 1, (kind, lines)  # one line, naming the path ...
        assert REASONS[kind] in mentioning[0], (kind, mentioning[0])  # ... with the reason
    assert sum("also-empty.flac" in line and "empty" in line for line in lines) == 1
    assert _summary(res.stderr) == (2, 7, 0)
    # the good files of the same run were transcribed and written; stdout has only their records
    recs = [json.loads(line) for line in res.stdout.splitlines()]
    assert sorted(r["source"] for r in recs) == sorted(str(g) for g in good)
    assert visible(out) == sorted(f"{g.stem}.txt" for g in good)
    for g in good:
        ref = set(re.findall(r"\w+", g.with_suffix(".txt").read_text().lower()))
        got = set(re.findall(r"\w+", (out / f"{g.stem}.txt").read_text().lower()))
        assert len(ref & got) >= 0.6 * len(ref), (g.name, got)  # tiny.en hears 'old-sposed'


def test_fail_fast_stops_at_the_first_failure(bad, tmp_path):
    first, last = EN_CLIPS[2], EN_CLIPS[3]  # the two shortest
    out = tmp_path / "out"
    res = run("transcribe", first, bad["truncated"], last, *TINY, "-o", out, "--fail-fast")
    assert res.exit_code != 0
    assert str(bad["truncated"]) in res.stderr and "truncated" in res.stderr
    assert _summary(res.stderr) == (1, 1, 0)
    assert visible(out) == [f"{first.stem}.txt"]  # the file after it was not done

    # without --fail-fast the same run goes on to the last file
    res = run("transcribe", first, bad["truncated"], last, *TINY, "-o", out)
    assert res.exit_code != 0 and _summary(res.stderr) == (1, 1, 1)
    assert visible(out) == sorted(f"{c.stem}.txt" for c in (first, last))


def test_only_bad_inputs_exit_non_zero_without_output(bad, tmp_path):
    out = tmp_path / "out"
    res = run("transcribe", *bad.values(), *TINY, "-o", out, "--jsonl", "-", "--fail-fast")
    assert res.exit_code != 0 and res.stdout == ""
    assert _summary(res.stderr)[0] == 0 and _summary(res.stderr)[1] == 1
    assert not out.exists() or not any(out.iterdir())


def test_library_batch_reports_errors_as_outcomes(bad, tmp_path, whisper_models):
    found, failed = discover(str(p) for p in bad.values())
    assert sorted(o.path.name for o in failed) == ["missing.wav", "notes"]
    assert all(o.error and str(o.path) in o.error for o in failed)
    items = plan_outputs(found, tmp_path / "out")
    outcomes = list(run_batch(whisper_models("whisper-tiny.en"), items, TranscribeOptions(), ["txt"]))
    assert [o.path for o in outcomes] == [bad["zero"], bad["truncated"], bad["text"], bad["xyz"]]
    assert all(o.error and o.error.startswith(str(o.path) + ": ") and "\n" not in o.error for o in outcomes)
    assert not (tmp_path / "out").exists()
