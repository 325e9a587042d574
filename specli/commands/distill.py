"""``specli distill``: on-policy data for EAGLE Speech-Draft heads, and their training."""

from __future__ import annotations

from pathlib import Path

import click

from specli.errors import SpecliError


@click.group()
def distill() -> None:
    """Distil an EAGLE Speech-Draft head from a preset's target model."""


def _load_target(preset_name: str):
    from specli.engines.targets.loader import load_whisper
    from specli.presets import load_preset

    preset = load_preset(preset_name)
    return load_whisper(preset.model, preset.dtype)


@distill.command("data")
@click.argument("inputs", nargs=-1, required=True)
@click.option("--preset", "preset_name", required=True, help="Preset whose model labels the audio.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Shard directory (resumable: inputs in its manifest are skipped).")
@click.option("--timestamps/--no-timestamps", default=True, show_default=True,
              help="Decode as `transcribe` does with / without timestamp tokens.")
@click.option("--quiet", "-q", is_flag=True, help="No per-file progress lines on stderr.")
def data(inputs, preset_name, out, timestamps, quiet) -> None:
    """Transcribe INPUTS greedily with the target (as inference does) and store training shards."""
    from specli.batch import discover
    from specli.distill.data import generate
    from specli.engines.transcription import TranscribeOptions

    found, bad = discover(inputs)
    for outcome in bad:
        click.echo(f"error: {outcome.error}", err=True)
    if not found:
        raise SpecliError("no audio input")
    model = _load_target(preset_name)
    progress = None if quiet else (lambda msg, done, total: click.echo(f"[{done}/{total}] {msg}", err=True))
    summary = generate([f for f, _root in found], model, out, progress, TranscribeOptions(timestamps=timestamps))
    click.echo(f"{summary.done} file(s), {summary.windows} window(s) written; {summary.skipped} already done "
               f"-> {out}", err=True)


@distill.command("train")
@click.argument("data_dirs", nargs=-1, required=True, type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--preset", "preset_name", required=True, help="Preset whose model is the target.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("eagle-head"),
              show_default=True, help="Head directory (checkpoints under OUT/checkpoints; resumes).")
@click.option("--val", "val_dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Held-out shard directory (other sources) for the acceptance length each epoch.")
@click.option("--epochs", type=click.IntRange(1), default=1, show_default=True)
@click.option("--steps", type=click.IntRange(0), default=0, show_default=True, help="Stop after N steps (0 = none).")
@click.option("--lr", type=click.FloatRange(0, min_open=True), default=3e-4, show_default=True)
@click.option("--batch", type=click.IntRange(1), default=4, show_default=True, help="Windows per step.")
@click.option("--checkpoint-every", type=click.IntRange(1), default=100, show_default=True)
@click.option("--val-every", type=click.IntRange(1), default=1, show_default=True, help="Validate every N epochs.")
@click.option("--draft-vocab", type=click.IntRange(0), default=8192, show_default=True,
              help="Rows of the head's vocabulary (most frequent in the data + specials; 0 = all).")
@click.option("--quiet", "-q", is_flag=True, help="No per-step progress lines on stderr.")
def train(data_dirs, preset_name, out, val_dir, epochs, steps, lr, batch, checkpoint_every, val_every, draft_vocab,
          quiet) -> None:
    """Train a head on the shards of DATA_DIRS (unrolled K=7, beta=0.8) and save it to OUT."""
    from specli.distill.data import load_windows
    from specli.distill.train import TrainOptions
    from specli.distill.train import train as run_train

    model = _load_target(preset_name)
    opts = TrainOptions(epochs=epochs, steps=steps, lr=lr, batch=batch, checkpoint_every=checkpoint_every,
                        draft_vocab=draft_vocab, val_every=val_every)
    val = load_windows(val_dir) if val_dir else None
    progress = None if quiet else (lambda msg: click.echo(msg, err=True))
    try:
        windows = [w for d in data_dirs for w in load_windows(d)]
        summary = run_train(windows, model, out, opts, val, progress)
    except ValueError as exc:
        raise SpecliError(str(exc)) from exc
    acc = "-" if summary.val_acceptance is None else (
        f"{summary.val_acceptance:.3f} (best {summary.best_acceptance:.3f}, saved)")
    click.echo(f"{summary.steps} step(s), loss {summary.last_loss:.4f}, validation acceptance {acc}, "
               f"{summary.seconds_per_step:.2f} s/step -> {summary.head_dir}", err=True)
