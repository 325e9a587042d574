"""``specli distill labels`` / ``specli distill rebuild``: small committed labels <-> training shards.

Shards of ``distill data`` are large (fp16 encoder outputs and hidden states) and live outside git; labels
(:mod:`specli.distill.labels`) are token ids and window spans, small enough to commit, and rebuild the shards on
any machine that has the audio.
"""

from __future__ import annotations

from pathlib import Path

import click

from specli.commands.interrupt import report_interrupt
from specli.distill.labels import export_labels, read_labels, rebuild
from specli.models.whisper.loader import load_whisper
from specli.presets import load_preset


@click.command("labels")
@click.argument("data_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--out", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Label file to write (JSON lines; replaced atomically).")
def labels(data_dir: Path, out: Path) -> None:
    """Write the labels of DATA_DIR's Whisper shards (`distill data` output): per window the audio file's path
    and sha256, the window's span, the prompt length, the token ids and the decode temperature."""
    summary = export_labels(data_dir, out)
    click.echo(f"{summary.files} file(s), {summary.windows} window(s), {summary.tokens} token(s) -> {out}", err=True)


@click.command("rebuild")
@click.argument("label_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--preset", "preset_name", required=True, help="Whisper preset whose model made the labels.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Shard directory (resumable: files in its manifest are skipped).")
@click.option("--audio-dir", "search", multiple=True, type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Where to look for audio not found at its recorded path (by file name, checked by sha256; "
              "repeatable).")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16", "int8"]),
              help="The target's dtype (default: the labels').")
@click.option("--quiet", "-q", is_flag=True, help="No per-file progress lines on stderr.")
def rebuild_shards(label_file: Path, preset_name: str, out: Path, search: tuple[Path, ...], dtype: str | None,
                   quiet: bool) -> None:
    """Recompute `distill data` shards from LABEL_FILE (`distill labels` output) and the audio it names: the
    same encoder outputs and hidden states, without decoding again."""
    header, _ = read_labels(label_file)
    preset = load_preset(preset_name)
    model = load_whisper(preset.model, dtype or header.get("dtype") or preset.dtype)
    progress = None if quiet else (lambda msg, done, total: click.echo(f"[{done}/{total}] {msg}", err=True))
    with report_interrupt(lambda: f"shards so far are in {out}; the same command resumes after them"):
        summary = rebuild(label_file, model, out, search, progress)
    click.echo(f"{summary.done} file(s), {summary.windows} window(s) rebuilt; {summary.skipped} already done "
               f"-> {out}", err=True)
