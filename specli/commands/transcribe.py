"""``specli transcribe`` and ``specli translate``: parse options, build the engine, run, write."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import click
import torch

from specli.audio import audio_duration
from specli.batch import discover, plan_outputs, run_batch
from specli.engines.strategies import load_engine
from specli.engines.transcription import TranscribeOptions
from specli.errors import AudioError
from specli.presets import DEFAULT_PRESET, load_preset
from specli.progress import BatchProgress, RunSummary
from specli.writers import FORMATS, result_record


def _options(f):
    opts = [
        click.argument("inputs", nargs=-1, required=True),
        click.option("--preset", default=DEFAULT_PRESET, show_default=True, help="Preset name or TOML file."),
        click.option("--model", help="Override the preset's model: bundled name, HF id/dir, CTranslate2 dir."),
        click.option("--language", help="Language code; omit to detect it per file."),
        click.option("--output-dir", "-o", type=click.Path(file_okay=False, path_type=Path), default=Path(".")),
        click.option("--output-format", "-f", type=click.Choice([*FORMATS, "all"]), default="txt", show_default=True),
        click.option("--jsonl", "jsonl", type=click.Choice(["-"]), help="Also print one JSON record per file to stdout."),
        click.option("--overwrite", is_flag=True, help="Redo inputs whose outputs already exist."),
        click.option("--fail-fast", is_flag=True, help="Stop at the first failed input."),
        click.option("--threads", type=click.IntRange(1), help="CPU threads for torch (default: torch's choice)."),
        click.option("--device", type=click.Choice(["cpu"]), default="cpu", show_default=True),
        click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), help="Override the preset's dtype."),
        click.option("--timestamps/--no-timestamps", default=True, show_default=True),
        click.option("--compile-encoder", is_flag=True, help="torch.compile the encoder (tens of seconds once)."),
        click.option("--progress/--no-progress", default=None, help="Progress on stderr (default: when a terminal)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _read_inputs(inputs: tuple[str, ...]) -> list[str]:
    paths = [i for i in inputs if i != "-"]
    if "-" in inputs:
        paths += [line.strip() for line in sys.stdin if line.strip()]
    return paths


def _safe_duration(path: Path) -> float:
    try:
        return audio_duration(path)
    except AudioError:
        return 0.0


def _run(task: str, inputs, preset, model, language, output_dir, output_format, jsonl, overwrite, fail_fast,
         threads, device, dtype, timestamps, compile_encoder, progress) -> None:
    if threads:
        torch.set_num_threads(threads)
    p = load_preset(preset)
    opts = TranscribeOptions(task=task, language=language, timestamps=timestamps)
    found, bad = discover(_read_inputs(inputs))
    items = plan_outputs(found, output_dir)
    formats = list(FORMATS) if output_format == "all" else [output_format]
    engine = load_engine(p, model, dtype, language, compile_encoder)
    if engine.model.target.compiled_encoder is not None:
        click.echo(f"encoder compiled in {engine.model.target.compiled_encoder.compile_seconds:.1f} s", err=True)
    summary = RunSummary()
    with BatchProgress(len(items), sum(_safe_duration(i.path) for i in items), progress) as bar:
        outcomes = run_batch(engine.model, items, opts, formats, overwrite, decode=engine.decode,
                             on_window=lambda _p, s: bar.window(s))
        for outcome in itertools.chain(bad, outcomes):
            summary.add(outcome)
            if outcome.error:
                bar.message(f"failed: {outcome.error}")
            elif outcome.result is not None:
                bar.file_done(outcome.result.stats.audio_seconds)
                if jsonl:
                    click.echo(json.dumps(result_record(outcome.result, str(outcome.path)), ensure_ascii=False))
            if outcome.error and fail_fast:
                break
    click.echo(summary.line(), err=True)
    if summary.failed:
        raise SystemExit(1)


@click.command()
@_options
def transcribe(**kwargs) -> None:
    """Transcribe audio files and directories (or '-' for paths on stdin)."""
    _run("transcribe", **kwargs)


@click.command()
@_options
def translate(**kwargs) -> None:
    """Translate speech into English text (Whisper's translate task)."""
    _run("translate", **kwargs)
