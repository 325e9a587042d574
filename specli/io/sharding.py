"""Sharding a batch across processes: ``torchrun ... -m specli`` or ``accelerate launch -m specli``.

Under a distributed launch (``WORLD_SIZE`` > 1 in the environment) every process discovers the same
inputs, takes a contiguous share of them in input order (accelerate's ``split_between_processes``: the
first ``n % world`` ranks get one more), runs the ordinary per-input pipeline over that share (its own
outputs, written atomically, skipped on a rerun by the usual resume rules), and sends one small row per
input to every rank (``gather_object``). Rank 0 writes the run manifest: one JSON line per input in input
order (``input``, ``status`` ok / skipped / failed / not-run, ``outputs``, ``error``, ``rank``, ...),
then one ``{"summary": {...}}`` line with the totals and the failures. Every rank then exits with the
same code (1 when any rank had a failure).

The processes only exchange these rows, so the process group is always gloo over TCP (also on GPU
machines: no NCCL watchdog aborts a rank that waits for a slower one), with a long timeout. On CUDA each
process takes the device ``LOCAL_RANK % device_count`` as its current device, which ``--device auto``
then uses. A single process without a launcher never imports accelerate and behaves as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import torch

from specli.errors import SpecliError, UsageError
from specli.io.atomic import write_atomic

T = TypeVar("T")

DEFAULT_MANIFEST = "specli-run.jsonl"  # under --output-dir, written by rank 0 of a distributed launch
STATUSES = ("ok", "skipped", "failed", "not-run")  # a manifest row's status; not-run: its rank stopped first
SHARD_TIMEOUT = timedelta(days=7)  # how long a rank that finished its share waits for the others


def launched_world_size(env: Mapping[str, str] = os.environ) -> int:
    """The number of processes a launcher started (``WORLD_SIZE``; 1 without a launcher)."""
    raw = env.get("WORLD_SIZE", "").strip()
    try:
        return max(int(raw), 1) if raw else 1
    except ValueError:
        raise UsageError(f"WORLD_SIZE must be an integer, not {raw!r}") from None


@dataclass(frozen=True)
class Shard:
    """This process's place in the launch: rank ``rank`` of ``world`` (0 of 1 without a launcher)."""

    rank: int = 0  # this process's global rank
    world: int = 1  # processes in the launch
    state: object | None = None  # accelerate's PartialState when distributed, else None

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def indices(self, n: int) -> list[int]:
        """The positions (of ``n`` inputs) this rank handles: a contiguous run, in input order."""
        if self.state is None:
            return list(range(n))
        with self.state.split_between_processes(list(range(n))) as mine:
            return list(mine)

    def gather(self, rows: list) -> list:
        """Every rank's ``rows`` (picklable), concatenated in rank order; each rank gets the whole list."""
        if self.state is None:
            return list(rows)
        from accelerate.utils import gather_object

        return gather_object(list(rows))

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        if self.state is not None:
            self.state.wait_for_everyone()


def connect(env: Mapping[str, str] = os.environ) -> Shard:
    """Join the launch described by ``env`` (a single :class:`Shard` of 1 without one).

    :class:`UsageError` when launched with several processes but accelerate is not installed, or when
    accelerate does not see the processes (so every rank would otherwise do all the work).
    """
    world = launched_world_size(env)
    if world == 1:
        return Shard()
    try:
        from accelerate import PartialState
    except ImportError:
        raise UsageError(f"a launch with {world} processes needs accelerate: pip install 'specli[shard]'") from None
    if torch.cuda.is_available():
        torch.cuda.set_device(int(env.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    state = PartialState(cpu=True, backend="gloo", timeout=SHARD_TIMEOUT)
    if state.num_processes != world:
        raise UsageError(f"WORLD_SIZE is {world} but accelerate joined {state.num_processes} process(es): "
                         "launch with torchrun or accelerate launch")
    return Shard(state.process_index, state.num_processes, state)


def manifest_rows(labels: Sequence[str], rows: Iterable[dict]) -> list[dict]:
    """One row per input in input order: the gathered ``rows`` (each with its input's ``index``) by
    position, and a ``not-run`` row for an input no rank reported. ValueError on a reported twice."""
    by_index: dict[int, dict] = {}
    for row in rows:
        i = row["index"]
        if i in by_index:
            raise ValueError(f"input {i} ({labels[i]}) was reported by two ranks")
        by_index[i] = row
    out = []
    for i, label in enumerate(labels):
        row = by_index.get(i, {"index": i, "input": label, "status": "not-run"})
        out.append({k: v for k, v in row.items() if k != "record"})
    return out


def run_totals(rows: Sequence[dict], world: int, wall_seconds: float) -> dict:
    """The summary line of a manifest: counts by status, audio seconds, failures (input and reason)."""
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    return {"inputs": len(rows), **{k.replace("-", "_"): v for k, v in counts.items()},
            "audio_seconds": round(sum(r.get("audio_seconds", 0.0) for r in rows), 3),
            "world_size": world, "wall_seconds": round(wall_seconds, 3),
            "failures": [{"input": r["input"], "error": r.get("error")} for r in rows if r["status"] == "failed"]}


def write_manifest(path: Path, rows: Sequence[dict], totals: dict) -> None:
    """The run manifest at ``path`` (atomically): a JSON line per input, then ``{"summary": totals}``."""
    lines = [json.dumps(r, ensure_ascii=False) for r in rows] + [json.dumps({"summary": totals}, ensure_ascii=False)]
    write_atomic(path, "\n".join(lines) + "\n")


@dataclass(frozen=True)
class RunReport:
    """What a sharded run ended with, the same on every rank."""

    rows: list[dict]  # one per input, input order (records dropped)
    totals: dict  # the manifest's summary
    records: list[dict]  # the gathered JSON records (input order), when rows carried them
    manifest: Path | None  # the manifest written (by rank 0), or None

    @property
    def exit_code(self) -> int:
        return 1 if self.totals["failed"] else 0


@dataclass
class ShardedRun:
    """One command run over ``labels`` (every input, input order), sharded when launched distributed.

    ``take`` gives this rank its share, ``add`` records a row per processed input (in share order),
    ``finish`` gathers, writes the manifest on rank 0 and returns the same :class:`RunReport` everywhere.
    The manifest goes to ``manifest`` or, under a distributed launch, ``output_dir / DEFAULT_MANIFEST``.
    """

    labels: list[str]  # every input of the run, as the manifest names them, in input order
    manifest: Path | None = None  # where the manifest goes (None: nowhere in a single process)
    shard: Shard = field(default_factory=Shard)  # this process's place in the launch
    mine: list[int] = field(default_factory=list)  # the positions this rank handles
    rows: list[dict] = field(default_factory=list)  # this rank's rows so far
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def start(cls, labels: Sequence[str], manifest: Path | None, output_dir: Path, shard: Shard | None = None
              ) -> ShardedRun:
        """Join the launch and check that every rank found the same inputs (UsageError otherwise)."""
        shard = shard or connect()
        labels = list(labels)
        digest = hashlib.sha256("\0".join(labels).encode()).hexdigest()
        if len(set(shard.gather([digest]))) > 1:
            raise UsageError("the ranks found different inputs: every process must see the same files")
        if manifest is None and shard.distributed:
            manifest = output_dir / DEFAULT_MANIFEST
        return cls(labels, manifest, shard, shard.indices(len(labels)))

    def take(self, items: Sequence[T]) -> list[T]:
        """This rank's share of ``items`` (parallel to ``labels``)."""
        return [items[i] for i in self.mine]

    def add(self, row: dict) -> None:
        """The row of an input of this rank's share still to come (``status`` and what the manifest shows;
        ``input``: its label). Rows come in input order, except the files already written when a batched
        run is interrupted."""
        added = {r["index"] for r in self.rows}
        pending = [i for i in self.mine if i not in added]
        label = row.get("input")
        index = next((i for i in pending if label is None or self.labels[i] == label), None)
        if index is None:
            raise ValueError(f"row for {label!r}: not an input of this rank still to come")
        self.rows.append({"index": index, **row, "rank": self.shard.rank})

    def finish(self) -> RunReport:
        """Gather every rank's rows; rank 0 writes the manifest; every rank returns the same report."""
        gathered = self.shard.gather(self.rows)
        records = [r["record"] for r in sorted(gathered, key=lambda r: r["index"]) if r.get("record") is not None]
        rows = manifest_rows(self.labels, gathered)
        totals = run_totals(rows, self.shard.world, time.perf_counter() - self.started)
        try:
            if self.manifest is not None and self.shard.rank == 0:
                write_manifest(self.manifest, rows, totals)
        except OSError as exc:
            raise SpecliError(f"cannot write the run manifest {self.manifest}: {exc.strerror or exc}") from exc
        finally:
            self.shard.barrier()  # no rank exits (and gets the others torn down) before the manifest is written
        return RunReport(rows, totals, records, self.manifest)


def report_lines(report: RunReport, shard: Shard) -> list[str]:
    """The end-of-run lines of a distributed run for rank 0 to print (none elsewhere, or in a single process):
    totals over every rank and the manifest's path."""
    if not shard.distributed or shard.rank != 0:
        return []
    t = report.totals
    lines = [f"all {t['world_size']} ranks: {t['ok']} ok, {t['failed']} failed, {t['skipped']} skipped, "
             f"{t['not_run']} not run; wall {t['wall_seconds']:.1f} s"]
    if report.manifest is not None:
        lines.append(f"run manifest: {report.manifest}")
    return lines
