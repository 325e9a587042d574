"""The batch-run skeleton every pipeline shares (transcription, synthesis): one :class:`Outcome` per input, outcomes
released in input order while the work finishes in any order (:class:`InOrder`, :func:`in_input_order`), and the
run-manifest row of an outcome (:func:`manifest_row`, gathered by :mod:`specli.io.sharding`).

The contract: every input gets exactly one outcome, ok (its outputs written), failed (a one-line reason; the batch
goes on) or skipped (its outputs kept by resume, :mod:`specli.io.resume`); outcomes are reported in input order,
whatever the batch size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Literal, TypeVar

R = TypeVar("R")  # what a pipeline makes of one input (a transcript, speech tokens, audio)
O = TypeVar("O")  # an outcome

Status = Literal["ok", "failed", "skipped"]  # an outcome's status, as the run manifest writes it


@dataclass(frozen=True)
class Outcome(Generic[R]):
    """What happened to one input: made now (``result``), failed (``error``) or skipped (its outputs kept)."""

    input: Path | str  # the input as messages and the manifest name it: an audio file, or a text line "file:line"
    result: R | None = None  # what the pipeline made of it, when made now
    error: str | None = None  # one-line reason, when it failed
    skipped: bool = False  # its outputs were kept (made with the same settings, or --skip-existing)
    outputs: tuple[Path, ...] = ()  # its files on disk, written now or kept (none when it failed)
    record: dict | None = None  # its JSON record (read back from its sidecar when skipped; None if absent)
    id: str = ""  # the name its outputs take when the input does not give it (a synthesis line's request id)

    @property
    def path(self) -> Path:
        """The input as a file path (a transcription's input is an audio file)."""
        return Path(self.input)

    @property
    def status(self) -> Status:
        return "failed" if self.error else "skipped" if self.skipped else "ok"


class InOrder(Generic[O]):
    """Outcomes keyed by input position, released in input order: one that finishes early waits for those
    before it."""

    def __init__(self) -> None:
        self._done: dict[int, O] = {}  # settled and not yet released, by input position
        self.released = 0  # the next input position to release

    def settle(self, k: int, out: O) -> list[O]:
        """Input ``k``'s outcome; returns it and every later known one, once all before them are known."""
        self._done[k] = out
        ready = []
        while self.released in self._done:
            ready.append(self._done.pop(self.released))
            self.released += 1
        return ready

    def waiting(self) -> list[O]:
        """The outcomes settled but held back (an earlier one unknown), in input order; they are released."""
        ready = [self._done.pop(k) for k in sorted(self._done)]
        return ready


def in_input_order(outcomes: Iterable[tuple[int, O]]) -> Iterator[O]:
    """``(input position, outcome)`` pairs in completion order, yielded in input order.

    On Ctrl-C (KeyboardInterrupt) the outcomes held back are yielded too (input order, gaps allowed): what
    finished is written, so it is reported before the interrupt goes on."""
    order: InOrder[O] = InOrder()
    try:
        for k, out in outcomes:
            yield from order.settle(k, out)
    except KeyboardInterrupt:
        yield from order.waiting()
        raise


def manifest_row(out: Outcome, measures: Mapping[str, object], with_record: bool, named: bool = False) -> dict:
    """The run-manifest row of one outcome (:meth:`specli.io.sharding.ShardedRun.add`): its input (and its ``id``
    when ``named``), status, outputs and error, then the pipeline's ``measures`` (audio seconds, tokens); its JSON
    record too when ``with_record`` and it has one (rank 0 prints the gathered records)."""
    row: dict = {"input": str(out.input), **({"id": out.id} if named else {}), "status": out.status,
                 "outputs": [str(o) for o in out.outputs], "error": out.error or None, **measures}
    if with_record and out.record is not None:
        row["record"] = out.record
    return row
