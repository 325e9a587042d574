"""Opt-in batched long-form transcription (preset ``longform = "batched"``): faster-whisper's
``BatchedInferencePipeline`` semantics on the batched scheduler.

Silero VAD (:mod:`specli.asr.vad`) finds a file's speech with faster-whisper batched's settings (speech pieces of at
most 30 s; 160 ms of silence ends one; ``--vad`` settings, when given, with pieces still capped at 30 s). Consecutive
pieces are packed, the silence between them dropped, into chunks of at most 30 s of speech (faster-whisper's
``collect_chunks``). Each chunk is one window decoded once, independently of the others: every chunk is one job of
the batched scheduler (:mod:`specli.asr.scheduler`), so up to ``batch_size`` chunks are encoded in one encoder call
and decoded as rows of one batch decoder. With word timestamps, each chunk's segments are aligned on that chunk's
own window (:func:`specli.asr.windows.window_words`, the sequential path's cross-attention alignment) in
speech-only time; segment and word times are then mapped back to the file together through the VAD's
:class:`~specli.asr.vad.TimeMap` (:func:`~specli.asr.vad.remap_segment`), so a word after a removed silence lands
after it.

How its output differs from sequential long-form (:mod:`specli.asr.windows`), as faster-whisper's batched pipeline:

- no previous-text conditioning: every chunk is prompted only with ``initial_prompt`` and ``hotwords``;
- chunk boundaries come from VAD, not from timestamp seeking; what VAD does not call speech is never decoded;
- one decode per chunk, at the first temperature: no temperature fallback, no compression-ratio or log-probability
  test, no no-speech skip (a chunk's text is always kept);
- the language, when not given, is detected once, on the first chunk;
- timestamps: with timestamp tokens (specli's default) a chunk is split at them, and text after its last closed
  timestamp ends at the chunk's end (faster-whisper drops it); without them (faster-whisper batched's default) a
  chunk is one segment spanning it;
- specli's repetition guard (a hallucination loop cut) still applies; beam search at temperature 0 runs chunk by
  chunk (the scheduler runs attempts that are not plain greedy alone);
- word timestamps: each chunk is aligned on its own, its long-first-word clip measuring the pause from the chunk's
  start (faster-whisper carries where speech last ended from chunk to chunk), so batch-N equals batch-1.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from specli.asr.fallback import AR, DecodeMethod, drive, fallback_steps
from specli.asr.scheduler import FileJob, run_jobs
from specli.asr.segments import FRAMES_PER_TIMESTAMP, split_window
from specli.asr.vad import (SileroVad, Span, TimeMap, VadOptions, collect_speech, load_vad, read_all,
                            remap_segment, speech_timestamps)
from specli.asr.windows import (FileResult, FileStats, FileSteps, TranscribeOptions, Window,
                                attempts_of, check_word_timestamps, encode_text, encode_window, window_prompt,
                                file_generator, guarded_tokens, serve_one, timed_segments, window_words)
from specli.core.types import accumulate
from specli.io.audio import SAMPLE_RATE
from specli.models.speech import SpeechModel

CHUNK_SECONDS = 30.0  # most speech in one chunk: Whisper's window (faster-whisper's chunk_length)
# faster-whisper batched's VAD: speech pieces of at most one chunk, 160 ms of silence ends one (else VadOptions')
BATCHED_VAD = VadOptions(max_speech_duration_s=CHUNK_SECONDS, min_silence_duration_ms=160)

#: A file for :func:`transcribe_longform`: its key and what reads its 16 kHz audio (called when its turn comes);
#: None: nothing to do, its result is None.
LongFile = tuple[Hashable, Callable[[], Iterable[np.ndarray]] | None]


def batched_vad(vad: VadOptions | None) -> VadOptions:
    """The VAD settings of a batched long-form run: faster-whisper batched's, or ``vad`` with speech pieces capped
    at one chunk (as faster-whisper caps its ``vad_parameters``)."""
    return BATCHED_VAD if vad is None else replace(vad, max_speech_duration_s=CHUNK_SECONDS)


def pack_spans(spans: Sequence[Span], max_samples: int) -> list[list[Span]]:
    """Consecutive speech spans packed greedily into groups of at most ``max_samples`` samples of speech in all
    (faster-whisper's ``collect_chunks``): a span that would overflow the current group starts the next."""
    groups: list[list[Span]] = []
    total = 0
    for start, end in spans:
        if not groups or total + end - start > max_samples:
            groups.append([])
            total = 0
        groups[-1].append((start, end))
        total += end - start
    return groups


@dataclass(frozen=True)
class SpeechChunk:
    """One chunk of a file's speech: what one batch row decodes."""

    offset: float  # where the chunk starts in the file's speech-only audio (s; TimeMap's timeline)
    audio: np.ndarray  # [samples] its speech spans concatenated, 16 kHz


def speech_chunks(audio: np.ndarray, vad: VadOptions, vad_model: SileroVad | None = None
                  ) -> tuple[TimeMap, list[SpeechChunk]]:
    """The speech of ``audio`` (16 kHz mono) as chunks of at most :data:`CHUNK_SECONDS`, in order, and the map
    from speech-only time back to file time."""
    spans = speech_timestamps(audio, vad, vad_model or load_vad())
    chunks, offset = [], 0
    for group in pack_spans(spans, round(CHUNK_SECONDS * SAMPLE_RATE)):
        speech = np.concatenate(collect_speech(audio, group))
        chunks.append(SpeechChunk(offset / SAMPLE_RATE, speech))
        offset += speech.size
    return TimeMap(spans), chunks


def chunk_steps(model: SpeechModel, chunk: SpeechChunk, opts: TranscribeOptions, language: str | None,
                decode: DecodeMethod = AR, encoded: tuple[Window, int] | None = None) -> FileSteps:
    """One chunk as a step machine of the scheduler: its window encoded (unless ``encoded`` is given: the window
    and its frames), decoded once at the first temperature, split into segments (with word timestamps: aligned on
    this window, the pause before the first word measured from the chunk's start); times in speech-only time."""
    hooks, dec = model.speech_hooks(), opts.decoding
    stats = FileStats()
    if encoded is None:
        encoded = yield from encode_window(model, hooks, chunk.audio, stats)
    window, frames = encoded
    prompt = window_prompt(opts, language, encode_text(model, dec.initial_prompt), encode_text(model, dec.hotwords),
                            frames, file_generator(dec.seed, window.features.device))
    once = dec.at(dec.temperatures[0])  # the first temperature only: nothing to fall back to
    win = yield from attempts_of(window, fallback_steps(hooks.window_job(prompt), once, model.tokenizer.decode,
                                                         decode))
    accumulate(stats.decode, win.stats)
    tokens, _trimmed = guarded_tokens(model, opts, win, stats)
    tb = hooks.timestamp_begin
    if tokens and tokens[-1] < tb and any(t >= tb for t in tokens):  # text after the last timestamp: kept,
        tokens = [*tokens, tb + frames // FRAMES_PER_TIMESTAMP]  # closed at the chunk's end (no seek re-decodes it)
    raw, _advance = split_window(tokens, tb, frames)
    segments = timed_segments(model, raw, chunk.offset, win)
    if opts.word_timestamps and segments:
        segments = window_words(model, opts, window, segments, language, chunk.offset, frames, chunk.offset).segments
    return FileResult(language, None, segments, stats)


@dataclass
class _File:
    """One file of a run: its chunks' results as they come back."""

    tmap: TimeMap  # speech-only time -> file time
    seconds: float  # the file's duration
    chunk_ends: list[float]  # end of each chunk in speech-only time (progress)
    language: str | None
    language_probability: float | None
    stats: FileStats = field(default_factory=FileStats)  # work outside the chunks (language detection)
    parts: dict[int, FileResult | Exception] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return len(self.parts) == len(self.chunk_ends)

    def result(self) -> FileResult | Exception:
        """The file's result once every chunk is back: the first chunk error, else the chunks' segments in order,
        in file time, and their work summed."""
        parts = [self.parts[i] for i in range(len(self.chunk_ends))]
        failed = next((p for p in parts if isinstance(p, Exception)), None)
        if failed is not None:
            return failed
        stats, segments = self.stats, []
        for part in parts:
            segments += [remap_segment(s, self.tmap) for s in part.segments]
            stats.add(part.stats)
        stats.audio_seconds = self.seconds
        return FileResult(self.language, self.language_probability, segments, stats)


def _plan(model: SpeechModel, audio: np.ndarray, opts: TranscribeOptions, decode: DecodeMethod, vad: VadOptions,
          vad_model: SileroVad | None) -> tuple[_File, list[Callable[[], FileSteps]]]:
    """A file's chunks and the factory of each chunk's step machine; the language detected on the first chunk
    (encoded here, its window reused by that chunk) when ``opts`` gives none."""
    tmap, chunks = speech_chunks(audio, vad, vad_model)
    hooks = model.speech_hooks()
    plan = _File(tmap, audio.size / SAMPLE_RATE, [c.offset + c.audio.size / SAMPLE_RATE for c in chunks],
                 hooks.language(opts.language), None)
    first = None
    if plan.language is None and chunks:
        first = drive(encode_window(model, hooks, chunks[0].audio, plan.stats),
                      lambda request: serve_one(model.target, request))
        probs = hooks.detect_language(first[0].state)
        if probs:
            plan.language, plan.language_probability = next(iter(probs.items()))
    makes = [lambda c=c, e=(first if i == 0 else None): chunk_steps(model, c, opts, plan.language, decode, e)
             for i, c in enumerate(chunks)]
    return plan, makes


def _raise(exc: Exception) -> Callable[[], FileSteps]:
    def fail() -> FileSteps:
        raise exc
    return fail


def transcribe_longform(
    model: SpeechModel,
    files: Iterable[LongFile],
    opts: TranscribeOptions,
    decode: DecodeMethod = AR,
    batch_size: int = 8,
    vad: VadOptions | None = None,
    errors: tuple[type[Exception], ...] = (),
    on_window: Callable[[Hashable, float], None] | None = None,
    vad_model: SileroVad | None = None,
) -> Iterator[tuple[Hashable, FileResult | Exception | None]]:
    """Each file's speech chunks decoded as independent rows, up to ``batch_size`` chunks in flight (at 1: one
    after another, the same text); yields ``(key, result)`` as each file's last chunk comes back. A file raising one
    of ``errors`` (reading it, or in a chunk) gets the exception as its result; ``on_window(key, seconds)`` is told
    the file time up to which its chunks are done. ``vad``: ``--vad`` settings (:func:`batched_vad`)."""
    check_word_timestamps(model, opts)
    vad = batched_vad(vad)
    plans: dict[Hashable, _File] = {}

    def jobs() -> Iterator[FileJob]:
        for key, read in files:
            try:
                plan, makes = (None, []) if read is None else _plan(model, read_all(read()), opts, decode, vad,
                                                                     vad_model)
            except errors as exc:
                yield (key, 0), _raise(exc)
                continue
            if plan is not None:
                plans[key] = plan
            yield from [((key, i), make) for i, make in enumerate(makes)] or [((key, -1), None)]

    for (key, i), result in run_jobs(model, jobs(), batch_size, decode, errors):
        plan = plans.get(key)
        if plan is None:  # skipped (None) or unreadable (its error)
            yield key, result
            continue
        if i >= 0:
            plan.parts[i] = result
            if on_window is not None:
                on_window(key, plan.tmap.to_original(max(plan.chunk_ends[j] for j in plan.parts), is_end=True))
        if plan.done:
            del plans[key]
            yield key, plan.result()


def transcribe_long_audio(model: SpeechModel, chunks: Iterable[np.ndarray], opts: TranscribeOptions,
                          decode: DecodeMethod = AR, batch_size: int = 8, vad: VadOptions | None = None) -> FileResult:
    """One stream of 16 kHz ``chunks`` transcribed by :func:`transcribe_longform` (errors raise)."""
    ((_key, result),) = transcribe_longform(model, [(0, lambda: chunks)], opts, decode, batch_size, vad)
    return result
