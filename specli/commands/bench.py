"""``specli bench``: parse options, run :func:`specli.bench.runner.run_bench`, write the report."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from specli.bench.peers import PEERS
from specli.bench.render import write_report
from specli.bench.report import Bins
from specli.bench.runner import BenchOptions, run_bench


def _csv(_ctx, _param, value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


def _edges(_ctx, _param, value: str) -> tuple[float, ...]:
    try:
        edges = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter("comma-separated seconds, e.g. 3,6") from None
    if list(edges) != sorted(set(edges)):
        raise click.BadParameter("bin edges must be strictly ascending")
    return edges


@click.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--presets", required=True, callback=_csv, help="Comma-separated preset names or TOML files.")
@click.option("--baseline", help="Preset the speedups are relative to (default: first AR preset, else whisper-base-ar).")
@click.option("--peers", default="", callback=_csv, help=f"Comma-separated peers: {', '.join(PEERS)}.")
@click.option("--references", help="'sidecar' (.txt beside each clip) or a TSV manifest path<TAB>text.")
@click.option("--repeat", type=click.IntRange(1), default=3, show_default=True, help="Measured passes.")
@click.option("--warmup/--no-warmup", default=True, show_default=True, help="One unrecorded pass first.")
@click.option("--threads", type=click.IntRange(1), help="CPU threads (torch and CTranslate2).")
@click.option("--language", help="Language code; omit to detect it (peers reuse the baseline's).")
@click.option("--timestamps/--no-timestamps", default=False, show_default=True,
              help="Presets decode timestamp tokens (peers never do).")
@click.option("--bins", "bins", default="3,6", show_default=True, callback=_edges,
              help="Utterance-length bin edges in seconds.")
@click.option("--plots/--no-plots", default=True, show_default=True, help="PNG plots when matplotlib is installed.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("bench-out"),
              show_default=True)
@click.option("--quiet", "-q", is_flag=True, help="No per-run progress lines on stderr.")
def bench(inputs, presets, baseline, peers, references, repeat, warmup, threads, language, timestamps, bins,
          plots, out, quiet) -> None:
    """Speedup report of presets (and peers) against a baseline on the same inputs, interleaved."""
    for p in peers:
        if p not in PEERS:
            raise click.BadParameter(f"unknown peer {p!r}; choose from {', '.join(PEERS)}", param_hint="--peers")
    opts = BenchOptions(tuple(presets), baseline, tuple(peers), repeat, warmup, threads, language, timestamps)
    progress = None if quiet else (lambda line: click.echo(line, err=True))
    argv = sys.argv if Path(sys.argv[0]).name == "specli" else ["specli", "bench", *inputs, "--presets", ",".join(presets)]
    command = shlex.join(["specli", *argv[1:]])
    report = run_bench(inputs, opts, references, Bins(bins), progress, command)
    written = write_report(report, out, plots)
    for s in report["summaries"]:
        ll, e2e = s["lossless"], s["speedup_e2e"]
        same = (f"{ll['identical']}/{ll['compared']} identical vs {ll['reference']}" if ll["reference"]
                else "baseline" if s["system"] == report["baseline"] else "no same-model reference")
        click.echo(f"{s['system']:32s} wall {s['wall_seconds']:7.2f} s  e2e "
                   f"{'-' if e2e is None else f'{e2e:.2f}x':>6s}  {same}", err=True)
    click.echo(f"wrote {', '.join(str(p) for p in written)}", err=True)
