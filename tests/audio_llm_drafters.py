"""Drafters for the audio-LLM losslessness property tests: always right, always wrong, random trees, the
n-gram pool (half right). Real drafter protocol, no model behind them (a drafter may propose anything)."""

from __future__ import annotations

import torch

from specli.core.drafters.base import Drafter, DraftProposal
from specli.core.drafters.ngram import NgramDrafter, NgramPool


class OracleDrafter(Drafter):
    """Proposes the reference continuation (always right), or each of its tokens plus one (always wrong)."""

    def __init__(self, reference: list[int], vocab: int, wrong: bool = False) -> None:
        self.reference, self.vocab, self.wrong = reference, vocab, wrong

    def start(self, state, prompt: list[int]) -> None:
        self.prompt_len = len(prompt)

    def propose(self, request) -> DraftProposal:
        done = len(request.tokens) - request.prompt_len
        tokens = self.reference[done : done + request.budget]
        if self.wrong:
            tokens = [(t + 1) % self.vocab for t in tokens]
        return DraftProposal(tokens, list(range(-1, len(tokens) - 1)), [1.0] * len(tokens))

    def commit(self, tokens: list[int]) -> None:
        pass


class RandomTreeDrafter(Drafter):
    """Random trees of random tokens (seeded)."""

    def __init__(self, seed: int, vocab: int) -> None:
        self.g, self.vocab = torch.Generator().manual_seed(seed), vocab

    def start(self, state, prompt: list[int]) -> None:
        pass

    def propose(self, request) -> DraftProposal:
        n = int(torch.randint(0, request.budget + 1, (1,), generator=self.g))
        parents = [int(torch.randint(-1, i, (1,), generator=self.g)) if i else -1 for i in range(n)]
        return DraftProposal(torch.randint(0, self.vocab, (n,), generator=self.g).tolist(), parents, [1.0] * n)

    def commit(self, tokens: list[int]) -> None:
        pass


DRAFTERS = ["always-right", "always-wrong", "random-tree", "ngram-pool"]


def make_drafter(name: str, reference: list[int], eot: int, seed: int, vocab: int):
    """The drafter ``name`` of :data:`DRAFTERS` for a decode whose greedy tokens are ``reference``."""
    if name == "always-right":
        return OracleDrafter(reference + [eot], vocab)
    if name == "always-wrong":
        return OracleDrafter(reference + [eot], vocab, wrong=True)
    if name == "random-tree":
        return RandomTreeDrafter(seed, vocab)
    pool = NgramPool(3)
    pool.add(reference[: len(reference) // 2] * 2)  # half right, then wrong
    return NgramDrafter(pool, eot)
