"""Transcript writers (txt, json, jsonl, srt, vtt, tsv).

Every format is a pure function ``FileResult -> str`` (srt and vtt also take :class:`SubtitleOptions`:
when segments carry word timings, cues are built from the words as openai-whisper's subtitle writers
do, with line width / line count limits and highlighted words); :func:`specli.io.atomic.write_atomic` puts
the text in place through a temporary file and a rename, so an interrupted run never leaves a partial output.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from specli.asr.windows import FileResult, Segment

FORMATS = ("txt", "json", "srt", "vtt", "tsv")


@dataclass(frozen=True)
class SubtitleOptions:
    """How srt / vtt lay out cues from word timings (as openai-whisper's subtitle options)."""

    max_line_width: int | None = None  # characters in a line before it breaks (None: no limit)
    max_line_count: int | None = None  # lines in a cue before a new cue starts (with max_line_width)
    highlight_words: bool = False  # one cue per spoken word with that word underlined (<u>...</u>)

    def __post_init__(self) -> None:
        for name in ("max_line_width", "max_line_count"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, not {value}")

    @property
    def needs_words(self) -> bool:
        """Whether any option only works with word timings."""
        return self.max_line_width is not None or self.max_line_count is not None or self.highlight_words


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


def to_srt(result: FileResult, options: SubtitleOptions = SubtitleOptions()) -> str:
    if _has_words(result):
        cues = _word_cues(result, options, lambda w: w.replace("-->", "->"))
    else:
        cues = [(s.start, s.end, s.text) for s in result.segments]
    return "\n".join(
        f"{i}\n{_clock(start, ',')} --> {_clock(end, ',')}\n{_srt_text(text)}\n"
        for i, (start, end, text) in enumerate(cues, 1)
    )


def _vtt_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_vtt(result: FileResult, options: SubtitleOptions = SubtitleOptions()) -> str:
    if _has_words(result):
        cues = [(a, b, _cue_text(t)) for a, b, t in _word_cues(result, options, _vtt_escape)]
    else:
        cues = [(s.start, s.end, _vtt_escape(_cue_text(s.text))) for s in result.segments]
    return "WEBVTT\n\n" + "\n".join(f"{_clock(a, '.')} --> {_clock(b, '.')}\n{t}\n" for a, b, t in cues)


# --------------------------------------------------------------------------- cues from word timings


@dataclass(frozen=True)
class _CueWord:
    start: float
    end: float
    text: str  # as written in the cue: first word of a line stripped, "\n" before a broken line


def _has_words(result: FileResult) -> bool:
    return any(s.words for s in result.segments)


def _cue_groups(result: FileResult, options: SubtitleOptions) -> Iterator[list[_CueWord]]:
    """Words grouped into cues, lines broken by width, as openai-whisper's ``iterate_result``.

    Without both a line width and a line count, every segment starts a new cue; with both, cues
    run across segments and break after ``max_line_count`` lines or a pause over 3 seconds.
    """
    preserve_segments = options.max_line_count is None or options.max_line_width is None
    width = options.max_line_width or 1000
    line_len, line_count, cue = 0, 1, []
    words = [w for s in result.segments for w in s.words]
    last = words[0].start if words else 0.0
    for seg in result.segments:
        for i, w in enumerate(seg.words):
            long_pause = not preserve_segments and w.start - last > 3.0
            has_room = line_len + len(w.word) <= width
            seg_break = i == 0 and bool(cue) and preserve_segments
            text = w.word
            if line_len > 0 and has_room and not long_pause and not seg_break:
                line_len += len(text)  # the line goes on
            else:
                text = text.strip()
                if (cue and options.max_line_count is not None
                        and (long_pause or line_count >= options.max_line_count)) or seg_break:
                    yield cue  # a new cue
                    cue, line_count = [], 1
                elif line_len > 0:
                    line_count += 1  # a new line
                    text = "\n" + text
                line_len = len(text.strip())
            cue.append(_CueWord(w.start, w.end, text))
            last = w.start
    if cue:
        yield cue


def _word_cues(result: FileResult, options: SubtitleOptions, escape: Callable[[str], str]
               ) -> list[tuple[float, float, str]]:
    """``(start, end, text)`` cues from word timings; with ``highlight_words``, one cue per word
    (and one for each gap between words) with the spoken word underlined."""
    cues: list[tuple[float, float, str]] = []
    for group in _cue_groups(result, options):
        texts = [escape(w.text) for w in group]
        if not options.highlight_words:
            cues.append((group[0].start, group[-1].end, "".join(texts)))
            continue
        last = group[0].start
        for i, w in enumerate(group):
            if _ms(last) != _ms(w.start):
                cues.append((last, w.start, "".join(texts)))
            marked = [re.sub(r"^(\s*)(.*)$", r"\1<u>\2</u>", t) if j == i else t for j, t in enumerate(texts)]
            cues.append((w.start, w.end, "".join(marked)))
            last = w.end
    return cues


def to_tsv(result: FileResult) -> str:
    """Tab-separated start and end in integer milliseconds, then text (tabs/newlines as spaces)."""
    rows = ["start\tend\ttext"]
    for s in result.segments:
        text = " ".join(s.text.split())
        rows.append(f"{_ms(s.start)}\t{_ms(s.end)}\t{text}")
    return "\n".join(rows) + "\n"


def _segment_dict(s: Segment, with_words: bool = False) -> dict:
    words = {"words": [_word_dict(w) for w in s.words]} if with_words else {}
    return {
        "start": round(s.start, 3),
        "end": round(s.end, 3),
        "text": s.text,
        "tokens": list(s.tokens),
        "avg_logprob": s.avg_logprob,
        "no_speech_prob": s.no_speech_prob,
        "compression_ratio": s.compression_ratio,
        "temperature": s.temperature,
        **words,
    }


def _word_dict(w) -> dict:
    return {"start": round(w.start, 3), "end": round(w.end, 3), "word": w.word, "probability": w.probability}


def finite(value):
    """``value`` (plain JSON data) with every NaN / infinite number as None (null): JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def json_line(record: dict) -> str:
    """One record as strict JSON on one line (what ``--jsonl -`` prints)."""
    return json.dumps(finite(record), ensure_ascii=False, allow_nan=False)


def result_record(result: FileResult, source: str) -> dict:
    """The JSON record of one file (json output and one jsonl line); strict JSON (:func:`finite`)."""
    st, dec = result.stats, result.stats.decode
    return finite({
        "source": source,
        "language": result.language,
        "language_probability": result.language_probability,
        "duration": round(st.audio_seconds, 3),
        "text": result.text,
        "segments": [_segment_dict(s, _has_words(result)) for s in result.segments],
        "stats": {
            "windows": st.windows,
            "tokens": dec.tokens,
            "target_forwards": dec.target_forwards,
            "encode_seconds": round(st.encode_seconds, 4),
            "decode_seconds": round(dec.decode_seconds, 4),
            "skipped_windows": st.skipped_windows,
            "trimmed_windows": st.trimmed_windows,
            "fallback_windows": st.fallback_windows,
            "verify_steps": dec.verify_steps,
            "drafted": dec.drafted,
            "accepted": dec.accepted,
        },
    })


def to_json(result: FileResult, source: str = "") -> str:
    return json.dumps(result_record(result, source), ensure_ascii=False, indent=2, allow_nan=False) + "\n"


WRITERS: dict[str, Callable[..., str]] = {  # FileResult (srt, vtt: and SubtitleOptions) -> text
    "txt": to_txt,
    "json": to_json,
    "srt": to_srt,
    "vtt": to_vtt,
    "tsv": to_tsv,
}
