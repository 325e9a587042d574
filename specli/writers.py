"""Transcript writers (txt, json, jsonl, srt, vtt, tsv) and atomic file output.

Every format is a pure function ``FileResult -> str``; :func:`write_atomic` puts the text in place
through a temporary file and a rename, so an interrupted run never leaves a partial output.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from specli.engines.transcription import FileResult, Segment

FORMATS = ("txt", "json", "srt", "vtt", "tsv")


def _ms(seconds: float) -> int:
    """Whole milliseconds, rounded to nearest, never negative."""
    return max(0, round(seconds * 1000))


def _clock(seconds: float, sep: str, always_hours: bool = True) -> str:
    ms = _ms(seconds)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    head = f"{h:02d}:" if always_hours or h else ""
    return f"{head}{m:02d}:{s:02d}{sep}{ms:03d}"


def _cue_text(text: str) -> str:
    """Subtitle text: trimmed, no blank lines (a blank line ends a cue)."""
    return "\n".join(line for line in text.strip().splitlines() if line.strip()) or " "


def to_txt(result: FileResult) -> str:
    return "".join(f"{s.text.strip()}\n" for s in result.segments)


def _srt_text(text: str) -> str:
    """SRT has no escapes: an arrow in the text would read as a timing line, so shorten it."""
    return _cue_text(text).replace("-->", "->")


def to_srt(result: FileResult) -> str:
    cues = [
        f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{_srt_text(s.text)}\n"
        for i, s in enumerate(result.segments, 1)
    ]
    return "\n".join(cues)


def _vtt_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_vtt(result: FileResult) -> str:
    cues = [
        f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{_vtt_escape(_cue_text(s.text))}\n"
        for s in result.segments
    ]
    return "WEBVTT\n\n" + "\n".join(cues)


def to_tsv(result: FileResult) -> str:
    """Tab-separated start and end in integer milliseconds, then text (tabs/newlines as spaces)."""
    rows = ["start\tend\ttext"]
    for s in result.segments:
        text = " ".join(s.text.split())
        rows.append(f"{_ms(s.start)}\t{_ms(s.end)}\t{text}")
    return "\n".join(rows) + "\n"


def _segment_dict(s: Segment) -> dict:
    return {
        "start": round(s.start, 3),
        "end": round(s.end, 3),
        "text": s.text,
        "tokens": list(s.tokens),
        "avg_logprob": s.avg_logprob,
        "no_speech_prob": s.no_speech_prob,
        "compression_ratio": s.compression_ratio,
    }


def result_record(result: FileResult, source: str) -> dict:
    """The JSON record of one file (json output and one jsonl line)."""
    st = result.stats
    return {
        "source": source,
        "language": result.language,
        "language_probability": result.language_probability,
        "duration": round(st.audio_seconds, 3),
        "text": result.text,
        "segments": [_segment_dict(s) for s in result.segments],
        "stats": {
            "windows": st.windows,
            "tokens": st.tokens,
            "target_forwards": st.target_forwards,
            "encode_seconds": round(st.encode_seconds, 4),
            "decode_seconds": round(st.decode_seconds, 4),
            "skipped_windows": st.skipped_windows,
            "trimmed_windows": st.trimmed_windows,
            "verify_steps": st.verify_steps,
            "drafted": st.drafted,
            "accepted": st.accepted,
        },
    }


def to_json(result: FileResult, source: str = "") -> str:
    return json.dumps(result_record(result, source), ensure_ascii=False, indent=2) + "\n"


WRITERS: dict[str, Callable[[FileResult], str]] = {
    "txt": to_txt,
    "json": to_json,
    "srt": to_srt,
    "vtt": to_vtt,
    "tsv": to_tsv,
}


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename.

    The temporary file is hidden (``.<name>.<random>.part``) and created with the usual
    permissions (0666 less the umask), so the output gets the mode a plain write would give it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
