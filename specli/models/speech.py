"""What the transcription pipeline asks of a speech-to-text family, in model-layer types.

``specli.asr``'s window loop (30-s windows, fallback, segments, seek, writers, resume, batching) is one loop
for every family. What differs between families comes from the loaded model's hooks, :class:`SpeechHooks`:
a window's input features, its decode job (prompt, logit rules, stop token, probe), the language, and
whether the model writes timestamp tokens, and word timings where the family has them. Every family's loaded
model is a :class:`SpeechModel`: its target, its tokenizer and its hooks (``model.speech_hooks()``; Whisper's are
``specli.models.whisper.hooks``). The options a window is decoded with (:class:`DecodingOptions`: temperatures,
fallback thresholds, prompts, suppressed ids) live here too, below both the hooks and the pipeline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import torch

from specli.core.goodput import MoEProfile
from specli.core.job import DecodeJob
from specli.core.types import BatchTarget, Target, TargetState
from specli.errors import UsageError
from specli.models.moe import ExpertTally

WHISPER_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # openai-whisper's fallback schedule


@dataclass(frozen=True)
class DecodingOptions:
    """How each 30-s window is decoded (openai-whisper / faster-whisper options); validated."""

    temperatures: tuple[float, ...] = WHISPER_TEMPERATURES  # tried in order while a decode fails
    best_of: int = 5  # samples drawn at a temperature > 0; the most likely one is kept
    beam_size: int | None = None  # plain beam search at temperature 0 (None: greedy / speculative)
    patience: float | None = None  # beam search: stop after beam_size * patience finished (None: 1.0)
    length_penalty: float | None = None  # ranking: None divides by length, else ((5 + n) / 6) ** alpha
    compression_ratio_threshold: float | None = 2.4  # above: too repetitive, fall back (None: never)
    logprob_threshold: float | None = -1.0  # average log-prob below: fall back (None: never)
    no_speech_threshold: float | None = 0.6  # <|nospeech|> prob above: silence, no fallback (None: off)
    fallback_silence: bool = True  # a likely-silent window whose first decode failed is skipped (specli)
    condition_on_previous_text: bool = True  # prompt each window with the previous windows' text
    prompt_reset_on_temperature: float = 0.5  # a window decoded above this does not prompt the next
    initial_prompt: str | None = None  # text put before the first window (<|startofprev|> + text)
    hotwords: str | None = None  # text put before every window's previous text (faster-whisper)
    suppress_tokens: tuple[int, ...] = (-1,)  # ids never emitted; -1 = the model's non-speech set
    seed: int | None = None  # seed of the file's random generator (sampling); None: random

    def __post_init__(self) -> None:
        if not self.temperatures or any(not 0.0 <= t <= 10.0 or math.isnan(t) for t in self.temperatures):
            raise UsageError("temperatures must be a non-empty list of values within 0..10")
        if self.best_of < 1:
            raise UsageError("best_of must be >= 1")
        if self.beam_size is not None and not 1 <= self.beam_size <= 64:
            raise UsageError("beam_size must be within 1..64")
        if self.patience is not None and (self.patience <= 0 or self.beam_size is None):
            raise UsageError("patience must be > 0 and needs a beam size")
        if self.length_penalty is not None and not 0.0 <= self.length_penalty <= 1.0:
            raise UsageError("length_penalty must be within 0..1")
        if self.no_speech_threshold is not None and not 0.0 <= self.no_speech_threshold <= 1.0:
            raise UsageError("no_speech_threshold must be within 0..1")
        if any(t < -1 for t in self.suppress_tokens):
            raise UsageError("suppress_tokens are token ids (>= 0) or -1")

    def at(self, temperature: float) -> DecodingOptions:
        """These options for one attempt at ``temperature``."""
        return replace(self, temperatures=(temperature,))

    @property
    def temperature(self) -> float:
        """The temperature of a one-attempt options object (the first one otherwise)."""
        return self.temperatures[0]


def suppress_ids(options: DecodingOptions, default: tuple[int, ...], always: tuple[int, ...]) -> tuple[int, ...]:
    """Ids the logit rules mask: the user's ids, the model's ``default`` set where -1 is given, and
    the control tokens openai-whisper always suppresses (``always``: task, sot, sot_prev, no-speech)."""
    ids = {t for t in options.suppress_tokens if t >= 0} | set(always)
    if -1 in options.suppress_tokens:
        ids |= set(default)
    return tuple(sorted(ids))

PREPEND_PUNCTUATIONS = "\"'“¿([{-"  # merged into the following word (openai-whisper's default)
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"  # merged into the preceding word (openai-whisper's default)


@dataclass(frozen=True)
class Word:
    """One word of a segment with its time span."""

    start: float  # seconds from the start of the file
    end: float  # seconds from the start of the file
    word: str  # text as it appears in the segment (with its leading space)
    probability: float  # mean probability of the word's tokens


@dataclass(frozen=True)
class WindowWords:
    """Segments of one window with words and adjusted times, and where speech last ended."""

    segments: list  # the input segments, ``dataclasses.replace``-d with start, end and words
    last_speech: float  # where speech last ended so far (seconds from the file start)
    last_word_end: float | None = None  # end of this window's last word (else last segment), if any


@dataclass(frozen=True)
class WindowPrompt:
    """What a window's decode job is built from (the pipeline's options, in plain values)."""

    task: str  # "transcribe" or "translate"
    language: str | None  # language code, None when unknown
    previous: tuple[int, ...]  # text tokens of earlier windows to condition on (families may ignore them)
    hotwords: tuple[int, ...]  # hotword tokens put before them (families may ignore them)
    timestamps: bool  # segment timestamps asked for
    suppress_tokens: tuple[int, ...]  # ids never emitted; -1 = the model's own non-speech set
    max_new_tokens: int  # tokens decoded per window at most
    frames: int  # real (unpadded) mel frames in the window
    generator: torch.Generator | None  # the file's random source
    instruction: str | None = None  # an audio-LLM's instruction text (None: the model's documented one)


class SpeechHooks(Protocol):
    """A family's part of the window loop."""

    eot: int  # the token that ends a window's text
    timestamp_begin: int  # ids from here on are timestamp tokens (a model without any: past its vocabulary)
    word_timestamps: bool  # whether word timings (cross-attention alignment) are available

    def features(self, audio: np.ndarray) -> tuple[torch.Tensor, int]:
        """The window's input features ``[1, n_mels, 3000]`` of up to 30 s of 16 kHz audio, and how many
        of its frames are real (what the encoder may mask past)."""

    def language(self, given: str | None) -> str | None:
        """The language decoding starts with (given, or the model's only one)."""

    def detect_language(self, state: TargetState) -> dict[str, float] | None:
        """Language probabilities from an encoded window, most likely first; None: the model does not detect."""

    def check_support(self, model: str, task: str, language: str | None) -> None:
        """Raise ``UsageError`` for a task or language the model cannot do."""

    def window_job(self, prompt: WindowPrompt) -> DecodeJob:
        """The decode job of one window."""

    def align_words(self, state: TargetState, segments: Sequence, *, language: str | None, task: str,
                    time_offset: float, num_frames: int, last_speech: float, prepend_punctuations: str,
                    append_punctuations: str) -> WindowWords:
        """Word timings of one decoded window's ``segments`` (asked only when :attr:`word_timestamps`)."""


class SpeechTarget(Target, Protocol):
    """A speech family's target: an audio encoder in front of the decoder every decode loop scores."""

    dtype: torch.dtype  # the decoder's weights' dtype
    compiled_encoder: object | None  # the encoder compiled by torch.compile (its compile_seconds); None: eager
    experts: ExpertTally | None  # the distinct experts each decoder forward touched (sparse-MoE decoders); None: dense

    def encode(self, mel: torch.Tensor, frames: Sequence[int] | None = None) -> torch.Tensor:
        """Audio features ``[k, audio_ctx, d_model]`` of ``k`` windows' features ``[k, n_mels, 3000]``."""

    def start(self, audio_features: torch.Tensor, max_len: int | None = None,
              features: torch.Tensor | None = None) -> TargetState:
        """A fresh decoder state (empty cache) over one window's audio features."""

    def batch_target(self) -> BatchTarget | None:
        """This target as a :class:`~specli.core.types.BatchTarget` (files' windows decode as rows of one state,
        asr/scheduler.py); None: it decodes one window at a time."""

    def moe_profile(self) -> MoEProfile | None:
        """The decoder's MoE routing and expert share (the goodput rule's prior, asr/strategies.py); None: dense."""


class SpeechTokenizer(Protocol):
    """A speech family's text side."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""

    def decode(self, tokens: list[int]) -> str:
        """The text of ``tokens``."""


class SpeechModel(Protocol):
    """A loaded speech-to-text model of any family: what ``specli.asr`` transcribes with."""

    target: SpeechTarget
    tokenizer: SpeechTokenizer

    def speech_hooks(self) -> SpeechHooks:
        """The family's part of the window loop."""
