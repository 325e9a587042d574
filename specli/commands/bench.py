"""``specli bench``: parse options, run :func:`specli.bench.runner.run_bench`, write the report."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from specli.io.outputs import check_output_dir
from specli.bench.peers import COMPUTE_TYPES, PEERS, BenchError, parse_peer
from specli.bench.render import write_report
from specli.bench.report import Bins
from specli.bench.runlog import read_runlog
from specli.bench.runner import BenchOptions, report_from_runs, run_bench
from specli.bench.synthesis import SynthesisBenchOptions, run_synthesis_bench, summary_lines, write_synthesis_report
from specli.bench.throughput import parse_batch_sizes, run_throughput, write_throughput_report
from specli.commands.interrupt import report_interrupt
from specli.core.threads import torch_threads
from specli.presets import preset_task
from specli.tts.acoustic.pipeline import AUDIO_DTYPES

RUNS_NAME = "runs.jsonl"


def _csv(_ctx, _param, value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


def _batch_sizes(_ctx, _param, value: str | None) -> tuple[int, ...]:
    try:
        return parse_batch_sizes(value) if value is not None else ()
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


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
@click.option("--peers", default="", callback=_csv,
              help=f"Comma-separated peers: {', '.join(PEERS)}; a faster-whisper peer takes a CTranslate2 compute "
              f"type after a colon ({', '.join(COMPUTE_TYPES)}), e.g. faster-whisper:int8  [default compute type: "
              "the presets' dtype where CTranslate2 has it, else float32]. Each peer runs in its own worker "
              "process (its library's thread pool never shares the presets' process).")
@click.option("--peer-timeout", "peer_timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="A peer call (one file; with --batch-sizes the whole set) that takes longer stops the peer's "
              "worker: that run and the peer's later ones are skipped, with the reason.  [default: 300 s + 20 s "
              "per audio second]")
@click.option("--references", help="'sidecar' (.txt beside each clip) or a TSV manifest path<TAB>text.")
@click.option("--repeat", type=click.IntRange(1), default=3, show_default=True, help="Measured passes.")
@click.option("--warmup/--no-warmup", default=True, show_default=True, help="One unrecorded pass first.")
@click.option("--threads", type=click.IntRange(1), help="CPU threads (torch and CTranslate2).")
@click.option("--language", help="Language code; omit to detect it (peers reuse the baseline's).")
@click.option("--task", type=click.Choice(["transcribe", "translate"]), default="transcribe", show_default=True,
              help="Presets and peers alike: transcribe, or translate (X -> English).")
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
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16", "int8"]),
              help="Every preset in this dtype (default: each preset's, auto: bfloat16 on CPUs with native bf16 "
              "(AVX512-BF16 / AMX), float32 on other CPUs, float16 on CUDA; int8: weight-only int8 decoder, CPU).")
@click.option("--batch-sizes", "batch_sizes", callback=_batch_sizes, metavar="N,N,...",
              help="Throughput mode: every system transcribes the whole input set at each batch size (e.g. "
              "1,2,4,8,16); reports audio seconds per wall second and speedup vs AR.")
@click.option("--model",
              help="Synthesis presets: every preset's model (cosyvoice2, cosyvoice3 or a checkpoint directory).")
@click.option("--audio/--no-audio", default=False, show_default=True,
              help="Synthesis presets: also render every utterance to audio (flow + vocoder): real-time factor "
              "of each stage, LLM-stage and end-to-end (text to audio) speedups.")
@click.option("--audio-dtype", type=click.Choice(AUDIO_DTYPES),
              help="With --audio: the flow's and vocoder's compute dtype (auto: bfloat16 on CPUs with native bf16, "
              "else float32); default: as synthesize (a float32 flow, the vocoder's own default).")
def bench(inputs, presets, baseline, peers, peer_timeout, references, repeat, warmup, threads, language, task,
          timestamps, bins, plots, out, quiet, from_runs, device, dtype, batch_sizes, model, audio,
          audio_dtype) -> None:
    """Speedup report of presets (and peers) against a baseline on the same inputs, interleaved.

    Every measured run is written to OUT/runs.jsonl as it finishes, before the report is built."""
    if from_runs is not None:
        if batch_sizes:
            raise click.UsageError("--from-runs rebuilds a per-file report; it takes no --batch-sizes")
        check_output_dir(out, "the --out directory")  # a usage error before the runs are read
        report = report_from_runs(from_runs, references, None if bins is None else Bins(bins))
        _finish(report, out, plots)
        return
    if not inputs:
        raise click.UsageError("give INPUTS to measure (or --from-runs to rebuild a report)")
    if not presets:
        raise click.UsageError("missing option '--presets'")
    check_output_dir(out, "the --out directory")  # a usage error before any model loads
    if _synthesis_presets(presets):
        if batch_sizes:
            raise click.UsageError("--batch-sizes measures transcription presets, not synthesis presets")
        with report_interrupt(lambda: "no report written (the runs measured so far are the lines above)"):
            _bench_synthesis(inputs, presets, baseline, repeat, warmup, threads, out, quiet, model, audio,
                             audio_dtype)
        return
    if model or audio or audio_dtype is not None:
        raise click.UsageError("--model, --audio and --audio-dtype are for synthesis presets")
    for p in peers:
        try:
            parse_peer(p)
        except BenchError as exc:
            raise click.BadParameter(str(exc), param_hint="--peers") from None
    opts = BenchOptions(tuple(presets), baseline, tuple(peers), repeat, warmup, threads, language, task,
                        timestamps, device, dtype, batch_sizes, peer_timeout)
    progress = None if quiet else (lambda line: click.echo(line, err=True))
    argv = (sys.argv if Path(sys.argv[0]).name == "specli"
            else ["specli", "bench", *inputs, "--presets", ",".join(presets)])
    command = shlex.join(["specli", *argv[1:]])
    if batch_sizes:
        with report_interrupt(lambda: "no report written (the runs measured so far are the lines above)"):
            _bench_throughput(inputs, opts, references, progress, command, out)
        return
    runs_path = out / RUNS_NAME
    edges = Bins() if bins is None else Bins(bins)
    with report_interrupt(lambda: _runs_kept(runs_path)):
        report = run_bench(inputs, opts, references, edges, progress, command, runs_path, warn=_warn)
    _finish(report, out, plots, runs_path)


def _runs_kept(runs_path: Path) -> str:
    """What an interrupted per-file bench leaves: the measured runs, and how to report them."""
    try:
        n = len(read_runlog(runs_path).runs)
    except (OSError, ValueError):  # not written yet
        n = 0
    if not n:
        return "no run was measured"
    return f"{n} measured run(s) kept in {runs_path}; `specli bench --from-runs {runs_path}` reports them"


def _warn(line: str) -> None:
    """A skipped run, as it happens (never silent, even with --quiet)."""
    click.echo(f"warning: {line}", err=True)


def _bench_throughput(inputs, opts: BenchOptions, references, progress, command: str, out: Path) -> None:
    """--batch-sizes: whole-set throughput per (system, batch size); report.json and report.md."""
    report = run_throughput(inputs, opts, references, progress, command, _warn)
    written = write_throughput_report(report, out)
    for row in report["throughput"]:
        click.echo(f"{row['system']:32s} batch {row['batch_size']:3d}  {row['throughput']:7.2f} audio s/s  "
                   f"{row['speedup_vs_ar']:.2f}x vs AR b=1", err=True)
    if report["skipped"]:
        click.echo(f"warning: {len(report['skipped'])} peer run(s) skipped; see 'Skipped runs' in "
                   f"{out / 'report.md'}", err=True)
    click.echo(f"wrote {', '.join(str(p) for p in written)}", err=True)


def _synthesis_presets(presets: tuple[str, ...]) -> bool:
    """True when the presets are synthesis presets (their family's task); mixing is an error."""
    kinds = {preset_task(p) for p in presets}
    if len(kinds) > 1:
        raise click.UsageError("--presets mixes transcription and synthesis presets")
    return kinds == {"synthesize"}


def _bench_synthesis(inputs, presets, baseline, repeat, warmup, threads, out: Path, quiet: bool, model: str | None,
                     audio: bool, audio_dtype: str | None = None) -> None:
    """Synthesis presets: INPUTS are text files / JSONL manifests (see specli.bench.synthesis)."""
    click.get_current_context().with_resource(torch_threads(threads))  # restored when the command returns
    opts = SynthesisBenchOptions(tuple(presets), baseline, repeat, warmup, model=model, audio=audio,
                                 audio_dtype=audio_dtype)
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
