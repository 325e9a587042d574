"""A file over two minutes built from the real English clips: seeking, ordering, timestamps and text."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from conftest import write_long_english
from specli.cli import main

CYCLES = 3  # every clip three times: 15 utterances, about 71 s of speech ...
GAP_RANGE = (2.5, 4.5)  # ... with short silences between them: about 124 s in all
SRT_LINE = re.compile(r"^(\d{2,}):(\d{2}):(\d{2}),(\d{3}) --> (\d{2,}):(\d{2}):(\d{2}),(\d{3})$", re.M)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def words(text: str) -> list[str]:
    text = re.sub(r"\bmr\b\.?", "mister", text.lower().replace("-", " "))
    return re.findall(r"[\w']+", text)


def lcs_pairs(ref: list[str], hyp: list[str]) -> list[tuple[int, int]]:
    """Index pairs of a longest common subsequence: an order-preserving word alignment."""
    n, m = len(ref), len(hyp)
    dp = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            dp[i][j] = dp[i + 1][j + 1] + 1 if ref[i] == hyp[j] else max(dp[i + 1][j], dp[i][j + 1])
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        if ref[i] == hyp[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif dp[i + 1][j] >= dp[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs


@pytest.fixture(scope="module")
def longform(tmp_path_factory):
    """Write the long file, transcribe it once with whisper-tiny.en (all formats, jsonl record)."""
    root = tmp_path_factory.mktemp("longform")
    path = root / "long.wav"
    utterances, seconds = write_long_english(path, CYCLES, GAP_RANGE, seed=1)
    res = CliRunner().invoke(main, ["transcribe", str(path), "--preset", "whisper-tiny.en-ar", "-o", str(root / "out"),
                                    "-f", "all", "--jsonl", "-"], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    (record,) = [json.loads(line) for line in res.stdout.splitlines()]
    return {"record": record, "utterances": utterances, "seconds": seconds, "out": root / "out"}


def test_duration_and_windows(longform):
    rec = longform["record"]
    assert longform["seconds"] > 120
    assert rec["duration"] == pytest.approx(longform["seconds"], abs=1e-3)
    assert rec["stats"]["windows"] >= 5
    assert rec["language"] == "en"


def test_segments_ordered_non_overlapping_inside_the_audio(longform):
    segs = longform["record"]["segments"]
    assert len(segs) >= 10
    for s in segs:
        assert 0.0 <= s["start"] <= s["end"] <= longform["seconds"] + 0.02, s
        assert s["text"].strip()
    for a, b in zip(segs, segs[1:]):
        assert a["end"] <= b["start"] + 1e-6, (a, b)
    assert segs[-1]["end"] > longform["seconds"] - 15  # the end of the file was transcribed too


def test_text_matches_the_clips_in_order_and_in_time(longform):
    ref, owner = [], []
    for u, (_, _, clip) in enumerate(longform["utterances"]):
        w = words(clip.with_suffix(".txt").read_text())
        ref += w
        owner += [u] * len(w)
    hyp, where = [], []
    for s in longform["record"]["segments"]:
        w = words(s["text"])
        hyp += w
        where += [(s["start"], s["end"])] * len(w)
    pairs = lcs_pairs(ref, hyp)
    assert len(pairs) / len(ref) >= 0.8  # word recall, order-aware
    assert len(hyp) <= 1.2 * len(ref)  # nothing hallucinated on top
    per_utterance = [0] * len(longform["utterances"])
    on_time = 0
    for i, j in pairs:
        u = owner[i]
        per_utterance[u] += 1
        start, end, _ = longform["utterances"][u]
        on_time += where[j][0] <= end + 2.0 and where[j][1] >= start - 2.0
    counts = [owner.count(u) for u in range(len(per_utterance))]
    good = sum(hit / n >= 0.8 for hit, n in zip(per_utterance, counts))
    assert good >= 0.8 * len(counts), [round(h / n, 2) for h, n in zip(per_utterance, counts)]
    assert on_time >= 0.9 * len(pairs)  # the words sit in segments timed over their clip


def test_subtitles_of_the_long_file(longform):
    segs = longform["record"]["segments"]
    srt = (longform["out"] / "long.srt").read_text(encoding="utf-8")
    stamps = [tuple(map(int, m)) for m in SRT_LINE.findall(srt)]
    assert len(stamps) == len(segs)
    millis = [(((h * 60 + m) * 60 + s) * 1000 + ms, ((h2 * 60 + m2) * 60 + s2) * 1000 + ms2)
              for h, m, s, ms, h2, m2, s2, ms2 in stamps]
    assert millis == [(round(s["start"] * 1000), round(s["end"] * 1000)) for s in segs]
    assert millis[-1][0] >= 100_000  # past 00:01:40
    assert (longform["out"] / "long.vtt").read_text(encoding="utf-8").count(" --> ") == len(segs)
