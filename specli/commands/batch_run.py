"""What the batch commands (transcribe, translate, synthesize) share around the library's run
(:mod:`specli.io.batch`): the resume mode from --overwrite / --skip-existing, and the end of a (sharded) run."""

from __future__ import annotations

from collections.abc import Callable

import click

from specli.io.resume import ResumeMode
from specli.io.sharding import ShardedRun, report_lines


def resume_mode(overwrite: bool, skip_existing: bool) -> ResumeMode:
    """What a rerun does with an input whose outputs exist: redo those made with other settings ("changed"),
    every one (--overwrite) or none (--skip-existing); both flags at once are a usage error."""
    if overwrite and skip_existing:
        raise click.UsageError("--overwrite and --skip-existing exclude each other")
    return "overwrite" if overwrite else "skip-existing" if skip_existing else "changed"


def finish_run(run: ShardedRun, summary: str, failed: bool, record_line: Callable[[dict], str]) -> None:
    """End a run: this rank's ``summary`` line (after ``rank N: `` when distributed), then gather every rank's
    rows (rank 0 writes the manifest and prints the gathered JSON records, one ``record_line`` each, then the
    totals over every rank); exit 1 when this rank ``failed`` or any rank had a failure (every rank alike)."""
    click.echo(f"rank {run.shard.rank}: " * run.shard.distributed + summary, err=True)
    report = run.finish()  # a distributed run: every rank's rows, manifest by rank 0; the same report everywhere
    for record in report.records if run.shard.rank == 0 else ():
        click.echo(record_line(record))
    for line in report_lines(report, run.shard):
        click.echo(line, err=True)
    if failed or report.exit_code:
        raise SystemExit(1)
