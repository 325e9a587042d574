"""What the transcription pipeline asks of a speech-to-text family, in model-layer types.

``specli.asr``'s window loop (30-s windows, fallback, segments, seek, writers, resume, batching) is one loop
for every family. What differs between families comes from the loaded model's hooks, :class:`SpeechHooks`:
a window's input features, its decode job (prompt, logit rules, stop token, probe), the language, and
whether the model writes timestamp tokens. A family's loaded model supplies them as ``model.speech_hooks()``
(Qwen2-Audio); the built-in Whisper family's hooks live in ``specli.asr.speech`` beside the options they read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from specli.core.job import DecodeJob
from specli.core.types import TargetState


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
