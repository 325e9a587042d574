"""A test-only speech family in one package: what a new transcription family needs and nothing more.

The target is :class:`speech_toy.TableTarget`'s trigram decoder behind a one-number audio encoder: a window's
features are its log-mel (the shared :func:`specli.io.audio.window_features`), ``encode`` keeps the mean of its
real frames, and ``start`` picks the trigram table by whether that mean is above :data:`LOUD`, so what is
transcribed depends on the audio. Its text side spells speech tokens 0..4 as the letters ``a``..``e``. The family
is registered by one :class:`specli.models.registry.Family` entry (``tests/test_toy_family.py``) and runs through
``specli transcribe`` with no change anywhere in ``specli/``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from speech_toy import EOS, SOS, V, TableTarget, ToyState, random_table
from specli.core.job import DecodeJob
from specli.errors import UsageError
from specli.io.audio import HOP_LENGTH, N_FRAMES, window_features
from specli.models.speech import WindowPrompt

LETTERS = "abcde"  # speech tokens 0..4
LOUD = -0.5  # a window whose mean log-mel is above this decodes with the second table
MAX_NEW = 12  # tokens a window decodes at most


class ToyTokenizer:
    """Speech tokens 0..4 <-> the letters a..e (other ids have no text; other characters no id)."""

    def encode(self, text: str) -> list[int]:
        return [LETTERS.index(c) for c in text if c in LETTERS]

    def decode(self, tokens: list[int]) -> str:
        return "".join(LETTERS[t] for t in tokens if 0 <= t < len(LETTERS))


class ToyAsrTarget:
    """Two trigram tables; the window's loudness picks one (its state keeps the pick)."""

    def __init__(self, tables: Sequence[torch.Tensor]) -> None:
        self.decoders = [TableTarget(t) for t in tables]
        self.dtype = torch.float32
        self.compiled_encoder = None  # the encoder runs eagerly
        self.experts = None  # a dense decoder: no expert tally

    def batch_target(self) -> None:
        """None: the toy decodes one window at a time (no batch contract)."""
        return None

    def moe_profile(self) -> None:
        return None

    def encode(self, mel: torch.Tensor, frames: Sequence[int] | None = None) -> torch.Tensor:
        """``[k, 1, 1]`` the mean log-mel of each window's real frames (``mel [k, n_mels, 3000]``)."""
        n = frames or [mel.shape[-1]] * mel.shape[0]
        return torch.stack([mel[i, :, : max(1, f)].mean() for i, f in enumerate(n)]).view(-1, 1, 1)

    def start(self, audio_features: torch.Tensor, max_len: int | None = None,
              features: torch.Tensor | None = None) -> ToyState:
        state = ToyState(max_len or 64)
        state.level = int(float(audio_features.reshape(-1)[0]) > LOUD)
        return state

    def score(self, state: ToyState, tokens: torch.Tensor, positions: torch.Tensor | None = None,
              tree_mask: torch.Tensor | None = None, logit_rows: list[int] | None = None):
        return self.decoders[state.level].score(state, tokens, positions, tree_mask, logit_rows)


@dataclass(frozen=True)
class ToyAsrHooks:
    """The family's part of the window loop: no timestamps, no language detection, no word timings."""

    model: ToyAsrModel
    word_timestamps: bool = False
    eot: int = EOS
    timestamp_begin: int = V  # past the vocabulary: no timestamp tokens, one segment per window

    def features(self, audio: np.ndarray) -> tuple[torch.Tensor, int]:
        return window_features(audio, 80), min(N_FRAMES, len(audio) // HOP_LENGTH)

    def language(self, given: str | None) -> str | None:
        return given

    def detect_language(self, state: object) -> None:
        return None

    def check_support(self, model: str, task: str, language: str | None) -> None:
        if task != "transcribe":
            raise UsageError(f"model {model!r} cannot {task}")

    def window_job(self, p: WindowPrompt) -> DecodeJob:
        return DecodeJob((SOS,), None, EOS, min(p.max_new_tokens, MAX_NEW), generator=p.generator)


@dataclass(frozen=True)
class ToyAsrModel:
    """A loaded toy model: the family's :class:`specli.models.speech.SpeechModel`."""

    target: ToyAsrTarget
    tokenizer: ToyTokenizer

    def speech_hooks(self) -> ToyAsrHooks:
        return ToyAsrHooks(self)


def load_toy_asr(name_or_dir: str, dtype: str = "float32", **options: object) -> ToyAsrModel:
    """The toy model ``toy-<seed>`` (its two tables drawn from the seed; an end more likely in the second)."""
    seed = int(name_or_dir.removeprefix("toy-"))
    return ToyAsrModel(ToyAsrTarget([random_table(seed, eos_bias=-1.0), random_table(seed + 1, eos_bias=1.0)]),
                       ToyTokenizer())
