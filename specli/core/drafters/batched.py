"""Drafters of a batch of rows (core/batched.py): the protocol and the per-row adapter.

A batch drafter keeps one drafting state per slot of the batch; the decoder tells it when a row is
admitted, when a row leaves, and when the last row is moved into a freed slot (the batch stays
compacted). :class:`PerRowDrafters` runs one ordinary :class:`~specli.core.drafters.base.Drafter`
per row, so every existing drafter (n-gram pool, model drafters, EAGLE) drafts inside a batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from specli.core.drafters.base import EMPTY, Drafter, DraftProposal, DraftRequest, finish_window, fork
from specli.core.types import TargetState


class BatchDrafter(Protocol):
    """Proposes a draft for every active row; slots as in the decoder's batch."""

    def admit(self, slot: int, state: TargetState, prompt: list[int]) -> None:
        """A new row in ``slot``: ``state`` is that row as a batch-1 target state (after prefill)."""

    def propose(self, requests: Sequence[DraftRequest | None]) -> list[DraftProposal]:
        """One proposal per active row (``requests[b]`` for slot ``b``; None: the row has no room)."""

    def commit(self, slot: int, tokens: list[int]) -> None:
        """Row ``slot``'s committed sequence after verification (prompt + sampled, pending last)."""

    def finish(self, slot: int) -> None:
        """Row ``slot`` left the batch (its slot may be refilled by :meth:`move` or :meth:`admit`)."""

    def move(self, src: int, dst: int) -> None:
        """The row in slot ``src`` now lives in slot ``dst``."""


class PerRowDrafters:
    """A :class:`BatchDrafter` made of one :class:`Drafter` per row, built by ``make()`` at admission.

    Rows draft one after another (each with its own state, filter and generator). A drafter with a
    ``finish_window`` hook (the n-gram drafter) is told when its row ends, so a shared pool learns
    each finished hypothesis. Drafters of finished rows are reused for new rows (``start`` resets a
    drafter's per-window state), so at most ``capacity`` are ever built.
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
        finish_window(drafter)
        self._idle.append(drafter)

    def move(self, src: int, dst: int) -> None:
        self.rows[dst] = self.rows.pop(src)


def batch_drafter(drafter: Drafter, capacity: int) -> BatchDrafter | None:
    """``drafter`` drafting for a batch of ``capacity`` rows: its own batch drafter (``batched`` hook), else one
    fork per row (:class:`PerRowDrafters`), else None (it cannot draft beside other sequences)."""
    own = getattr(drafter, "batched", None)
    batched = None if own is None else own(capacity)
    if batched is not None:
        return batched
    if fork(drafter) is None:
        return None
    return PerRowDrafters(lambda: fork(drafter))
