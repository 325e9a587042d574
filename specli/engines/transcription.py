"""Long-form transcription of one audio stream: sequential 30-second windows with seeking.

Audio arrives as a stream of 16 kHz chunks and only the current window is held, so memory stays
flat on hour-long files. Each window is encoded once, decoded by the preset's strategy (plain
greedy or a speculative one; they give identical tokens), split into timed segments by its
timestamp tokens, and the seek moves to the last closed timestamp.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from specli.audio import HOP_LENGTH, N_FRAMES, N_SAMPLES, SAMPLE_RATE, window_features
from specli.engines.greedy import greedy_decode
from specli.engines.language import detect_language
from specli.engines.segments import (compression_ratio, completed_length, find_loop, split_window,
                                     trim_repetition)
from specli.engines.targets.loader import WhisperModel
from specli.engines.targets.whisper_rules import WhisperLogitRules
from specli.engines.types import DecodeResult, accumulate

Decoder = Callable[..., DecodeResult]  # same signature as greedy_decode


@dataclass(frozen=True)
class TranscribeOptions:
    """How to transcribe; validated at construction."""

    task: Literal["transcribe", "translate"] = "transcribe"  # translate = Whisper's X -> English
    language: str | None = None  # language code; None detects it on the first window
    timestamps: bool = True  # segment timestamps from timestamp tokens
    condition_on_previous_text: bool = True  # prompt each window with the previous window's text
    no_speech_threshold: float = 0.6  # skip a window whose <|nospeech|> prob is above this ...
    logprob_threshold: float = -1.0  # ... and whose average log-probability is below this
    max_new_tokens: int = 224  # tokens decoded per window at most (Whisper's sample_len)
    repetition_guard: bool = True  # cut hallucination loops (a block repeated 4 times in a row)

    def __post_init__(self) -> None:
        if self.task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', not {self.task!r}")
        if not 1 <= self.max_new_tokens <= 224:
            raise ValueError("max_new_tokens must be within 1..224")


@dataclass(frozen=True)
class Segment:
    """A timed piece of text."""

    start: float  # seconds from the start of the file
    end: float  # seconds from the start of the file
    text: str
    tokens: tuple[int, ...]  # text tokens
    avg_logprob: float  # of the window it came from
    no_speech_prob: float  # of the window it came from
    compression_ratio: float  # of the window's text


@dataclass
class FileStats:
    """Time and work spent on one file."""

    audio_seconds: float = 0.0
    windows: int = 0
    tokens: int = 0
    target_forwards: int = 0
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0
    skipped_windows: int = 0  # windows dropped by the no-speech check
    trimmed_windows: int = 0  # windows cut by the repetition guard
    draft_seconds: float = 0.0  # decode time in the drafter (speculative presets)
    verify_seconds: float = 0.0  # decode time in target forwards + verification (speculative presets)
    verify_steps: int = 0  # target forwards that verified a draft
    drafted: int = 0  # draft tokens (tree nodes) proposed
    accepted: int = 0  # draft tokens accepted
    position_attempts: list[int] = field(default_factory=list)  # verify steps whose draft reached depth d+1
    position_accepts: list[int] = field(default_factory=list)  # ... and of those, accepted at depth d+1


@dataclass(frozen=True)
class FileResult:
    """Transcript of one file."""

    language: str | None  # code used for decoding (detected or given)
    language_probability: float | None  # detection probability, None when given
    segments: list[Segment]
    stats: FileStats = field(default_factory=FileStats)

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments).strip()


class _WindowReader:
    """Serves ``[start, start + length)`` sample ranges of a chunk stream, moving forward only."""

    def __init__(self, chunks: Iterable[np.ndarray]) -> None:
        self._chunks = iter(chunks)
        self._buf = np.zeros(0, dtype=np.float32)
        self._offset = 0  # sample index of _buf[0]
        self.total: int | None = None  # known once the stream is exhausted

    def window(self, start: int, length: int) -> np.ndarray:
        self._buf = self._buf[max(0, start - self._offset) :]
        self._offset = max(self._offset, start)
        while self.total is None and self._offset + len(self._buf) < start + length:
            chunk = next(self._chunks, None)
            if chunk is None:
                self.total = self._offset + len(self._buf)
            else:
                self._buf = np.concatenate([self._buf, chunk.astype(np.float32, copy=False)])
        return self._buf[: length]


def _prompt(model: WhisperModel, opts: TranscribeOptions, language: str | None, previous: list[int]) -> list[int]:
    sot_seq = model.special.prompt(language, opts.task, opts.timestamps)
    if opts.condition_on_previous_text and previous:
        return [model.special.sot_prev, *previous[-(223 - len(sot_seq)) :], *sot_seq]
    return sot_seq


def transcribe_stream(
    model: WhisperModel,
    chunks: Iterable[np.ndarray],
    opts: TranscribeOptions = TranscribeOptions(),
    decode: Decoder = greedy_decode,
    on_window: Callable[[float], None] | None = None,
) -> FileResult:
    """Transcribe 16 kHz mono chunks; ``on_window(seconds_done)`` reports progress."""
    sp, target = model.special, model.target
    rules = WhisperLogitRules.for_model(sp, timestamps=opts.timestamps)
    reader, stats = _WindowReader(chunks), FileStats()
    language, lang_prob = opts.language, None
    if not sp.multilingual:
        language = language or "en"
    segments: list[Segment] = []
    previous: list[int] = []
    seek = 0  # in mel frames
    while True:
        audio = reader.window(seek * HOP_LENGTH, N_SAMPLES)
        window_frames = min(N_FRAMES, len(audio) // HOP_LENGTH)
        if window_frames == 0:
            break
        t0 = time.perf_counter()
        mel = window_features(audio, model.target.dims.n_mels)
        state = target.start(target.encode(mel), features=mel)
        stats.encode_seconds += time.perf_counter() - t0
        stats.windows += 1
        if sp.multilingual and language is None:
            probs = detect_language(target, state, sp)
            language, lang_prob = next(iter(probs.items()))
        prompt = _prompt(model, opts, language, previous)
        max_new = min(opts.max_new_tokens, target.dims.text_ctx - len(prompt))
        res = decode(target, state, prompt, rules, sp.eot, max_new, sp.no_speech, prompt.index(sp.sot))
        accumulate(stats, res.stats)
        window_segs, advance, keep = _window_segments(model, opts, res, seek, window_frames, stats)
        segments += window_segs
        previous = previous + keep if keep else []
        seek += advance
        if on_window is not None:
            on_window(seek * HOP_LENGTH / SAMPLE_RATE)
    stats.audio_seconds = (reader.total or seek * HOP_LENGTH) / SAMPLE_RATE
    return FileResult(language, lang_prob, segments, stats)


def _window_segments(
    model: WhisperModel, opts: TranscribeOptions, res: DecodeResult, seek: int, window_frames: int, stats: FileStats
) -> tuple[list[Segment], int, list[int]]:
    """Segments of one window, the seek advance, and the tokens to condition the next window on."""
    sp, tok = model.special, model.tokenizer
    avg_logprob = res.sum_logprob / (len(res.tokens) + 1)
    if res.no_speech_prob > opts.no_speech_threshold and avg_logprob < opts.logprob_threshold:
        stats.skipped_windows += 1
        return [], window_frames, []
    tokens, trimmed = (trim_repetition(res.tokens, timestamp_begin=sp.timestamp_begin)
                       if opts.repetition_guard else (res.tokens, False))
    stats.trimmed_windows += int(trimmed)
    raw, advance = split_window(tokens, sp.timestamp_begin, window_frames)
    if trimmed:  # resume right after the kept copy of the loop
        end = round(raw[-1].end * 100) if raw else 0
        advance = end if 0 < end < window_frames else window_frames
        if find_loop([t for t in res.tokens if t < sp.timestamp_begin])[0] == 0:
            raw = []  # the window is nothing but a loop: a hallucination, dropped
    offset = seek * HOP_LENGTH / SAMPLE_RATE
    ratio = compression_ratio(tok.decode(tokens))
    segs = [
        Segment(offset + r.start, offset + r.end, tok.decode(list(r.tokens)), r.tokens, avg_logprob,
                res.no_speech_prob, ratio)
        for r in raw
    ]
    keep = [] if trimmed else tokens[: completed_length(tokens, sp.timestamp_begin)]
    return [s for s in segs if s.text.strip()], advance, keep
