"""SpecASR draft recycling: reuse the tail of a rejected draft when the target realigns with it.

After a rejection at draft position ``j`` the target emitted its own token ``c`` instead of
``d[j]``. Speech drafts usually go wrong in one token and right again after it, so the tail
``d[j+1:]`` is kept: it is proposed after ``c`` (a substitution), and ``d[j+2:]`` too when
``c == d[j+1]`` (the drafter skipped a token). Recycled tails and the inner drafter's fresh chain
are merged into one token tree, so a single target pass verifies them all.
"""

from __future__ import annotations

from specli.core.drafters.base import Drafter, DraftProposal, DraftRequest
from specli.core.types import TargetState


def merge_chains(chains: list[list[int]], budget: int) -> tuple[list[int], list[int]]:
    """A prefix trie of token chains, breadth-first, at most ``budget`` nodes: (tokens, parents)."""
    tokens: list[int] = []
    parents: list[int] = []
    node_of: dict[tuple[int, ...], int] = {}
    depth = 0
    while len(tokens) < budget and any(len(c) > depth for c in chains):
        for chain in chains:
            if len(chain) <= depth or len(tokens) >= budget:
                continue
            key = tuple(chain[: depth + 1])
            parent_key = key[:-1]
            if key in node_of or (parent_key and parent_key not in node_of):
                continue
            node_of[key] = len(tokens)
            tokens.append(chain[depth])
            parents.append(node_of[parent_key] if parent_key else -1)
        depth += 1
    return tokens, parents


class RecyclingDrafter(Drafter):
    """Wraps a drafter; adds recycled tails of the last rejected chain to its proposals."""

    def __init__(self, inner: Drafter, max_tail: int = 16) -> None:
        self.inner = inner
        self.max_tail = max_tail  # longest recycled tail kept
        self._last: list[int] = []  # the last proposal's main chain
        self._base = 0  # committed length when it was proposed
        self._tails: list[list[int]] = []

    def fork(self) -> RecyclingDrafter | None:
        """Recycling around a fork of the inner drafter (None when it has none)."""
        inner = self.inner.fork()
        return None if inner is None else RecyclingDrafter(inner, self.max_tail)

    def start(self, state: TargetState, prompt: list[int]) -> None:
        self.inner.start(state, prompt)
        self._last, self._tails = [], []

    def propose(self, request: DraftRequest) -> DraftProposal:
        fresh = self.inner.propose(request)
        chain = [fresh.tokens[i] for i in _main_chain(fresh.parents)]
        tails = [t for t in self._tails if t and t != chain[: len(t)]]
        if not tails or fresh.q is not None:  # sampling drafts keep their own q: no recycling
            self._remember(chain, request)
            return fresh
        tokens, parents = merge_chains([chain, *tails], request.budget)
        self._remember(chain, request)
        return DraftProposal(tokens, parents, [1.0] * len(tokens))

    def _remember(self, chain: list[int], request: DraftRequest) -> None:
        self._last, self._base = chain, len(request.tokens)

    def commit(self, tokens: list[int]) -> None:
        """Work out where the last chain was rejected and keep its tail(s)."""
        self.inner.commit(tokens)
        emitted = tokens[self._base :]
        accepted = len(emitted) - 1
        self._tails = []
        if accepted < 0 or accepted >= len(self._last):
            return
        correction = emitted[-1]
        tail = self._last[accepted + 1 :][: self.max_tail]
        self._tails.append(tail)
        if tail and tail[0] == correction:
            self._tails.append(tail[1:])


def _main_chain(parents: list[int]) -> list[int]:
    """Nodes of the first root-to-leaf chain (each node's first child)."""
    chain, cur = [], -1
    while True:
        child = next((i for i, p in enumerate(parents) if p == cur), None)
        if child is None:
            return chain
        chain.append(child)
        cur = child
