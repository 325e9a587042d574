"""Word timestamps: cross-attention alignment of decoded tokens to audio frames, as openai-whisper.

After a window is decoded, its text tokens are run once more through the decoder behind the
plain ``sot [language task] <|notimestamps|>`` prompt (no previous-text prompt). The
cross-attention weights of the model's *alignment heads* (``alignment_heads`` of
``generation_config.json``) over the window's real frames are normalised per frame over tokens,
median-filtered along time (width 7) and averaged over heads; dynamic time warping on the negated
matrix gives a monotonic token -> frame path, and each token starts where the path first enters
its row. Tokens are grouped into words (on spaces, or on unicode boundaries for languages without
spaces), punctuation is merged into neighbouring words, and openai-whisper's heuristics clip
over-long words at sentence and segment boundaries (one deviation: where openai-whisper lets a
clipped first or last word spill past its segment's edge, it is clipped to the segment, so every
word lies inside its segment). Unless the window ended on a single timestamp, the next window
starts where the last word ended (``specli.asr.segments.word_seek``). The decoding strategy plays no part: this
runs on the window's final tokens, so speculative presets and plain greedy give the same words.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from specli.models.speech import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS, WindowWords, Word
from specli.models.whisper.target import DecoderState, WhisperTarget
from specli.models.whisper.tokenizer import WhisperTokenizer

MEDIAN_FILTER_WIDTH = 7  # frames (openai-whisper's medfilt_width)
QK_SCALE = 1.0  # attention-logit scale before the softmax (openai-whisper's qk_scale)
TOKENS_PER_SECOND = 50  # encoder positions per second (HOP_LENGTH 160 at 16 kHz, stride 2)
NO_SPACE_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})  # split words on unicode boundaries
SENTENCE_END_MARKS = ".。!！?？"


@dataclass
class _Timing:
    """A word while its times are being adjusted (window-relative seconds)."""

    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


class _HasTokens(Protocol):
    start: float
    end: float
    tokens: tuple[int, ...]


S = TypeVar("S", bound=_HasTokens)


# --------------------------------------------------------------------------------------- primitives


def median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median of each ``width``-wide window along the last dimension, edges reflect-padded.

    ``width`` must be odd; inputs not longer than ``width // 2`` are returned unchanged.
    """
    if width <= 0 or width % 2 == 0:
        raise ValueError(f"median filter width must be odd and positive, not {width}")
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    flat = x.reshape(-1, 1, x.shape[-1])
    padded = F.pad(flat, (pad, pad), mode="reflect")  # [rows, 1, n + 2 pad]
    med = padded.unfold(-1, width, 1).sort(dim=-1).values[..., pad]  # [rows, 1, n]
    return med.reshape(x.shape)


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Minimum-cost monotonic path through ``cost [N, M]`` from ``(0, 0)`` to ``(N-1, M-1)``.

    Steps are diagonal, down (next row) or right (next column); on ties the order of preference
    is right, then down, then diagonal, as openai-whisper's ``dtw_cpu``. Accumulated costs are
    float32. Returns ``(rows, cols)`` of the path. Computed one anti-diagonal at a time.
    """
    n, m = cost.shape
    x = np.asarray(cost, dtype=np.float64)
    acc = np.full((n + 1, m + 1), np.inf, dtype=np.float32)
    trace = np.full((n + 1, m + 1), -1, dtype=np.int8)
    acc[0, 0] = 0.0
    for d in range(2, n + m + 1):  # cells with i + j == d, 1 <= i <= n, 1 <= j <= m
        i = np.arange(max(1, d - m), min(n, d - 1) + 1)
        j = d - i
        c0, c1, c2 = acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]
        pick0 = (c0 < c1) & (c0 < c2)
        pick1 = ~pick0 & (c1 < c0) & (c1 < c2)
        best = np.where(pick0, c0, np.where(pick1, c1, c2))
        acc[i, j] = (x[i - 1, j - 1] + best).astype(np.float32)
        trace[i, j] = np.where(pick0, 0, np.where(pick1, 1, 2))
    return _backtrace(trace)


def _backtrace(trace: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    trace = trace.copy()
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j = trace.shape[0] - 1, trace.shape[1] - 1
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        step = trace[i, j]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        else:
            j -= 1
    arr = np.array(path[::-1], dtype=np.int64).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def split_to_word_tokens(decode, tokens: list[int], eot: int, language: str | None
                         ) -> tuple[list[str], list[list[int]]]:
    """Group tokens into words: at spaces and punctuation, or at every complete unicode character
    for languages written without spaces. ``decode`` maps token ids to text (ids >= ``eot`` to "")."""
    if language in NO_SPACE_LANGUAGES:
        return _split_on_unicode(decode, tokens)
    words: list[str] = []
    word_tokens: list[list[int]] = []
    for sub, sub_tokens in zip(*_split_on_unicode(decode, tokens)):
        special = sub_tokens[0] >= eot
        if special or sub.startswith(" ") or sub.strip() in string.punctuation or not words:
            words.append(sub)
            word_tokens.append(list(sub_tokens))
        else:
            words[-1] += sub
            word_tokens[-1].extend(sub_tokens)
    return words, word_tokens


def _split_on_unicode(decode, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
    """Pieces that decode to whole unicode characters (a multi-byte character's tokens stay together)."""
    full = decode(tokens)
    words: list[str] = []
    word_tokens: list[list[int]] = []
    current: list[int] = []
    offset = 0
    for token in tokens:
        current.append(token)
        text = decode(current)
        bad = text.find("\ufffd")
        if bad < 0 or (offset + bad < len(full) and full[offset + bad] == "\ufffd"):
            words.append(text)
            word_tokens.append(current)
            current = []
            offset += len(text)
    return words, word_tokens


def merge_punctuations(timings: list[_Timing], prepended: str, appended: str) -> None:
    """Attach opening punctuation to the next word and closing punctuation to the previous one
    (in place; emptied entries keep their place with no text and no tokens)."""
    i, j = len(timings) - 2, len(timings) - 1
    while i >= 0:
        prev, nxt = timings[i], timings[j]
        if prev.word.startswith(" ") and prev.word.strip() in prepended:
            nxt.word, nxt.tokens = prev.word + nxt.word, prev.tokens + nxt.tokens
            prev.word, prev.tokens = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(timings):
        prev, nxt = timings[i], timings[j]
        if not prev.word.endswith(" ") and nxt.word in appended:
            prev.word, prev.tokens = prev.word + nxt.word, prev.tokens + nxt.tokens
            nxt.word, nxt.tokens = "", []
        else:
            i = j
        j += 1


# ---------------------------------------------------------------------------------------- alignment


def find_alignment(
    target: WhisperTarget,
    tokenizer: WhisperTokenizer,
    state: DecoderState,
    text_tokens: list[int],
    language: str | None,
    task: str,
    num_frames: int,
    medfilt_width: int = MEDIAN_FILTER_WIDTH,
    qk_scale: float = QK_SCALE,
) -> list[_Timing]:
    """Word timings (window-relative seconds) of ``text_tokens`` over the window's first ``num_frames``
    mel frames, from the cross-attention of the model's alignment heads and DTW."""
    if not text_tokens or num_frames < 2:  # nothing to align, or no encoder position to align to
        return []
    sp = tokenizer.special
    prompt = sp.prompt(language, task, timestamps=False)  # sot [language task] <|notimestamps|>
    n_sot = len(prompt) - 1
    seq = torch.tensor([[*prompt, *text_tokens, sp.eot]], device=state.audio_features.device)  # [1, n]
    out = target.cross_attention_weights(state, seq, target.alignment_heads, num_frames // 2, qk_scale)
    probs = out.logits[0, n_sot:, : sp.eot].softmax(dim=-1)  # [n - n_sot, eot]
    rows = torch.arange(len(text_tokens), device=probs.device)
    cols = torch.tensor(text_tokens, device=probs.device)
    token_probs = probs[rows, cols].tolist()
    weights = out.weights[0]  # [heads, n, frames]
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, correction=0)
    weights = median_filter((weights - mean) / std, medfilt_width)
    matrix = weights.mean(dim=0)[n_sot:-1]  # [1 + len(text_tokens), frames]
    text_idx, time_idx = dtw(-matrix.double().cpu().numpy())

    words, word_tokens = split_to_word_tokens(tokenizer.decode, [*text_tokens, sp.eot], sp.eot, language)
    if len(word_tokens) <= 1:
        return []
    bounds = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_idx), (1, 0), constant_values=1).astype(bool)
    jump_times = time_idx[jumps] / TOKENS_PER_SECOND
    starts, ends = jump_times[bounds[:-1]], jump_times[bounds[1:]]
    return [
        _Timing(word, tokens, float(start), float(end), float(np.mean(token_probs[i:j])))
        for word, tokens, start, end, i, j in zip(words, word_tokens, starts, ends, bounds[:-1], bounds[1:])
    ]


def _clip_sentence_boundaries(timings: list[_Timing], max_duration: float) -> None:
    """Words at sentence ends are no longer than ``max_duration`` (openai-whisper's heuristic)."""
    for i in range(1, len(timings)):
        if timings[i].end - timings[i].start > max_duration:
            if timings[i].word in SENTENCE_END_MARKS:
                timings[i].end = timings[i].start + max_duration
            elif timings[i - 1].word in SENTENCE_END_MARKS:
                timings[i].start = timings[i].end - max_duration


def _fit_segment(words: list[_Timing], start: float, end: float, last_speech: float, median: float
                 ) -> tuple[float, float]:
    """Clip over-long first words after a pause and reconcile the segment's edges with its words
    (in place on ``words``; absolute seconds). Returns the segment's new ``(start, end)``."""
    max_duration = median * 2
    first = words[0]
    if first.end - last_speech > median * 4 and (
        first.end - first.start > max_duration
        or (len(words) > 1 and words[1].end - first.start > max_duration * 2)
    ):
        if len(words) > 1 and words[1].end - words[1].start > max_duration:
            boundary = max(words[1].end / 2, words[1].end - max_duration)
            first.end = words[1].start = boundary
        first.start = max(0.0, first.end - max_duration)
    # prefer the segment's edges over a long first / last word. openai-whisper keeps such a word at
    # least ``median`` long even past the segment's edge (start min(end - median, segment start),
    # end max(start + median, segment end)); here it is clipped to the segment instead
    if start < first.end and start - 0.5 > first.start:
        first.start = start
    else:
        start = first.start
    last = words[-1]
    if end > last.start and end + 0.5 < last.end:
        last.end = end
    else:
        end = last.end
    return start, end


def add_word_timestamps(
    target: WhisperTarget,
    tokenizer: WhisperTokenizer,
    state: DecoderState,
    segments: Sequence[S],
    *,
    language: str | None,
    task: str,
    time_offset: float,
    num_frames: int,
    last_speech: float,
    prepend_punctuations: str = PREPEND_PUNCTUATIONS,
    append_punctuations: str = APPEND_PUNCTUATIONS,
) -> WindowWords:
    """Words of one window's segments (absolute times, rounded to 10 ms) and segment edges moved to
    them, as openai-whisper's ``add_word_timestamps``. ``time_offset`` is the window start in seconds,
    ``num_frames`` its real mel frames, ``last_speech`` where speech last ended before it."""
    if not segments:
        return WindowWords([], last_speech)
    eot = tokenizer.special.eot
    per_segment = [[t for t in s.tokens if t < eot] for s in segments]
    timings = find_alignment(target, tokenizer, state, [t for toks in per_segment for t in toks], language, task, num_frames)
    durations = np.array([t.end - t.start for t in timings])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    if len(durations):
        _clip_sentence_boundaries(timings, median * 2)
    merge_punctuations(timings, prepend_punctuations, append_punctuations)
    out, k = [], 0
    for seg, tokens in zip(segments, per_segment):
        saved, words = 0, []
        while k < len(timings) and saved < len(tokens):
            t = timings[k]
            if t.word:
                words.append(_Timing(t.word, t.tokens, round(time_offset + t.start, 2),
                                     round(time_offset + t.end, 2), t.probability))
            saved += len(t.tokens)
            k += 1
        start, end = seg.start, seg.end
        if words:
            start, end = _fit_segment(words, start, end, last_speech, median)
            last_speech = end
        frozen = tuple(Word(w.start, w.end, w.word, w.probability) for w in words)
        out.append(dataclasses.replace(seg, start=start, end=end, words=frozen))
    end = last_end(out)
    # a segment squeezed to an instant carries nothing (openai-whisper clears such segments)
    return WindowWords([s for s in out if s.start != s.end], last_speech if end is None else end, end)


def last_end(segments: Sequence) -> float | None:
    """End of the last word of the segments, else the last segment's end (None without segments)."""
    for seg in reversed(segments):
        if seg.words:
            return seg.words[-1].end
    return segments[-1].end if segments else None

