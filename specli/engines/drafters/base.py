"""The drafter protocol and the proposal it returns."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from specli.engines.logits import sample_inverse_cdf
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


@dataclass(frozen=True)
class ModelDraftOptions:
    """How a model drafter drafts."""

    confidence_threshold: float = 0.0  # adaptive: stop below this drafter probability (0 = never)
    tree_topk: int = 0  # sparse tree: alternatives added at each low-confidence position (0 = chain)
    tree_threshold: float = 0.6  # sparse tree: positions below this confidence get alternatives

    def __post_init__(self) -> None:
        if not 0.0 <= self.confidence_threshold < 1.0 or not 0.0 <= self.tree_threshold <= 1.0:
            raise ValueError("thresholds must be within [0, 1)")
        if self.tree_topk < 0:
            raise ValueError("tree_topk must be >= 0")


def draft_chain(request: DraftRequest, budget: int, logits: torch.Tensor, advance: Callable[[int], torch.Tensor],
                options: ModelDraftOptions) -> DraftProposal:
    """The drafting loop shared by model drafters: from the drafter's ``logits [vocab]`` after the
    pending token, choose a token under the shared logit filter (argmax, or a sample), stop below the
    adaptive confidence threshold, and ``advance(token)`` to the next logits; then add sparse-tree
    alternatives."""
    sampled = request.tokens[request.prompt_len :]
    draft: list[int] = []
    conf: list[float] = []
    q_rows, alts = [], []
    while len(draft) < budget:
        probs = request.filter(logits[None], [sampled + draft]).softmax(-1)[0]
        tok = draft_token(probs, request)
        p = float(probs[tok])
        if not math.isfinite(p) or (draft and p < options.confidence_threshold):
            break
        draft.append(tok)
        conf.append(p)
        q_rows.append(None if request.greedy else probs)
        alts.append(probs.topk(options.tree_topk + 1).indices.tolist() if options.tree_topk else [])
        if len(draft) < budget:
            logits = advance(tok)
    return sparse_tree(draft, conf, q_rows, alts, budget, options)


def draft_token(probs: torch.Tensor, request: DraftRequest) -> int:
    """The drafter's token from its filtered distribution ``probs [vocab]``: argmax, or a sample."""
    if request.greedy:
        return int(probs.argmax())
    where = request.generator.device if request.generator is not None else probs.device
    u = torch.rand(1, generator=request.generator, dtype=torch.float64, device=where).float().to(probs.device)
    return int(sample_inverse_cdf(probs[None], u)[0])


def sparse_tree(draft, conf, q_rows, alts, budget: int, options: ModelDraftOptions) -> DraftProposal:
    """The drafted chain plus (two-pass sparse tree) alternative leaves at low-confidence positions.

    Alternatives come after every chain node, so parents still precede their children. In sampling
    mode chain nodes keep their drafter distribution ``q`` and alternatives are point masses.
    """
    tokens, parents, confs, q = list(draft), list(range(-1, len(draft) - 1)), list(conf), list(q_rows)
    for pos, c in enumerate(conf):
        if not options.tree_topk or c >= options.tree_threshold:
            continue
        for alt in alts[pos]:
            if alt != draft[pos] and len(tokens) < budget:
                tokens.append(alt)
                parents.append(pos - 1)
                confs.append(0.0)
                q.append(None)
    q_t = None
    if q and q[0] is not None:
        r0 = q[0]
        q_t = torch.stack([r if r is not None else _one_hot(t, r0) for r, t in zip(q, tokens)])
    return DraftProposal(tokens, parents, confs, q_t)


def _one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    """A point mass on ``token`` shaped, typed and placed like the distribution ``like [vocab]``."""
    row = torch.zeros_like(like)
    row[token] = 1.0
    return row
