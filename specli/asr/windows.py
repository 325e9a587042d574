"""Long-form transcription of one audio stream: sequential 30-second windows with seeking.

Audio arrives as a stream of 16 kHz chunks and only the current window is held, so memory stays
flat on hour-long files. Each window is encoded once, decoded with temperature fallback
(:mod:`specli.asr.fallback`) by the preset's method (plain or speculative: identical tokens at
temperature 0, the target's distribution above it), split into timed segments by its timestamp
tokens, and the seek moves to the last closed timestamp.

The loop is a step machine (:func:`transcribe_steps`): it asks for each window's encoder output and
each decode attempt and receives them, so one loop serves a file on its own (:func:`transcribe_stream`)
and many files batched together (:mod:`specli.asr.scheduler`).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field, fields
from typing import Concatenate, Literal, ParamSpec

import numpy as np
import torch

from specli.io.audio import HOP_LENGTH, N_FRAMES, N_SAMPLES, SAMPLE_RATE
from specli.asr.fallback import (AR, Attempt, DecodeMethod, FallbackSteps, WindowDecode, drive,
                                     fallback_steps, run_attempt, should_skip)
from specli.asr.segments import RawSegment, completed_length, find_loop, split_window, trim_repetition, word_seek
from specli.errors import UsageError
from specli.models.speech import (APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS, DecodingOptions, SpeechHooks,
                                  SpeechModel, SpeechTarget, WindowPrompt, WindowWords, Word)
from specli.core.types import DecodeResult, DecodeStats, TargetState, accumulate



@dataclass(frozen=True)
class WindowSpan:
    """Where a decoded window lies in its file: the samples (16 kHz) its features were computed from."""

    start: int  # first sample of the window
    samples: int  # samples read: N_SAMPLES, fewer at the end of the file


#: Called after each window's decode with the window's state, prompt, kept decode and span (distillation
#: records on-policy windows through it).
WindowObserver = Callable[[TargetState, list[int], WindowDecode, WindowSpan], None]

P = ParamSpec("P")
#: Whisper's two tasks: transcribe in the spoken language, or translate (X -> English).
Task = Literal["transcribe", "translate"]


@dataclass(frozen=True)
class TranscribeOptions:
    """How to transcribe; validated at construction."""

    task: Task = "transcribe"  # translate = Whisper's X -> English
    language: str | None = None  # language code; None detects it on the first window
    timestamps: bool = True  # segment timestamps from timestamp tokens
    max_new_tokens: int = 224  # tokens decoded per window at most (Whisper's sample_len)
    repetition_guard: bool = True  # cut hallucination loops (a block repeated 4 times in a row)
    decoding: DecodingOptions = DecodingOptions()  # temperatures, fallback thresholds, beam, prompts, seed
    word_timestamps: bool = False  # word timings from cross-attention alignment (the family's hooks; Whisper: models/whisper/alignment.py)
    prepend_punctuations: str = PREPEND_PUNCTUATIONS  # with word timestamps: merged into the next word
    append_punctuations: str = APPEND_PUNCTUATIONS  # with word timestamps: merged into the previous word
    instruction: str | None = None  # audio-LLM families: the instruction text (None: the model's documented one)

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
    temperature: float = 0.0  # temperature of the window's kept decode (> 0 after a fallback)
    words: tuple[Word, ...] = ()  # word timings, when word timestamps were asked for


@dataclass
class FileStats:
    """Time and work spent on one file."""

    audio_seconds: float = 0.0
    windows: int = 0
    encode_seconds: float = 0.0
    skipped_windows: int = 0  # windows dropped by the no-speech check
    trimmed_windows: int = 0  # windows cut by the repetition guard
    fallback_windows: int = 0  # windows whose greedy decode failed (retried hotter, or skipped as silence)
    decode: DecodeStats = field(default_factory=DecodeStats)  # every decode run, fallbacks included

    def add(self, other: FileStats) -> None:
        """Add the work of ``other`` (a part of this file: every counter and time, its decode stats);
        ``audio_seconds`` stays this file's own."""
        for f in fields(self):
            if f.name == "decode":
                accumulate(self.decode, other.decode)
            elif f.name != "audio_seconds":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


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


class WindowReader:
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


def window_prompt(opts: TranscribeOptions, language: str | None, previous: list[int], hotwords: list[int],
                   frames: int, gen: torch.Generator | None) -> WindowPrompt:
    """What the family builds a window's decode job from."""
    return WindowPrompt(opts.task, language, tuple(previous), tuple(hotwords), opts.timestamps,
                        tuple(opts.decoding.suppress_tokens), opts.max_new_tokens, frames, gen, opts.instruction)


def file_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """The file's random source for sampling: seeded from ``seed``, else from the OS."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


@dataclass(frozen=True)
class EncodeRequest:
    """A file's step machine asks for one window's encoder output; answered with :class:`Encoded`."""

    mel: torch.Tensor  # [1, n_mels, 3000] the window's log-mel
    frames: int = N_FRAMES  # its real (unpadded) frames: an encoder that masks padding reads them


@dataclass(frozen=True)
class Encoded:
    """The answer to an :class:`EncodeRequest`."""

    features: torch.Tensor  # [1, audio_ctx, d_model] encoder output
    seconds: float  # encoder time (this window's share when several windows were encoded together)


class Window:
    """One encoded window. Its decoder state (cross-attention K/V, empty cache) is built on first use,
    so a window decoded only by a batched decoder (which admits ``features``) never builds one."""

    def __init__(self, target: SpeechTarget, features: torch.Tensor, mel: torch.Tensor) -> None:
        self.target = target
        self.features = features  # [1, audio_ctx, d_model]
        self.mel = mel  # [1, n_mels, 3000]
        self._state: TargetState | None = None

    @property
    def state(self) -> TargetState:
        if self._state is None:
            self._state = self.target.start(self.features, features=self.mel)
        return self._state


@dataclass(frozen=True)
class DecodeRequest:
    """A file's step machine asks for one decode attempt of a window; answered with
    ``(DecodeResult, DecodeStats)``."""

    window: Window
    attempt: Attempt


#: A file's long-form loop as a step machine (:func:`transcribe_steps`).
FileSteps = Generator[EncodeRequest | DecodeRequest, Encoded | tuple[DecodeResult, DecodeStats], FileResult]


def serve_one(target: SpeechTarget, request: EncodeRequest | DecodeRequest) -> Encoded | tuple[DecodeResult, DecodeStats]:
    """Answer one request of a file's step machine on its own (batch 1)."""
    if isinstance(request, EncodeRequest):
        t0 = time.perf_counter()
        features = target.encode(request.mel, [request.frames])
        return Encoded(features, time.perf_counter() - t0)
    return run_attempt(target, request.window.state, request.attempt)


def run_file(model: SpeechModel, steps: FileSteps) -> FileResult:
    """Run a file's step machine to its end on its own (batch 1): each request answered by :func:`serve_one`."""
    return drive(steps, lambda request: serve_one(model.target, request))


def run_alone(steps_of: Callable[Concatenate[SpeechModel, P], FileSteps], name: str,
              doc: str) -> Callable[Concatenate[SpeechModel, P], FileResult]:
    """The function ``name`` that runs the file step machine ``steps_of(model, ...)`` builds, on its own
    (batch 1, :func:`run_file`), with the same arguments."""

    def run(model: SpeechModel, *args: P.args, **kwargs: P.kwargs) -> FileResult:
        return run_file(model, steps_of(model, *args, **kwargs))

    run.__name__ = run.__qualname__ = name
    run.__module__, run.__doc__ = steps_of.__module__, doc
    run.__signature__ = inspect.signature(steps_of).replace(return_annotation="FileResult")
    return run


def transcribe_steps(
    model: SpeechModel,
    chunks: Iterable[np.ndarray],
    opts: TranscribeOptions = TranscribeOptions(),
    decode: DecodeMethod = AR,
    on_window: Callable[[float], None] | None = None,
    on_decode: WindowObserver | None = None,
) -> FileSteps:
    """The long-form loop of one file as a step machine: yields :class:`EncodeRequest` and
    :class:`DecodeRequest`, receives their answers, returns the :class:`FileResult`. Whoever answers
    (:func:`serve_one` at batch 1, :mod:`specli.asr.scheduler` over several files), the loop is this one."""
    hooks, dec = model.speech_hooks(), opts.decoding
    check_word_timestamps(model, opts)
    reader, stats = WindowReader(chunks), FileStats()
    language, lang_prob = hooks.language(opts.language), None
    segments: list[Segment] = []
    last_speech = 0.0  # end of the last aligned word (word timestamps)
    previous = encode_text(model, dec.initial_prompt)
    hotwords = encode_text(model, dec.hotwords)
    gen: torch.Generator | None = None
    seek = 0  # in mel frames
    while True:
        audio = reader.window(seek * HOP_LENGTH, N_SAMPLES)
        window_frames = min(N_FRAMES, len(audio) // HOP_LENGTH)
        if window_frames == 0:
            break
        window, frames = yield from encode_window(model, hooks, audio, stats)
        if language is None:
            probs = hooks.detect_language(window.state)
            if probs:
                language, lang_prob = next(iter(probs.items()))
        if gen is None:  # one generator per file, on the target's device
            gen = file_generator(dec.seed, window.features.device)
        job = hooks.window_job(window_prompt(opts, language, previous, hotwords, frames, gen))
        prompt = list(job.prompt)
        win = yield from attempts_of(window, fallback_steps(job, dec, model.tokenizer.decode, decode))
        accumulate(stats.decode, win.stats)
        stats.fallback_windows += int(win.first_failed)
        if on_decode is not None:
            on_decode(window.state, prompt, win, WindowSpan(seek * HOP_LENGTH, len(audio)))
        window_segs, advance, keep = _window_segments(model, opts, win, seek, window_frames, stats)
        if opts.word_timestamps and window_segs:  # on the final tokens: the same for every decode method
            aligned = window_words(model, opts, window, window_segs, language, seek * HOP_LENGTH / SAMPLE_RATE,
                                   window_frames, last_speech)
            window_segs, last_speech = aligned.segments, aligned.last_speech
            advance = word_seek(win.result.tokens, hooks.timestamp_begin, seek, advance, aligned.last_word_end)
        segments += window_segs
        previous = previous + keep if keep else []
        if not dec.condition_on_previous_text or win.temperature > dec.prompt_reset_on_temperature:
            previous = []  # do not prompt with text decoded at a high temperature
        seek += advance
        if on_window is not None:
            on_window(seek * HOP_LENGTH / SAMPLE_RATE)
    stats.audio_seconds = (reader.total or seek * HOP_LENGTH) / SAMPLE_RATE
    return FileResult(language, lang_prob, segments, stats)


transcribe_stream = run_alone(transcribe_steps, "transcribe_stream", """\
Transcribe 16 kHz mono chunks with ``decode`` (plain or speculative); ``on_window(seconds_done)``
reports progress. Runs :func:`transcribe_steps` (same arguments), answering each request on its own.""")


def check_word_timestamps(model: SpeechModel, opts: TranscribeOptions) -> None:
    """Refuse (UsageError) word timestamps from a model without cross-attention alignment."""
    if opts.word_timestamps and not model.speech_hooks().word_timestamps:
        raise UsageError(f"word timestamps need cross-attention alignment, which {type(model).__name__} has not")


def window_words(model: SpeechModel, opts: TranscribeOptions, window: Window, segments: list[Segment],
                 language: str | None, offset: float, frames: int, last_speech: float) -> WindowWords:
    """Word timings of ``segments``, decoded from ``window`` (its first ``frames`` mel frames real) at ``offset``
    seconds, aligned on that window's own encoder output; ``last_speech``: where speech last ended before it."""
    return model.speech_hooks().align_words(
        window.state, segments, language=language, task=opts.task, time_offset=offset, num_frames=frames,
        last_speech=last_speech, prepend_punctuations=opts.prepend_punctuations,
        append_punctuations=opts.append_punctuations)


def encode_window(model: SpeechModel, hooks: SpeechHooks, audio: np.ndarray, stats: FileStats) -> Generator:
    """Steps that encode one window (features here, the encoder by the driver), counted in ``stats``; returns
    the window and its real frames."""
    t0 = time.perf_counter()
    mel, frames = hooks.features(audio)
    mel_seconds = time.perf_counter() - t0
    encoded = yield EncodeRequest(mel, frames)
    stats.encode_seconds += mel_seconds + encoded.seconds
    stats.windows += 1
    return Window(model.target, encoded.features, mel), frames


def attempts_of(window: Window, steps: FallbackSteps) -> Generator:
    """The window's fallback steps, each :class:`Attempt` asked as a :class:`DecodeRequest` on ``window``."""
    reply = None
    try:
        while True:
            reply = yield DecodeRequest(window, steps.send(reply))
    except StopIteration as stop:
        return stop.value


def encode_text(model: SpeechModel, text: str | None) -> list[int]:
    """openai-whisper's prompt text encoding: a leading space, stripped text."""
    return model.tokenizer.encode(" " + text.strip()) if text and text.strip() else []


def _window_segments(
    model: SpeechModel, opts: TranscribeOptions, win: WindowDecode, seek: int, window_frames: int, stats: FileStats
) -> tuple[list[Segment], int, list[int]]:
    """Segments of one window, the seek advance, and the tokens to condition the next window on."""
    sp, res = model.speech_hooks(), win.result
    if should_skip(res.probed, win.avg_logprob, win.first_failed, opts.decoding):
        stats.skipped_windows += 1
        return [], window_frames, []
    tokens, trimmed = guarded_tokens(model, opts, win, stats)
    raw, advance = split_window(tokens, sp.timestamp_begin, window_frames)
    if trimmed:  # resume right after the kept copy of the loop
        end = round(raw[-1].end * 100) if raw else 0
        advance = end if 0 < end < window_frames else window_frames
        if find_loop([t for t in res.tokens if t < sp.timestamp_begin])[0] == 0:
            raw = []  # the window is nothing but a loop: a hallucination, dropped
    keep = [] if trimmed else tokens[: completed_length(tokens, sp.timestamp_begin)]
    return timed_segments(model, raw, seek * HOP_LENGTH / SAMPLE_RATE, win), advance, keep


def guarded_tokens(model: SpeechModel, opts: TranscribeOptions, win: WindowDecode,
                   stats: FileStats) -> tuple[list[int], bool]:
    """The window's tokens with a hallucination loop cut (``opts.repetition_guard``, counted in ``stats``), and
    whether one was."""
    res = win.result
    tokens, trimmed = (trim_repetition(res.tokens, timestamp_begin=model.speech_hooks().timestamp_begin)
                       if opts.repetition_guard else (res.tokens, False))
    stats.trimmed_windows += int(trimmed)
    return tokens, trimmed


def timed_segments(model: SpeechModel, raw: list[RawSegment], offset: float, win: WindowDecode) -> list[Segment]:
    """The :class:`Segment` of each raw piece of ``win`` at ``offset`` seconds; pieces without text dropped."""
    res = win.result
    segs = [Segment(offset + r.start, offset + r.end, model.tokenizer.decode(list(r.tokens)), r.tokens,
                    win.avg_logprob, res.probed, win.compression_ratio, win.temperature) for r in raw]
    return [s for s in segs if s.text.strip()]
