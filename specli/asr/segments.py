"""Turn one window's decoded tokens into timed segments and the next seek position.

Pure functions over token lists, following openai/whisper's sequential long-form rules:
consecutive timestamp tokens close a segment; a window that ends in a lone timestamp was fully
transcribed (seek moves by the whole window), otherwise decoding resumes at the last closed
timestamp.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

TIME_PRECISION = 0.02  # seconds per timestamp token step
FRAMES_PER_TIMESTAMP = 2  # mel frames per timestamp step (encoder stride 2)


@dataclass(frozen=True)
class RawSegment:
    """A segment inside one window; times are relative to the window start."""

    start: float  # seconds
    end: float  # seconds
    tokens: tuple[int, ...]  # text tokens (timestamps dropped)


def split_window(
    tokens: list[int], timestamp_begin: int, window_frames: int
) -> tuple[list[RawSegment], int]:
    """Segments of one window and how many mel frames the seek advances.

    ``window_frames`` is the number of real (unpadded) mel frames in the window.
    """
    tb = timestamp_begin
    is_ts = [t >= tb for t in tokens]
    window_seconds = window_frames / 100.0
    consecutive = [i for i in range(1, len(tokens)) if is_ts[i] and is_ts[i - 1]]
    single_ending = len(tokens) >= 2 and not is_ts[-2] and is_ts[-1]
    if not consecutive:
        stamps = [t for t in tokens if t >= tb]
        end = (stamps[-1] - tb) * TIME_PRECISION if stamps and stamps[-1] != tb else window_seconds
        text = tuple(t for t in tokens if t < tb)
        segs = [RawSegment(0.0, min(end, window_seconds), text)] if text else []
        return segs, window_frames
    cuts = consecutive + ([len(tokens)] if single_ending else [])
    segs, last = [], 0
    for cut in cuts:
        piece = tokens[last:cut]
        text = tuple(t for t in piece if t < tb)
        if text:
            start = (piece[0] - tb) * TIME_PRECISION if piece[0] >= tb else 0.0
            end = (piece[-1] - tb) * TIME_PRECISION if piece[-1] >= tb else window_seconds
            segs.append(RawSegment(min(start, window_seconds), min(end, window_seconds), text))
        last = cut
    if single_ending:
        return segs, window_frames
    advance = (tokens[last - 1] - tb) * FRAMES_PER_TIMESTAMP
    return segs, max(1, min(advance, window_frames))


def completed_length(tokens: list[int], timestamp_begin: int) -> int:
    """How many leading tokens belong to closed segments (the rest is re-decoded after the seek)."""
    is_ts = [t >= timestamp_begin for t in tokens]
    consecutive = [i for i in range(1, len(tokens)) if is_ts[i] and is_ts[i - 1]]
    single_ending = len(tokens) >= 2 and not is_ts[-2] and is_ts[-1]
    return len(tokens) if single_ending or not consecutive else consecutive[-1]


def compression_ratio(text: str) -> float:
    """Bytes of the text over bytes of its zlib compression (Whisper's loop detector)."""
    data = text.encode("utf-8")
    return len(data) / max(1, len(zlib.compress(data))) if data else 0.0


#: First id past Whisper's text vocabularies (50257 text tokens multilingual; English eot is 50256).
#: A decoded window holds only text and timestamp tokens, so ids at or above this are timestamps.
WHISPER_TEXT_VOCAB = 50257


def trim_repetition(
    tokens: list[int], max_period: int = 32, min_repeats: int = 4, timestamp_begin: int = WHISPER_TEXT_VOCAB
) -> tuple[list[int], bool]:
    """Cut a hallucination loop: keep one copy of a block repeated ``min_repeats`` times in a row.

    Blocks are compared on text tokens only (ids below ``timestamp_begin``), so a sentence looped
    as successive segments with different timestamps counts as repeated. Blocks of a single
    token must repeat ``2 * min_repeats`` times (e.g. runs of dashes). What is kept ends with one
    copy of the block and, when the loop runs over segments, the timestamp that closes it.
    Returns the tokens and whether anything was cut.
    """
    where = [i for i, t in enumerate(tokens) if t < timestamp_begin]  # positions of text tokens
    loop = find_loop([tokens[i] for i in where], max_period, min_repeats)
    if loop is None:
        return tokens, False
    i, p = loop
    return tokens[: _copy_end(tokens, where, i, p, timestamp_begin)], True


def find_loop(text: list[int], max_period: int = 32, min_repeats: int = 4) -> tuple[int, int] | None:
    """``(start, period)`` of the earliest block repeated ``min_repeats`` times in a row, or None."""
    n = len(text)
    for i in range(n):
        for p in range(1, min(max_period, (n - i) // min_repeats) + 1):
            need = 2 * min_repeats if p == 1 else min_repeats
            if i + need * p > n:
                continue
            block = text[i : i + p]
            if all(text[i + r * p : i + (r + 1) * p] == block for r in range(1, need)):
                return i, p
    return None


def _copy_end(tokens: list[int], where: list[int], i: int, p: int, timestamp_begin: int) -> int:
    """Index just past one copy of the loop found at text index ``i`` with period ``p``.

    The earliest match may start mid-segment (e.g. at the full stop before a looped sentence);
    the copy is then moved forward by fewer than ``p`` tokens, still one whole period, to end
    where the loop's segments end: at a timestamp, which is kept to close the segment.
    """
    for e in range(i + p, i + 2 * p):
        if where[e] - where[e - 1] > 1:  # timestamps between text tokens e - 1 and e
            return where[e - 1] + 2
    end = where[i + p - 1] + 1
    return end + 1 if end < len(tokens) and tokens[end] >= timestamp_begin else end


def word_seek(tokens: list[int], timestamp_begin: int, seek: int, advance: int, end: float | None) -> int:
    """The seek advance (mel frames) once words are known: unless the window ended on a single
    timestamp, decoding resumes where the last word ends (openai-whisper's rule).

    ``tokens`` are the window's decoded tokens, ``seek`` its start and ``advance`` the advance
    the timestamps gave, both in mel frames; ``end`` is :attr:`specli.models.speech.WindowWords.last_word_end`.
    """
    single_ending = len(tokens) >= 2 and tokens[-2] < timestamp_begin <= tokens[-1]
    if single_ending or end is None or end <= seek / 100:
        return advance
    return max(1, round(end * 100) - seek)
