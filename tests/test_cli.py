"""The CLI end to end on real clips: detection, translation, formats, jsonl, stdin, resume after SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import EN_CLIPS, ES_CLIPS, FR_CLIPS, SAMPLES
from specli.cli import main

REPO = SAMPLES.parent
TINY = ("--preset", "whisper-tiny.en-ar")
SUMMARY = re.compile(r"files: (\d+) ok, (\d+) failed, (\d+) skipped")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run(*args, input: str | None = None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)


def words(text: str) -> list[str]:
    """Lower-case words, punctuation dropped, hyphens split, 'mr' spelled out as the references do."""
    text = re.sub(r"\bmr\b\.?", "mister", text.lower().replace("-", " "))
    return re.findall(r"[\w']+", text)


def recall(reference: str, hypothesis: str) -> float:
    ref, hyp = words(reference), set(words(hypothesis))
    return sum(w in hyp for w in ref) / len(ref)


def reference(clip: Path) -> str:
    return clip.with_suffix(".txt").read_text(encoding="utf-8")


def records(stdout: str) -> list[dict]:
    """Every stdout line is one JSON object; nothing else is allowed there."""
    assert stdout == "" or stdout.endswith("\n")
    return [json.loads(line) for line in stdout.splitlines()]


def summary(stderr: str) -> tuple[int, int, int]:
    m = SUMMARY.search(stderr.strip().splitlines()[-1])
    assert m, stderr
    return tuple(map(int, m.groups()))


def visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def test_language_detected_per_file_all_formats_and_jsonl(tmp_path):
    out = tmp_path / "out"
    res = run("transcribe", SAMPLES / "en", SAMPLES / "es", SAMPLES / "fr", "-o", out, "-f", "all", "--jsonl", "-")
    assert res.exit_code == 0, res.stderr
    clips = EN_CLIPS + ES_CLIPS + FR_CLIPS
    recs = records(res.stdout)  # one JSON record per file and nothing else on stdout
    assert sorted(r["source"] for r in recs) == sorted(str(c) for c in clips)
    assert summary(res.stderr) == (len(clips), 0, 0)
    scores = {}
    for rec in recs:
        clip = Path(rec["source"])
        assert rec["language"] == clip.parent.name and rec["language_probability"] > 0.5, rec
        scores[clip] = recall(reference(clip), rec["text"])
    assert all(scores[c] >= 0.8 for c in EN_CLIPS), scores
    assert all(scores[c] >= 0.5 for c in ES_CLIPS + FR_CLIPS) and sum(scores.values()) / len(scores) >= 0.75, scores
    # es/priv-introsaved.wav and fr/priv-introsaved.wav share a stem: two outputs, neither overwrites the other
    bases = sorted({n.rsplit(".", 1)[0] for n in visible(out)})
    assert len(bases) == len(clips)
    assert visible(out) == sorted(f"{b}.{f}" for b in bases for f in ("txt", "json", "srt", "vtt", "tsv"))
    twins = [b for b in bases if b.startswith("priv-introsaved-")]
    assert len(twins) == 2
    for rec in recs:
        (base,) = [b for b in bases if json.loads((out / f"{b}.json").read_text(encoding="utf-8")) == rec]
        _check_formats(out, base, rec)
    assert "gracias" in words(" ".join((out / f"{b}.txt").read_text(encoding="utf-8") for b in twins))
    assert "merci" in words(" ".join((out / f"{b}.txt").read_text(encoding="utf-8") for b in twins))


def _check_formats(out: Path, base: str, rec: dict) -> None:
    texts = [s["text"].strip() for s in rec["segments"]]
    assert texts and 0 < rec["segments"][-1]["end"] <= rec["duration"] + 0.02
    assert (out / f"{base}.txt").read_text(encoding="utf-8") == "".join(f"{t}\n" for t in texts)
    srt = (out / f"{base}.srt").read_text(encoding="utf-8")
    assert srt.startswith("1\n00:00:0") and srt.count(" --> ") == len(texts) and texts[0] in srt
    vtt = (out / f"{base}.vtt").read_text(encoding="utf-8")
    assert vtt.startswith("WEBVTT\n\n00:00:0") and vtt.count(" --> ") == len(texts)
    tsv = (out / f"{base}.tsv").read_text(encoding="utf-8").splitlines()
    assert tsv[0] == "start\tend\ttext" and len(tsv) == len(texts) + 1


ENGLISH = {"the", "you", "your", "thank", "thanks", "please", "wait", "with", "for", "to", "in", "of",
           "and", "i", "is", "are", "a", "have", "try", "tried", "connection", "conference"}
SOURCE_WORDS = {"gracias", "por", "favor", "usted", "espere", "conferencia", "merci", "veuillez", "revoir",
                "avoir", "attendre", "le", "la", "el", "que", "avec", "votre"}


def test_translate_spanish_and_french_into_english(tmp_path):
    # Greedy only: demo-thanks.wav falls below whisper-base's log-probability threshold, and its temperature
    # fallback samples (unseeded by default), so with fallback its text is a random draw that may stay in French.
    greedy = ("--temperature-increment-on-fallback", "0")
    res = run("translate", SAMPLES / "es", SAMPLES / "fr", *greedy, "-o", tmp_path, "--jsonl", "-", "--progress")
    assert res.exit_code == 0, res.stderr
    recs = records(res.stdout)  # the forced progress bar stays on stderr
    assert len(recs) == 4 and "4/4 files" in res.stderr
    all_words = set()
    for rec in recs:
        assert rec["language"] == Path(rec["source"]).parent.name  # the spoken language, detected
        assert {seg["temperature"] for seg in rec["segments"]} == {0.0}
        w = words(rec["text"])
        all_words |= set(w)
        assert len(w) >= 3, rec["text"]
        assert sum(x in ENGLISH for x in w) >= max(2, len(w) // 3), rec["text"]
        assert not set(w) & SOURCE_WORDS, rec["text"]
    # "Gracias, por favor espere ...", "Merci. Veuillez attendre ...", "Merci d'avoir essayé ..."
    assert {"thank", "thanks"} & all_words and {"please", "wait"} & all_words


def test_paths_from_stdin_then_rerun_skips_then_overwrite(tmp_path):
    out = tmp_path / "out"
    args = ("transcribe", "-", *TINY, "-o", out, "--jsonl", "-")
    clips = EN_CLIPS[2:4]  # the two shortest
    stdin = f"{clips[0]}\n\n  {clips[1]}  \n"
    first = run(*args, input=stdin)
    assert first.exit_code == 0, first.stderr
    assert sorted(r["source"] for r in records(first.stdout)) == sorted(map(str, clips))
    assert visible(out) == sorted(f"{c.stem}.txt" for c in clips)
    mtimes = {p: p.stat().st_mtime_ns for p in out.iterdir()}

    again = run(*args, input=stdin)  # skipped files still get their record, read back from disk
    assert again.exit_code == 0 and records(again.stdout) == records(first.stdout)
    assert summary(again.stderr) == (0, 0, 2)
    assert {p: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes

    forced = run(*args, "--overwrite", input=stdin)
    assert forced.exit_code == 0 and len(records(forced.stdout)) == 2
    assert summary(forced.stderr) == (2, 0, 0)


def _wait_for(predicate, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, "the batch ended before it could be killed"
        assert time.monotonic() < deadline, "no output appeared in time"
        time.sleep(0.02)


def test_resume_after_sigkill_gives_every_output_exactly_once(tmp_path):
    out = tmp_path / "out"
    twins = [SAMPLES / "es" / "priv-introsaved.wav", SAMPLES / "fr" / "priv-introsaved.wav"]  # same stem
    inputs = [SAMPLES / "en", *twins]  # seven clips
    args = ["transcribe", *map(str, inputs), "-o", str(out), "-f", "json", *TINY]
    with open(tmp_path / "stderr.txt", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "specli.cli", *args, "--threads", "1"], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            _wait_for(lambda: out.is_dir() and any(out.glob("*.json")), proc, timeout=180)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")}
    assert 1 <= len(before) < 7

    res = run(*args, "--jsonl", "-")
    assert res.exit_code == 0, res.stderr
    assert summary(res.stderr) == (7 - len(before), 0, len(before))  # the rerun reports the skipped ones
    assert len(records(res.stdout)) == 7  # the skipped ones' records are read back from disk

    finished = visible(out)
    assert all(n.endswith(".json") for n in finished) and len(finished) == 7
    assert all(p.name.startswith(".") for p in out.iterdir() if p.name.endswith(".part"))
    sources = [Path(json.loads((out / n).read_text(encoding="utf-8"))["source"]).resolve() for n in finished]
    assert sorted(sources) == sorted(c.resolve() for c in EN_CLIPS + twins)
    assert sum(n.startswith("priv-introsaved-") for n in finished) == 2
    assert {n: (out / n).stat().st_mtime_ns for n in before} == before  # not redone


def test_model_without_a_preset_runs_with_its_own_head_or_none(tmp_path):
    """`--model whisper-tiny.en` beside the default preset (whose EAGLE head is whisper-base's) runs the shipped
    tiny.en EAGLE preset; a model no shipped head fits decodes without a drafter; a named preset is kept as named."""
    from dataclasses import replace

    from specli.presets import DEFAULT_PRESET, load_preset, preset_for_model

    default = load_preset(DEFAULT_PRESET)
    assert preset_for_model(default, None) is default
    assert preset_for_model(default, default.model) is default
    assert preset_for_model(default, "whisper-tiny.en").name == "whisper-tiny.en-eagle-asr"
    plain = preset_for_model(default, str(tmp_path / "whisper-small"))
    assert (plain.model, plain.draft.drafter, plain.draft.strategy) == (str(tmp_path / "whisper-small"), "none", "ar")
    pool = load_preset("whisper-base-pool")  # no head: the drafter is no model's own
    assert preset_for_model(replace(pool), "whisper-tiny.en") == pool
    clip = EN_CLIPS[0]
    res = run("transcribe", str(clip), "--model", "whisper-tiny.en", "-o", str(tmp_path / "o"), "-f", "txt")
    assert res.exit_code == 0, res.output
    assert "runs with preset whisper-tiny.en-eagle-asr" in res.stderr
    assert recall(reference(clip), (tmp_path / "o" / f"{clip.stem}.txt").read_text()) > 0.8
    res = run("transcribe", str(clip), "--preset", DEFAULT_PRESET, "--model", "whisper-tiny.en",
              "-o", str(tmp_path / "named"))
    assert res.exit_code != 0 and "does not match this target" in res.output + res.stderr  # as named: refused
