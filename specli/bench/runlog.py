"""``runs.jsonl``: every measured run (and skip) on disk as soon as it finishes, before any report.

Line 1 is a header (systems, baseline, options, inputs, machine); then one ``{"kind": "run", ...}`` or
``{"kind": "skip", ...}`` object per line. The file is rewritten atomically (temporary file + rename)
after each record, so it is always complete JSON lines, whatever happens later: a crash in the report
step loses nothing, and ``specli bench --from-runs runs.jsonl`` builds the report again from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from specli.bench.report import Run, Skip, SystemInfo
from specli.io.atomic import write_atomic

FORMAT = 1  # version of the header / record layout


@dataclass(frozen=True)
class RunLogData:
    """What a runs.jsonl holds."""

    header: dict  # systems, baseline, options, inputs, machine, ...
    runs: list[Run]  # measured runs, in the order they finished
    skips: list[Skip]  # runs a system could not do, with the reason

    @property
    def systems(self) -> list[SystemInfo]:
        return [SystemInfo(**s) for s in self.header["systems"]]

    @property
    def baseline(self) -> str:
        return str(self.header["baseline"])


class RunLog:
    """Appends records to ``path``, rewriting it atomically each time."""

    def __init__(self, path: Path, header: Mapping) -> None:
        self.path = Path(path)
        self._lines = [json.dumps({"kind": "header", "format": FORMAT, **header}, ensure_ascii=False)]
        self._flush()

    def add(self, record: Run | Skip) -> None:
        """Record one finished run or skip and put the whole file on disk."""
        if isinstance(record, Run):
            line = {"kind": "run", **record.to_dict()}
        else:
            line = {"kind": "skip", **asdict(record)}
        self._lines.append(json.dumps(line, ensure_ascii=False))
        self._flush()

    def _flush(self) -> None:
        write_atomic(self.path, "\n".join(self._lines) + "\n")


def read_runlog(path: Path) -> RunLogData:
    """Parse a runs.jsonl written by :class:`RunLog`; ValueError names the bad line."""
    header: dict | None = None
    runs: list[Run] = []
    skips: list[Skip] = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            kind = record.pop("kind")
            if kind == "header":
                header = record
            elif kind == "run":
                runs.append(Run.from_dict(record))
            elif kind == "skip":
                skips.append(Skip(**record))
            else:
                raise ValueError(f"unknown record kind {kind!r}")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path}:{number}: not a specli bench record ({exc})") from exc
    if header is None or "systems" not in header or "baseline" not in header:
        raise ValueError(f"{path}: no header line (systems, baseline): not a specli bench runs.jsonl")
    return RunLogData(header, runs, skips)
