"""EAGLE-2 dynamic draft trees, model-neutral: the scored nodes of one proposal and how a level adds children.

A chain spends its whole budget on one guess per position; EAGLE-2 ("Faster Inference of Language Models with
Dynamic Draft Trees") lets the drafter's own confidence shape the tree:

* **Expand.** The drafter's distribution after the pending token gives the first level: its ``topk`` most
  likely tokens. At every later level the ``topk`` nodes of highest *path* probability (the product of the draft
  probabilities from the root) are expanded together, each contributing its ``topk`` most likely children.
* **Rerank.** Of every node scored, the ``total`` of highest path probability form the proposal (``min_path`` > 0
  also drops nodes below it, so an unsure drafter proposes a small tree). A child's path probability never
  exceeds its parent's, so the kept set is closed under ancestry; nodes keep creation order (parents first).

How a level's distributions are computed is the drafter's business (the EAGLE-ASR head: one head forward over the
frontier under a tree mask, ``specli.asr.drafters.dynamic_tree``; DSpark: the block's base logits of that slot plus
each frontier token's Markov row, ``specli.core.drafters.llm.dflash``). Every distribution is the request's own
logit filter over the node's prefix. Sampling: tokens are picked deterministically (top-k), so each node is a point
mass given the drafter's state and the proposal carries ``q = None``; sibling-wise rejection
(``verify.sample_tree``) keeps the target's distribution exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specli.core.drafters.base import DraftProposal, DraftRequest
from specli.core.logits import DraftVocab
from specli.core.tree import path_to

MAX_TOPK = 8  # nodes expanded per level (and children per node), at most


@dataclass(frozen=True)
class DynamicTreeOptions:
    """Shape limits of an EAGLE-2 dynamic draft tree."""

    depth: int = 5  # levels of the tree (drafter steps per proposal, the first included)
    topk: int = 4  # nodes expanded per level, and children scored per expanded node
    total: int = 12  # nodes kept in the proposal (best path probabilities; capped by the request's budget)
    min_path: float = 0.0  # nodes whose path probability is below this are dropped (the root's best child stays)

    def __post_init__(self) -> None:
        if not 1 <= self.depth <= 16:
            raise ValueError("dynamic tree depth must be within 1..16")
        if not 1 <= self.topk <= MAX_TOPK:
            raise ValueError(f"dynamic tree topk must be within 1..{MAX_TOPK}")
        if not 1 <= self.total <= 64:
            raise ValueError("dynamic tree total must be within 1..64")
        if not 0.0 <= self.min_path < 1.0:
            raise ValueError("dynamic tree min_path must be within [0, 1)")

    @property
    def slots(self) -> int:
        """Rows one proposal expands at most: the root, then ``topk`` nodes per later level."""
        return 1 + self.topk * (self.depth - 1)


class TreeNodes:
    """The scored nodes of one proposal: token, parent, path log-probability, depth, drafter cache slot."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.score: list[float] = []  # log path probability (sum of the draft log-probabilities)
        self.depth: list[int] = []  # children of the root have depth 1
        self.slot: list[int] = []  # where a drafter keeps the node's state once expanded (its own use), else -1

    def add(self, token: int, parent: int, score: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.score.append(score)
        self.depth.append(1 if parent < 0 else self.depth[parent] + 1)
        self.slot.append(-1)
        return len(self.tokens) - 1

    def path(self, node: int) -> list[int]:
        """Tokens from the root's child down to ``node`` (empty for the root, ``-1``)."""
        return [self.tokens[i] for i in path_to(self.parents, node)]

    def frontier(self, children: list[int], topk: int) -> list[int]:
        """The ``topk`` of ``children`` with the highest path probability (ties: the earlier node)."""
        return sorted(children, key=lambda i: (-self.score[i], i))[:topk]

    def best(self, total: int) -> DraftProposal:
        """The ``total`` nodes of highest path probability (ancestry-closed), in creation order."""
        order = sorted(range(len(self.tokens)), key=lambda i: (-self.score[i], i))
        kept: set[int] = set()
        for i in order:
            if len(kept) == total:
                break
            if self.parents[i] < 0 or self.parents[i] in kept:
                kept.add(i)
        keep = sorted(kept)
        index = {old: new for new, old in enumerate(keep)}
        return DraftProposal([self.tokens[i] for i in keep],
                             [index[self.parents[i]] if self.parents[i] >= 0 else -1 for i in keep],
                             [math.exp(self.score[i]) for i in keep])


def add_children(request: DraftRequest, nodes: TreeNodes, frontier: list[int], logits: torch.Tensor,
                 options: DynamicTreeOptions, vocab: DraftVocab | None = None) -> list[int]:
    """Add the ``options.topk`` most likely children of each ``frontier`` node (``-1``: the root) from the
    drafter's logits ``[m, V]`` (row ``i`` after ``frontier[i]``'s path; ``[m, Vd]`` with a draft vocabulary)
    under the request's logit filter, scored by path log-probability; returns the new nodes."""
    sampled = request.tokens[request.prompt_len :]
    prefixes = [sampled + nodes.path(f) for f in frontier]
    if vocab is None:
        filtered = request.filter(logits, prefixes)
    else:
        filtered = request.filter(logits, prefixes, vocab=vocab)
    top = filtered.log_softmax(-1).topk(min(options.topk, filtered.shape[-1]), -1)  # [m, k]
    k = top.values.shape[1]
    flat = torch.cat([top.values.double().flatten(), top.indices.double().flatten()]).tolist()  # one readback
    new = []
    floor = math.log(options.min_path) if options.min_path > 0 else -math.inf
    for r, f in enumerate(frontier):
        base = 0.0 if f < 0 else nodes.score[f]
        for c in range(k):
            logp, col = flat[r * k + c], int(flat[len(flat) // 2 + r * k + c])
            if not math.isfinite(logp) or (base + logp < floor and (f >= 0 or c > 0)):
                continue
            new.append(nodes.add(col if vocab is None else vocab.host[col], f, base + logp))
    return new
