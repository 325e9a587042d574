"""Transcript writers round-trip through small parsers; atomic writes never leave partial files."""

from __future__ import annotations

import html
import json
import os
import re
import stat

import pytest

from specli.asr.windows import FileResult, FileStats, Segment
from specli.core.types import DecodeStats
from specli.asr.writers import FORMATS, WRITERS, result_record, to_json, to_srt, to_tsv, to_txt, to_vtt
from specli.io.atomic import write_atomic

SRT_TIME = re.compile(r"^(\d{2,}):([0-5]\d):([0-5]\d),(\d{3})$")
VTT_TIME = re.compile(r"^(\d{2,}):([0-5]\d):([0-5]\d)\.(\d{3})$")


def seg(start: float, end: float, text: str, tokens: tuple[int, ...] = (1, 2)) -> Segment:
    return Segment(start, end, text, tokens, -0.25, 0.01, 1.1)


def result(*segments: Segment) -> FileResult:
    return FileResult("en", 0.98, list(segments), FileStats(audio_seconds=12.5, windows=1, decode=DecodeStats(tokens=7)))


def _seconds(stamp: str, pattern: re.Pattern) -> float:
    m = pattern.match(stamp)
    assert m, f"bad timestamp {stamp!r}"
    h, mi, s, ms = map(int, m.groups())
    return h * 3600 + mi * 60 + s + ms / 1000


def parse_srt(text: str) -> list[tuple[str, str, str]]:
    """``[(start, end, text)]`` of an SRT document; checks numbering and layout."""
    assert "\r" not in text
    cues = []
    for n, block in enumerate(b for b in text.split("\n\n") if b.strip()):
        lines = block.strip("\n").split("\n")
        assert lines[0] == str(n + 1), block
        start, arrow, end = lines[1].split(" ")
        assert arrow == "-->" and SRT_TIME.match(start) and SRT_TIME.match(end), lines[1]
        assert len(lines) >= 3 and all("-->" not in line for line in lines[2:]), block
        cues.append((start, end, "\n".join(lines[2:])))
    return cues


def parse_vtt(text: str) -> list[tuple[str, str, str]]:
    """``[(start, end, unescaped text)]`` of a WebVTT document."""
    head, _, body = text.partition("\n\n")
    assert head == "WEBVTT"
    cues = []
    for block in (b for b in body.split("\n\n") if b.strip()):
        lines = block.strip("\n").split("\n")
        start, arrow, end = lines[0].split(" ")
        assert arrow == "-->" and VTT_TIME.match(start) and VTT_TIME.match(end), lines[0]
        payload = "\n".join(lines[1:])
        assert "-->" not in payload and "<" not in payload and not re.search(r"&(?!amp;|lt;|gt;)", payload)
        cues.append((start, end, html.unescape(payload)))
    return cues


def parse_tsv(text: str) -> list[tuple[int, int, str]]:
    rows = text.split("\n")
    assert rows[0] == "start\tend\ttext" and rows[-1] == ""
    out = []
    for row in rows[1:-1]:
        start, end, body = row.split("\t")
        out.append((int(start), int(end), body))
    return out


# ------------------------------------------------------------------------------------------ timestamps


@pytest.mark.parametrize(
    "seconds,srt",
    [
        (0.0, "00:00:00,000"),
        (62.345, "00:01:02,345"),
        (3723.5, "01:02:03,500"),
        (1.9996, "00:00:02,000"),  # rounds up across the second
        (59.9996, "00:01:00,000"),  # ... and the minute
        (3599.9996, "01:00:00,000"),  # ... and the hour
        (0.0004, "00:00:00,000"),
        (0.0006, "00:00:00,001"),
        (360_000.0, "100:00:00,000"),  # more than 99 hours
        (3_600_000 + 61.25, "1000:01:01,250"),
        (-0.5, "00:00:00,000"),
    ],
)
def test_timestamps_in_srt_vtt_and_tsv(seconds, srt):
    r = result(seg(seconds, seconds, "x"))
    (start, end, _), = parse_srt(to_srt(r))
    assert start == end == srt
    (vstart, _, _), = parse_vtt(to_vtt(r))
    assert vstart == srt.replace(",", ".")
    (ms, _, _), = parse_tsv(to_tsv(r))
    assert ms == round(_seconds(srt, SRT_TIME) * 1000)


def test_cues_round_trip_times_and_text():
    segs = [seg(0.0, 2.5, " Hello there."), seg(2.5, 62.345, " General Kenobi!"), seg(62.345, 4000.0, " Bye.")]
    r = result(*segs)
    for cues, pattern in ((parse_srt(to_srt(r)), SRT_TIME), (parse_vtt(to_vtt(r)), VTT_TIME)):
        assert [(_seconds(a, pattern), _seconds(b, pattern), t) for a, b, t in cues] == [
            (s.start, s.end, s.text.strip()) for s in segs
        ]
    assert parse_tsv(to_tsv(r)) == [(round(s.start * 1000), round(s.end * 1000), s.text.strip()) for s in segs]
    assert to_txt(r) == "Hello there.\nGeneral Kenobi!\nBye.\n"


# ------------------------------------------------------------------------------------------- escaping

TRICKY = [
    " a < b && c > d",
    " first line\n\n\n  second line \n",  # blank lines would end a cue
    " he said --> and left",  # the cue-timing arrow
    " <i>not a tag</i> &amp; not an entity",
    " 1\n00:00:01,000 --> 00:00:02,000",  # text that looks like a whole SRT cue
    "   ",  # whitespace only
]


def test_vtt_escapes_and_round_trips_text():
    cues = parse_vtt(to_vtt(result(*(seg(i, i + 1, t) for i, t in enumerate(TRICKY)))))
    assert len(cues) == len(TRICKY)
    got = [c[2] for c in cues]
    assert got[0] == "a < b && c > d"
    assert got[1] == "first line\n  second line"
    assert got[2] == "he said --> and left"
    assert got[3] == "<i>not a tag</i> &amp; not an entity"
    assert got[4] == "1\n00:00:01,000 --> 00:00:02,000"
    assert got[5].strip() == ""
    assert "a &lt; b &amp;&amp; c &gt; d" in to_vtt(result(seg(0, 1, TRICKY[0])))


def test_srt_keeps_cue_structure_with_tricky_text():
    cues = parse_srt(to_srt(result(*(seg(i, i + 1, t) for i, t in enumerate(TRICKY)))))
    assert len(cues) == len(TRICKY)
    got = [c[2] for c in cues]
    assert got[0] == "a < b && c > d"  # SRT has no escapes
    assert got[1] == "first line\n  second line"
    assert got[2] == "he said -> and left"
    assert got[4] == "1\n00:00:01,000 -> 00:00:02,000"
    assert [c[0] for c in cues] == [f"00:00:0{i},000" for i in range(len(TRICKY))]


def test_tsv_and_txt_flatten_tabs_and_newlines():
    r = result(seg(0, 1, " a\tb\n\nc  d "), seg(1, 2, " plain"))
    assert parse_tsv(to_tsv(r)) == [(0, 1000, "a b c d"), (1000, 2000, "plain")]
    assert to_txt(r).startswith("a\tb\n\nc  d\n")


def test_empty_result_in_every_format():
    r = result()
    assert to_srt(r) == "" and to_txt(r) == ""
    assert parse_vtt(to_vtt(r)) == [] and parse_tsv(to_tsv(r)) == []
    assert json.loads(to_json(r, "a.wav"))["segments"] == []


# ---------------------------------------------------------------------------------------- unicode, json

UNICODE = " Café déjà vu, 中文字幕, emoji 🎉👍🏽, Ελληνικά"


@pytest.mark.parametrize("fmt", FORMATS)
def test_unicode_survives_a_write_and_read_back(tmp_path, fmt):
    r = result(seg(0.0, 1.5, UNICODE, (9, 8, 7)))
    out = tmp_path / f"u.{fmt}"
    write_atomic(out, to_json(r, "ü.wav") if fmt == "json" else WRITERS[fmt](r))
    assert UNICODE.strip() in out.read_text(encoding="utf-8") or fmt == "json"
    if fmt == "json":
        raw = out.read_text(encoding="utf-8")
        assert "中文字幕" in raw and "🎉" in raw  # not \u-escaped
        assert json.loads(raw)["segments"][0]["text"] == UNICODE


def test_json_parses_back_to_the_same_segments():
    segs = [seg(0.0, 2.48, " One.", (1, 2, 3)), seg(2.48, 61.02, " Twő 中", (4,)), seg(61.02, 61.02, "", ())]
    r = FileResult("fr", 0.875, segs, FileStats(audio_seconds=61.5, windows=3, skipped_windows=1, decode=DecodeStats(tokens=9)))
    data = json.loads(to_json(r, "dir/ä.wav"))
    assert data == result_record(r, "dir/ä.wav")
    assert data["source"] == "dir/ä.wav" and data["language"] == "fr" and data["language_probability"] == 0.875
    assert data["duration"] == 61.5 and data["text"] == r.text
    assert data["stats"]["windows"] == 3 and data["stats"]["skipped_windows"] == 1
    back = [Segment(d["start"], d["end"], d["text"], tuple(d["tokens"]), d["avg_logprob"], d["no_speech_prob"],
                    d["compression_ratio"]) for d in data["segments"]]
    assert back == segs


def test_json_rounds_times_to_milliseconds():
    data = json.loads(to_json(result(seg(1.23456, 1.9996, " x"))))
    assert (data["segments"][0]["start"], data["segments"][0]["end"]) == (1.235, 2.0)


# ---------------------------------------------------------------------------------------- write_atomic


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_write_atomic_creates_dirs_leaves_no_temp_and_has_normal_permissions(tmp_path):
    out = tmp_path / "a" / "b" / "out.txt"
    write_atomic(out, "hello\n")
    write_atomic(out, "again\n")  # replacing works too
    assert out.read_text() == "again\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.txt"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()


def test_write_atomic_keeps_the_old_file_when_the_rename_fails(tmp_path, monkeypatch):
    out = tmp_path / "out.srt"
    out.write_text("old\n")

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("specli.io.atomic.os.replace", boom)
    with pytest.raises(OSError, match="No space"):
        write_atomic(out, "new\n")
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.srt"]


def test_write_atomic_keeps_the_old_file_when_encoding_fails(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(out, "half written \ud800 lone surrogate")
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_write_atomic_does_not_create_a_missing_file_on_failure(tmp_path, monkeypatch):
    monkeypatch.setattr("specli.io.atomic.os.replace", lambda s, d: (_ for _ in ()).throw(OSError("nope")))
    with pytest.raises(OSError):
        write_atomic(tmp_path / "new.json", "{}")
    assert list(tmp_path.iterdir()) == []


def test_write_atomic_names_the_output_not_its_temporary_file(tmp_path):
    out = tmp_path / ("n" * 250 + ".txt")  # fits, but its temporary name is over 255 bytes
    with pytest.raises(OSError) as info:
        write_atomic(out, "x")
    assert info.value.filename == str(out) and info.value.strerror == "File name too long"
    assert os.listdir(tmp_path) == []


def test_stale_temporary_files_are_removed_and_live_ones_kept(tmp_path):
    import fcntl

    from specli.io.atomic import remove_stale_parts

    out = tmp_path / "a.txt"
    stale, other = tmp_path / ".a.txt.0123abcd.part", tmp_path / ".b.txt.0123abcd.part"
    stale.write_text("left by a SIGKILL")
    other.write_text("not asked about")
    live = tmp_path / ".a.txt.89abcdef.part"
    fd = os.open(live, os.O_WRONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as write_atomic holds it while it writes
    try:
        assert remove_stale_parts([out, tmp_path / "missing" / "x.txt"]) == [stale]
        assert not stale.exists() and other.exists() and live.exists()
    finally:
        os.close(fd)
    assert remove_stale_parts([out]) == [live]  # its writer is gone


@pytest.mark.parametrize("call", ["flock", "fstat"])
def test_a_signal_while_the_temporary_file_is_opened_leaves_none_behind(tmp_path, monkeypatch, call):
    """SIGTERM / Ctrl-C raise in whatever line runs: one arriving between the temporary file's creation and its lock
    still removes it (a SIGTERM mid-batch once left a `.part` beside the outputs)."""
    import specli.io.atomic as atomic

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.fcntl if call == "flock" else atomic.os, call, interrupted)
    out = tmp_path / "a.txt"
    with pytest.raises(KeyboardInterrupt):
        write_atomic(out, "text")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
