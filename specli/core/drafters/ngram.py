"""Training-free drafter: an n-gram pool of hypotheses decoded earlier in this run.

Speculative listening / prompt lookup: the drafter finds the longest suffix of the committed
tokens (up to ``max_ngram``) that occurred before, in an earlier window, an earlier file, or
earlier in this window, and proposes what followed it. Each finished window is added to the pool
with its end-of-transcript token, so a match at the end of a hypothesis proposes ``eot``.
"""

from __future__ import annotations

from collections.abc import Sequence

from specli.core.drafters.base import Drafter, DraftProposal, DraftRequest
from specli.core.types import TargetState
from specli.core.tree import chain_parents


class NgramPool:
    """Token sequences seen in this run, indexed by their n-grams (most recent occurrence wins).

    An n-gram is indexed once a token follows it, so a lookup never matches the very end.
    """

    def __init__(self, max_ngram: int = 4, max_tokens: int = 1_000_000) -> None:
        if max_ngram < 1:
            raise ValueError("max_ngram must be >= 1")
        self.max_ngram = max_ngram
        self.max_tokens = max_tokens  # the pool stops growing past this many tokens
        self.tokens: list[int] = []
        self._doc_start = 0  # n-grams never cross into an earlier sequence
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> position of the token after it

    def add(self, sequence: Sequence[int]) -> None:
        """Start a new sequence (one finished hypothesis) and index it."""
        self._doc_start = len(self.tokens)
        self.extend(sequence)

    def extend(self, tokens: Sequence[int]) -> None:
        """Continue the current sequence."""
        if len(self.tokens) + len(tokens) > self.max_tokens:
            return
        old = len(self.tokens)
        self.tokens.extend(tokens)
        for end in range(max(old, self._doc_start + 1), len(self.tokens)):
            for n in range(1, self.max_ngram + 1):
                if end - n < self._doc_start:
                    break
                self._index[tuple(self.tokens[end - n : end])] = end

    def lookup(self, context: Sequence[int], min_ngram: int = 1) -> list[int] | None:
        """Tokens that followed the longest matching suffix of ``context``, or None."""
        for n in range(min(self.max_ngram, len(context)), min_ngram - 1, -1):
            end = self._index.get(tuple(context[-n:]))
            if end is not None:
                return self.tokens[end:]
        return None


class NgramDrafter(Drafter):
    """Proposes the continuation of the longest suffix match in this window, else in the pool."""

    def __init__(self, pool: NgramPool, eot: int, min_ngram: int = 1) -> None:
        self.pool = pool
        self.eot = eot
        self.min_ngram = min_ngram  # shortest suffix that may match
        self._window = NgramPool(pool.max_ngram)  # this window's own tokens (self-lookup)
        self._prompt_len = 0

    def fork(self) -> NgramDrafter:
        """A drafter for another sequence drawing on (and adding to) the same pool."""
        return NgramDrafter(self.pool, self.eot, self.min_ngram)

    def start(self, state: TargetState, prompt: list[int]) -> None:
        self.finish_window()
        self._window = NgramPool(self.pool.max_ngram)
        self._prompt_len = len(prompt)

    def finish_window(self) -> None:
        """Add the current window's hypothesis to the run's pool."""
        if self._window.tokens:
            self.pool.add([*self._window.tokens, self.eot])
            self._window = NgramPool(self.pool.max_ngram)

    def propose(self, request: DraftRequest) -> DraftProposal:
        context = request.tokens[request.prompt_len :]
        found = self._window.lookup(context, self.min_ngram) or self.pool.lookup(context, self.min_ngram)
        if not found:
            return DraftProposal([], [])
        draft = found[: request.budget]
        if self.eot in draft:
            draft = draft[: draft.index(self.eot) + 1]
        return DraftProposal(draft, chain_parents(len(draft)), [1.0] * len(draft))

    def commit(self, tokens: list[int]) -> None:
        self._window.extend(tokens[self._prompt_len + len(self._window.tokens) :])
