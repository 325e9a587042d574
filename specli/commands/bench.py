"""``specli bench``: parse options, run :func:`specli.bench.runner.run_bench`, write the report."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from specli.bench.peers import PEERS
from specli.bench.render import write_report
from specli.bench.report import Bins
from specli.bench.runner import BenchOptions, report_from_runs, run_bench

RUNS_NAME = "runs.jsonl"


def _csv(_ctx, _param, value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


def _edges(_ctx, _param, value: str | None) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        edges = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter("comma-separated seconds, e.g. 3,6") from None
    if list(edges) != sorted(set(edges)):
        raise click.BadParameter("bin edges must be strictly ascending")
    return edges


@click.command()
@click.argument("inputs", nargs=-1)
@click.option("--presets", callback=_csv, help="Comma-separated preset names or TOML files.")
@click.option("--baseline", help="Preset name or TOML file the speedups are relative to "
              "(default: first AR preset, else whisper-base-ar).")
@click.option("--peers", default="", callback=_csv, help=f"Comma-separated peers: {', '.join(PEERS)}.")
@click.option("--references", help="'sidecar' (.txt beside each clip) or a TSV manifest path<TAB>text.")
@click.option("--repeat", type=click.IntRange(1), default=3, show_default=True, help="Measured passes.")
@click.option("--warmup/--no-warmup", default=True, show_default=True, help="One unrecorded pass first.")
@click.option("--threads", type=click.IntRange(1), help="CPU threads (torch and CTranslate2).")
@click.option("--language", help="Language code; omit to detect it (peers reuse the baseline's).")
@click.option("--timestamps/--no-timestamps", default=None,
              help="Timestamp tokens for presets and peers alike.  [default: only on clips over 30 s, which "
              "Whisper decodes long-form, seeking by them]")
@click.option("--bins", "bins", callback=_edges,
              help="Utterance-length bin edges in seconds.  [default: 3,6; with --from-runs: the run's]")
@click.option("--plots/--no-plots", default=True, show_default=True, help="PNG plots when matplotlib is installed.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("bench-out"),
              show_default=True)
@click.option("--quiet", "-q", is_flag=True, help="No per-run progress lines on stderr.")
@click.option("--from-runs", "from_runs", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help=f"Measure nothing: build the report again from a {RUNS_NAME} an earlier run wrote.")
@click.option("--device", help="Run every preset (and peer) on: auto, cpu, cuda, cuda:N (default: each preset's).")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
              help="Every preset in this dtype (default: each preset's; auto = float32 on CPU, float16 on CUDA).")
def bench(inputs, presets, baseline, peers, references, repeat, warmup, threads, language, timestamps, bins,
          plots, out, quiet, from_runs, device, dtype) -> None:
    """Speedup report of presets (and peers) against a baseline on the same inputs, interleaved.

    Every measured run is written to OUT/runs.jsonl as it finishes, before the report is built."""
    if from_runs is not None:
        report = report_from_runs(from_runs, references, None if bins is None else Bins(bins))
        _finish(report, out, plots)
        return
    if not inputs:
        raise click.UsageError("give INPUTS to measure (or --from-runs to rebuild a report)")
    if not presets:
        raise click.UsageError("missing option '--presets'")
    if _synthesis_presets(presets):
        _bench_synthesis(inputs, presets, baseline, repeat, warmup, threads, out, quiet)
        return
    for p in peers:
        if p not in PEERS:
            raise click.BadParameter(f"unknown peer {p!r}; choose from {', '.join(PEERS)}", param_hint="--peers")
    opts = BenchOptions(tuple(presets), baseline, tuple(peers), repeat, warmup, threads, language, timestamps,
                        device, dtype)
    progress = None if quiet else (lambda line: click.echo(line, err=True))
    argv = (sys.argv if Path(sys.argv[0]).name == "specli"
            else ["specli", "bench", *inputs, "--presets", ",".join(presets)])
    command = shlex.join(["specli", *argv[1:]])
    runs_path = out / RUNS_NAME
    edges = Bins() if bins is None else Bins(bins)
    report = run_bench(inputs, opts, references, edges, progress, command, runs_path,
                       warn=lambda line: click.echo(f"warning: {line}", err=True))
    _finish(report, out, plots, runs_path)


def _synthesis_presets(presets: tuple[str, ...]) -> bool:
    """True when the presets are synthesis presets (``task = "synthesize"``); mixing is an error."""
    from specli.presets import read_preset_toml

    kinds = {read_preset_toml(p)[1].get("task", "transcribe") for p in presets}
    if len(kinds) > 1:
        raise click.UsageError("--presets mixes transcription and synthesis presets")
    return kinds == {"synthesize"}


def _bench_synthesis(inputs, presets, baseline, repeat, warmup, threads, out: Path, quiet: bool) -> None:
    """Synthesis presets: INPUTS are text files / JSONL manifests (see specli.bench.synthesis)."""
    import torch

    from specli.bench.synthesis import (SynthesisBenchOptions, run_synthesis_bench, summary_lines,
                                        write_synthesis_report)

    if threads:
        torch.set_num_threads(threads)
    opts = SynthesisBenchOptions(tuple(presets), baseline, repeat, warmup)
    try:
        report = run_synthesis_bench(inputs, opts, None if quiet else (lambda line: click.echo(line, err=True)))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    written = write_synthesis_report(report, out)
    for line in summary_lines(report):
        click.echo(line, err=True)
    click.echo(f"wrote {', '.join(str(p) for p in written)}", err=True)


def _finish(report: dict, out: Path, plots: bool, runs_path: Path | None = None) -> None:
    """Write the report files and print the per-system summary lines on stderr."""
    written = write_report(report, out, plots)
    for s in report["summaries"]:
        ll, e2e = s["lossless"], s["speedup_e2e"]
        same = (f"{ll['identical']}/{ll['compared']} identical vs {ll['reference']}" if ll["reference"]
                else "baseline" if s["system"] == report["baseline"] else "no same-model reference")
        click.echo(f"{s['system']:32s} wall {s['wall_seconds']:7.2f} s  e2e "
                   f"{'-' if e2e is None else f'{e2e:.2f}x':>6s}  {same}", err=True)
    if report["skipped"]:
        files = len({k["file"] for k in report["skipped"]})
        click.echo(f"warning: {len(report['skipped'])} system/file pair(s) skipped on {files} file(s); "
                   f"see 'Skipped runs' in {out / 'report.md'}", err=True)
    runs = [runs_path] if runs_path is not None else []
    click.echo(f"wrote {', '.join(str(p) for p in [*runs, *written])}", err=True)
