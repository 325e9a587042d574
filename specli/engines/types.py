"""Small protocols and result types shared by decoding strategies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from specli.engines.targets.whisper import DecoderState, ScoreOutput


class Target(Protocol):
    """A model that scores a chain or tree of candidate tokens in one forward."""

    def score(
        self,
        state: DecoderState,
        tokens: torch.Tensor,  # [B, n]
        positions: torch.Tensor | None = None,  # [B, n]
        tree_mask: torch.Tensor | None = None,  # [B, n, n] bool
    ) -> ScoreOutput: ...


class LogitRules(Protocol):
    """A pure function from raw logits and each row's sampled prefix to masked logits."""

    def __call__(self, logits: torch.Tensor, prefixes: Sequence[Sequence[int]]) -> torch.Tensor: ...


@dataclass
class DecodeStats:
    """Counters of one decode; strategies add to them, benchmarks read them."""

    tokens: int = 0  # tokens emitted (eot included)
    target_forwards: int = 0  # decoder forwards of the target, prefill included
    decode_seconds: float = 0.0  # wall time inside the decode loop
    extra: dict[str, float] = field(default_factory=dict)  # strategy-specific figures


@dataclass(frozen=True)
class DecodeResult:
    """What a decode of one window returns."""

    tokens: list[int]  # sampled tokens after the prompt, eot excluded
    sum_logprob: float  # sum of the sampled tokens' log-probabilities (eot included)
    no_speech_prob: float  # probability of <|nospeech|> at the start-of-transcript position
    finished: bool  # True when eot was reached, False when the length limit stopped it
    stats: DecodeStats
