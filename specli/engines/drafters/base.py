"""The drafter protocol and the proposal it returns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from specli.engines.types import HiddenStates, TargetState
from specli.engines.tree import depths

FilterFn = Callable[[torch.Tensor, Sequence[Sequence[int]]], torch.Tensor]  # [n, V] -> [n, V]


@dataclass(frozen=True)
class DraftRequest:
    """Everything a drafter may read to propose a continuation."""

    tokens: list[int]  # committed sequence: prompt + sampled tokens (the pending token last)
    prompt_len: int  # tokens[prompt_len:] are the sampled tokens the logit filter sees
    budget: int  # most draft tokens (tree nodes) to propose
    state: TargetState  # the target's state (cache; Whisper: encoder output, features)
    hidden: HiddenStates | None  # target hidden states of the last verified rows [1, m, d]
    filter: FilterFn  # the one logit filter, with this decode's rules and sampling parameters
    greedy: bool  # True: propose argmax tokens; False: sample from the filtered distribution
    generator: torch.Generator | None = None  # random source for sampling drafters


@dataclass(frozen=True)
class DraftProposal:
    """A chain or tree of draft tokens.

    ``q`` holds the distribution each node was drawn from (needed by rejection sampling); ``None``
    means each node is a point mass on its token (deterministic proposals such as n-gram matches).
    """

    tokens: list[int]  # token of each node
    parents: list[int]  # parent node of each node, -1 for the root (the pending token)
    confidence: list[float] = field(default_factory=list)  # drafter probability of each node's token
    q: torch.Tensor | None = None  # [n, vocab] draft distribution of each node, or None

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents differ in length")
        depths(self.parents)  # validates the tree order
        if self.q is not None and self.q.shape[0] != len(self.tokens):
            raise ValueError("q must have one row per node")

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY = DraftProposal([], [])


class Drafter(Protocol):
    """Proposes draft tokens; learns what was committed after each verification."""

    def start(self, state: TargetState, prompt: list[int]) -> None:
        """A new window: reset per-window state (caches) for this target state and prompt."""

    def propose(self, request: DraftRequest) -> DraftProposal: ...

    def commit(self, tokens: list[int]) -> None:
        """The committed sequence after verification (prompt + sampled, the new pending last)."""
