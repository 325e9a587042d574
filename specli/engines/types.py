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
    draft_seconds: float = 0.0  # time in the drafter (propose + commit)
    verify_seconds: float = 0.0  # time in target forwards, logit filtering and verification
    verify_steps: int = 0  # speculative steps (target forwards that verified a draft)
    drafted: int = 0  # draft tokens (tree nodes) proposed
    accepted: int = 0  # draft tokens accepted
    position_attempts: list[int] = field(default_factory=list)  # steps whose draft reached depth d+1 ...
    position_accepts: list[int] = field(default_factory=list)  # ... and of those, accepted at depth d+1

    def record_step(self, draft_depth: int, accepted: int) -> None:
        """One verification: the draft's depth and how many tokens were accepted."""
        self.verify_steps += 1
        self.accepted += accepted
        for d in range(min(draft_depth, accepted + 1)):
            if d == len(self.position_attempts):
                self.position_attempts.append(0)
                self.position_accepts.append(0)
            self.position_attempts[d] += 1
            self.position_accepts[d] += int(d < accepted)

    @property
    def acceptance_length(self) -> float:
        """Tokens per verification step, bonus included (tau)."""
        return (self.accepted + self.verify_steps) / self.verify_steps if self.verify_steps else 1.0


COUNTERS = ("tokens", "target_forwards", "decode_seconds", "draft_seconds", "verify_seconds", "verify_steps",
            "drafted", "accepted")


def accumulate(dst, src: DecodeStats) -> None:
    """Add ``src``'s counters to ``dst`` (a DecodeStats, or any record with the same fields)."""
    for name in COUNTERS:
        setattr(dst, name, getattr(dst, name) + getattr(src, name))
    for d in range(len(src.position_attempts)):
        if d == len(dst.position_attempts):
            dst.position_attempts.append(0)
            dst.position_accepts.append(0)
        dst.position_attempts[d] += src.position_attempts[d]
        dst.position_accepts[d] += src.position_accepts[d]


@dataclass(frozen=True)
class DecodeResult:
    """What a decode of one window returns."""

    tokens: list[int]  # sampled tokens after the prompt, eot excluded
    sum_logprob: float  # sum of the sampled tokens' log-probabilities (eot included)
    no_speech_prob: float  # probability of <|nospeech|> at the start-of-transcript position
    finished: bool  # True when eot was reached, False when the length limit stopped it
    stats: DecodeStats
