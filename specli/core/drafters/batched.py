"""Drafters of a batch of rows (core/batched.py): the per-row adapter (the protocol, :class:`BatchDrafter`, lives
with :class:`~specli.core.drafters.base.Drafter`, whose ``batched`` returns one).

A batch drafter keeps one drafting state per slot of the batch; the decoder tells it when a row is
admitted, when a row leaves, and when the last row is moved into a freed slot (the batch stays
compacted). :class:`PerRowDrafters` runs one ordinary :class:`~specli.core.drafters.base.Drafter`
per row, so every existing drafter (n-gram pool, model drafters, EAGLE) drafts inside a batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specli.core.drafters.base import EMPTY, BatchDrafter, Drafter, DraftProposal, DraftRequest
from specli.core.types import TargetState


class PerRowDrafters:
    """A :class:`BatchDrafter` made of one :class:`Drafter` per row, built by ``make()`` at admission.

    Rows draft one after another (each with its own state, filter and generator). Each drafter is told when its
    row ends (:meth:`Drafter.finish_window`), so a shared pool (the n-gram drafter) learns each finished hypothesis.
    Drafters of finished rows are reused for new rows (``start`` resets a drafter's per-window state), so at most
    ``capacity`` are ever built.
    """

    def __init__(self, make: Callable[[], Drafter]) -> None:
        self.make = make
        self.rows: dict[int, Drafter] = {}  # slot -> that row's drafter
        self._idle: list[Drafter] = []  # drafters of finished rows, ready for new ones

    def admit(self, slot: int, state: TargetState, prompt: list[int]) -> None:
        drafter = self._idle.pop() if self._idle else self.make()
        drafter.start(state, prompt)
        self.rows[slot] = drafter

    def propose(self, requests: Sequence[DraftRequest | None]) -> list[DraftProposal]:
        return [EMPTY if r is None else self.rows[b].propose(r) for b, r in enumerate(requests)]

    def commit(self, slot: int, tokens: list[int]) -> None:
        self.rows[slot].commit(tokens)

    def finish(self, slot: int) -> None:
        drafter = self.rows.pop(slot)
        drafter.finish_window()
        self._idle.append(drafter)

    def move(self, src: int, dst: int) -> None:
        self.rows[dst] = self.rows.pop(src)


def batch_drafter(drafter: Drafter, capacity: int) -> BatchDrafter | None:
    """``drafter`` drafting for a batch of ``capacity`` rows: its own batch drafter (:meth:`Drafter.batched`), else
    one fork per row (:class:`PerRowDrafters`), else None (it cannot draft beside other sequences)."""
    batched = drafter.batched(capacity)
    if batched is not None:
        return batched
    if drafter.fork() is None:
        return None
    return PerRowDrafters(drafter.fork)
