"""``specli distill``: on-policy data for a preset's drafter, its training and evaluation.

Whisper presets (EAGLE Speech-Draft heads) run here; synthesis presets (DSpark / DFlash / EAGLE-3 drafters of
a CosyVoice LM) through :mod:`specli.commands.distill_speech`. Each family's own options are refused with a
preset of the other family (:func:`check_family_flags`).
"""

from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource

from specli.io.outputs import check_output_dir
from specli.asr.drafters.eagle_head import load_head
from specli.models.languages import check_model_name, normalize_language
from specli.asr.pipeline import discover
from specli.asr.windows import TranscribeOptions
from specli.commands.distill_audio_lm import (audio_lm_training, check_flags, is_audio_lm_preset,
                                              run_audio_lm_data)
from specli.commands.distill_audio_lm import DATA_FLAGS as AUDIO_LM_DATA_FLAGS
from specli.commands.distill_audio_lm import TRAIN_FLAGS as AUDIO_LM_TRAIN_FLAGS
from specli.commands.distill_labels import labels, rebuild_shards
from specli.commands.distill_speech import TrainFn, is_speech_preset, run_speech_data, speech_training
from specli.commands.interrupt import report_interrupt
from specli.distill.data import generate, load_windows, open_manifest
from specli.distill.train import TrainOptions, validate
from specli.distill.train import train as train_head
from specli.errors import SpecliError
from specli.models.whisper.loader import WhisperModel, load_whisper
from specli.presets import load_preset

# the options (parameter names) of one family only, per command: given with a preset of the other family
# they are a usage error
DATA_FLAGS = {"whisper": ("timestamps", "task", "language", "dtype", "batch_size"),
              "synthesis": ("texts", "model", "sampler", "seed", "aux_layers", "per_shard")}
TRAIN_FLAGS = {"whisper": ("val_windows", "dtype", "feature_noise", "dropout", "precision", "init_head"),
               "synthesis": ("drafter", "model", "layers", "block", "anchors", "markov_rank")}
EXPLICIT = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT, ParameterSource.PROMPT)


@click.group()
def distill() -> None:
    """Distil a drafter from a preset's target: an EAGLE Speech-Draft head (Whisper presets) or a
    DSpark / DFlash / EAGLE-3 drafter (synthesis presets, e.g. cosyvoice3-ar). Options marked 'Whisper
    presets:' or 'Synthesis presets:' are for that family only (an error with the other's)."""


distill.add_command(labels)
distill.add_command(rebuild_shards)


def _load_target(preset_name: str, dtype: str | None = None) -> WhisperModel:
    preset = load_preset(preset_name)
    return load_whisper(preset.model, dtype or preset.dtype)


def _flag(param: click.Parameter, value: object) -> str:
    """How ``param`` was spelt on the command line (its long name; ``--no-x`` for a false ``--x/--no-x``)."""
    if value is False and getattr(param, "secondary_opts", None):
        return param.secondary_opts[0]
    return next((o for o in param.opts if o.startswith("--")), param.opts[0])


def check_family_flags(preset_name: str, flags: dict[str, tuple[str, ...]]) -> bool:
    """True for a synthesis preset, False for a Whisper one; a usage error (exit 2), before any work, when
    an option of the other family (``flags``) was given explicitly (defaults do not count)."""
    speech = is_speech_preset(preset_name)
    ctx = click.get_current_context()
    foreign = flags["whisper" if speech else "synthesis"]
    given = [p for p in ctx.command.params if p.name in foreign and ctx.get_parameter_source(p.name) in EXPLICIT]
    if given:
        names = ", ".join(_flag(p, ctx.params.get(p.name)) for p in given)
        family, other = ("a synthesis", "Whisper") if speech else ("a Whisper", "synthesis")
        raise click.UsageError(f"{names}: only for {other} presets, and {preset_name!r} is {family} preset")
    return speech


@distill.command("data")
@click.argument("inputs", nargs=-1)
@click.option("--preset", "preset_name", required=True, help="Preset whose model labels the audio (or text).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Shard directory (resumable: inputs in its manifest are skipped).")
@click.option("--timestamps/--no-timestamps", default=True, show_default=True,
              help="Whisper presets: decode as `transcribe` does with / without timestamp tokens.")
@click.option("--task", type=click.Choice(["transcribe", "translate"]), default="transcribe", show_default=True,
              help="Whisper presets: label with the target's own transcribe or translate (X -> English) decode.")
@click.option("--language", help="Whisper presets: the audio's language code or name (omit: detected per file).")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16", "int8"]),
              help="Whisper presets: the target's dtype while labelling (default: the preset's).")
@click.option("--batch-size", type=click.IntRange(1), default=1, show_default=True,
              help="Whisper presets: files decoded together (batched greedy decoding: the same labels, more "
              "files per second).")
@click.option("--text", "texts", multiple=True, help="Synthesis presets: an utterance to speak (repeatable).")
@click.option("--model", help="Synthesis presets: cosyvoice2, cosyvoice3 or a checkpoint directory; audio-LLM "
              "presets: a model directory or name.")
@click.option("--sampler", type=click.Choice(["ras", "vllm", "greedy"]),
              help="Synthesis presets: the deployment sampler (default: the preset's).")
@click.option("--seed", type=int, default=0, show_default=True, help="Synthesis presets: run seed.")
@click.option("--aux-layers", help="Synthesis presets: target layer ids to store, e.g. 1,2 (default: every "
              "drafter's default layers).")
@click.option("--per-shard", type=click.IntRange(1), default=16, show_default=True,
              help="Synthesis presets: utterances per shard.")
@click.option("--quiet", "-q", is_flag=True, help="No per-file progress lines on stderr.")
def data(inputs, preset_name, out, timestamps, task, language, dtype, batch_size, texts, model, sampler, seed,
         aux_layers, per_shard, quiet) -> None:
    """Label INPUTS on-policy with the target and store training shards: audio files transcribed greedily
    (Whisper presets), or utterances (text files, *.jsonl, '-', --text) sampled at the deployment
    sampler, keeping only sequences that end in eos (synthesis presets).

    \b
    Whisper presets only: --timestamps/--no-timestamps, --task, --language, --dtype, --batch-size.
    Synthesis presets only: --text, --model, --sampler, --seed, --aux-layers, --per-shard.
    Audio-LLM presets (qwen2-audio-ar, qwen3-omni-ar ...): INPUTS transcribed greedily as `transcribe` does,
    with --task, --language, --model, --aux-layers (default: the family's EAGLE-3 and DFlash layers).
    Given with a preset of the other family, these are an error (exit 2)."""
    if is_audio_lm_preset(preset_name):
        check_flags(AUDIO_LM_DATA_FLAGS)
        with report_interrupt(lambda: _labelled_so_far(out)):
            run_audio_lm_data(inputs, preset_name, out, task, language, model, aux_layers, quiet)
        return
    if check_family_flags(preset_name, DATA_FLAGS):
        with report_interrupt(lambda: _labelled_so_far(out)):
            run_speech_data(inputs, texts, preset_name, out, model, sampler, seed, aux_layers, per_shard, quiet)
        return
    if not inputs:
        raise click.UsageError("give audio files or directories")
    language = normalize_language(language)
    preset = load_preset(preset_name)
    check_model_name(preset.model, task, language)  # an English-only target cannot translate: exit 2 first
    found, bad = discover(inputs)
    for outcome in bad:
        click.echo(f"error: {outcome.error}", err=True)
    if not found:
        raise SpecliError("no audio input")
    check_output_dir(out, "the --out directory")  # a usage error before the model loads
    model = _load_target(preset_name, dtype)
    model.speech_hooks().check_support(preset.model, task, language)
    progress = None if quiet else (lambda msg, done, total: click.echo(f"[{done}/{total}] {msg}", err=True))
    opts = TranscribeOptions(task=task, language=language, timestamps=timestamps)
    with report_interrupt(lambda: _labelled_so_far(out)):
        summary = generate([f for f, _root in found], model, out, progress, opts, batch_size=batch_size)
    click.echo(f"{summary.done} file(s), {summary.windows} window(s) written; {summary.skipped} already done "
               f"-> {out}", err=True)


@distill.command("train")
@click.argument("data_dirs", nargs=-1, required=True, type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--preset", "preset_name", required=True, help="Preset whose model is the target.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Head directory (checkpoints under OUT/checkpoints; resumes). Default: eagle-head, or "
              "<drafter>-drafter for synthesis presets.")
@click.option("--val", "val_dirs", multiple=True, type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Held-out shard directory (other sources) for the acceptance length each epoch; repeatable "
              "(Whisper presets: windows taken in turn from each, e.g. one directory per language and task; "
              "synthesis presets take one).")
@click.option("--val-windows", type=click.IntRange(1), default=16, show_default=True,
              help="Whisper presets: held-out windows decoded per validation.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16", "int8"]),
              help="Whisper presets: the target's dtype (default: the preset's; the labels' dtype validates "
              "losslessly).")
@click.option("--epochs", type=click.IntRange(1), help="Passes over the data (default 1; synthesis presets 10).")
@click.option("--steps", type=click.IntRange(0), default=0, show_default=True, help="Stop after N steps (0 = none).")
@click.option("--lr", type=click.FloatRange(0, min_open=True), default=3e-4, show_default=True)
@click.option("--batch", type=click.IntRange(1), default=4, show_default=True,
              help="Windows (Whisper) or sequences (synthesis) per step.")
@click.option("--checkpoint-every", type=click.IntRange(1), default=100, show_default=True)
@click.option("--val-every", type=click.IntRange(1), default=1, show_default=True, help="Validate every N epochs.")
@click.option("--draft-vocab", type=click.IntRange(0), default=8192, show_default=True,
              help="Rows of the head's vocabulary (most frequent in the data + specials; 0 = all).")
@click.option("--feature-noise", type=click.FloatRange(0), default=0.05, show_default=True,
              help="Whisper presets: Gaussian noise on the target's states while training, times their RMS (0 = off).")
@click.option("--dropout", type=click.FloatRange(0, 1, max_open=True), default=0.1, show_default=True,
              help="Whisper presets: dropout on the head block's input while training (0 = off; inference unchanged).")
@click.option("--precision", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True,
              help="Whisper presets: matmul precision of training steps (bfloat16: autocast, float32 weights and "
              "optimizer; ~1.5x faster on CPUs with native bf16).")
@click.option("--init", "init_head", help="Whisper presets: start from this trained head (directory or shipped name, "
              "e.g. whisper-base-eagle; its draft vocabulary) instead of the target's last decoder layer.")
@click.option("--drafter", type=click.Choice(["dspark", "dflash", "eagle3"]), default="dspark", show_default=True,
              help="Synthesis presets: the drafter trained.")
@click.option("--model", help="Synthesis presets: cosyvoice2, cosyvoice3 or a checkpoint directory; audio-LLM "
              "presets: a model directory or name.")
@click.option("--layers", type=click.IntRange(0), default=0, help="Synthesis presets: draft layers (0 = recipe).")
@click.option("--block", type=click.IntRange(0), default=0,
              help="Synthesis presets: block size / EAGLE-3 unroll (0 = recipe: 8, 4, 7).")
@click.option("--anchors", type=click.IntRange(1), default=64, show_default=True,
              help="Synthesis presets: anchors per sequence per step (DSpark, DFlash).")
@click.option("--markov-rank", type=click.IntRange(0), default=256, show_default=True,
              help="Synthesis presets: DSpark Markov head rank.")
@click.option("--quiet", "-q", is_flag=True, help="No per-step progress lines on stderr.")
def train(data_dirs, preset_name, out, val_dirs, val_windows, dtype, epochs, steps, lr, batch, checkpoint_every,
          val_every, draft_vocab, feature_noise, dropout, precision, init_head, drafter, model, layers, block, anchors,
          markov_rank, quiet) -> None:
    """Train a drafter on the shards of DATA_DIRS and save it to OUT: an EAGLE Speech-Draft head (Whisper
    presets; unrolled K=7, beta=0.8) or a DSpark / DFlash / EAGLE-3 drafter (synthesis presets).

    \b
    Whisper presets only: --val-windows, --dtype, --feature-noise, --dropout, --precision, --init.
    Synthesis presets only: --drafter, --model, --layers, --block, --anchors, --markov-rank.
    Audio-LLM presets: --drafter eagle3 or dflash (the family's layers and block), --model, --layers, --block,
    --anchors; no validation decode (check the drafter with `transcribe` or `bench`).
    Given with a preset of the other family, these are an error (exit 2)."""
    if is_audio_lm_preset(preset_name):
        check_flags(AUDIO_LM_TRAIN_FLAGS)
        train_fn, out = audio_lm_training(data_dirs, preset_name, out, model, drafter=drafter, layers=layers,
                                          block=block, draft_vocab=draft_vocab, epochs=epochs or 10, steps=steps,
                                          lr=lr, batch=batch, anchors=anchors, checkpoint_every=checkpoint_every,
                                          val_every=val_every)
        run_training(train_fn, quiet, out)
        return
    if check_family_flags(preset_name, TRAIN_FLAGS):
        if len(val_dirs) > 1:
            raise click.UsageError("synthesis presets take one --val directory")
        val_dir = val_dirs[0] if val_dirs else None
        train_fn, out = speech_training(data_dirs, preset_name, out, val_dir, model, drafter=drafter, layers=layers,
                                        block=block, draft_vocab=draft_vocab, markov_rank=markov_rank,
                                        epochs=epochs or 10, steps=steps, lr=lr, batch=batch, anchors=anchors,
                                        checkpoint_every=checkpoint_every, val_every=val_every)
        run_training(train_fn, quiet, out)
        return
    out = out or Path("eagle-head")
    model = _load_target(preset_name, dtype)
    opts = TrainOptions(epochs=epochs or 1, steps=steps, lr=lr, batch=batch, checkpoint_every=checkpoint_every,
                        draft_vocab=draft_vocab, val_every=val_every, feature_noise=feature_noise, dropout=dropout,
                        val_windows=val_windows, precision=precision, init=init_head)
    val = interleave([load_windows(d) for d in val_dirs]) if val_dirs else None
    run_training(lambda progress: train_head([w for d in data_dirs for w in load_windows(d)], model, out, opts,
                                             val, progress), quiet, out)


@distill.command("eval")
@click.argument("val_dirs", nargs=-1, required=True, type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--preset", "preset_name", required=True, help="Whisper preset whose model is the target.")
@click.option("--head", help="EAGLE head directory or shipped name (default: the preset's head).")
@click.option("--windows", type=click.IntRange(1), default=16, show_default=True, help="Windows decoded per directory.")
@click.option("--max-draft", type=click.IntRange(1, 24), default=8, show_default=True, help="Draft length (chain).")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16", "int8"]),
              help="The target's dtype (default: the preset's; use the labels' dtype for 0 mismatches).")
def evaluate(val_dirs, preset_name, head, windows, max_draft, dtype) -> None:
    """Acceptance length of an EAGLE head on each of VAL_DIRS (`distill data` shards, e.g. one per language
    and task): real greedy speculative decoding of the first WINDOWS windows against the target. Prints a
    tab-separated line per directory: directory, windows, acceptance length, windows whose greedy decode differs
    from their labels (labels kept from a temperature fallback, or made at another dtype; the speculative
    decode itself is lossless)."""
    if is_speech_preset(preset_name):
        raise click.UsageError(f"distill eval measures EAGLE heads of Whisper presets; {preset_name!r} is a "
                               "synthesis preset")
    head = head or load_preset(preset_name).draft.head
    if not head:
        raise click.UsageError(f"preset {preset_name!r} has no EAGLE head: give --head")
    model = _load_target(preset_name, dtype)
    drafter = load_head(head, model.target)
    click.echo("directory\twindows\tacceptance\tmismatched")
    for d in val_dirs:
        wins = load_windows(d)[:windows]
        acc, bad = validate(drafter, model, wins, max_draft)
        click.echo(f"{d}\t{len(wins)}\t{acc:.3f}\t{bad}")


def interleave(groups: list[list]) -> list:
    """The items of ``groups`` taken in turn (first of each, then second of each...)."""
    return [g[i] for i in range(max(map(len, groups), default=0)) for g in groups if i < len(g)]


def _labelled_so_far(out: Path) -> str:
    """What an interrupted ``distill data`` leaves: the shards listed in ``out``'s manifest."""
    try:
        done = open_manifest(out)["done"]
    except (OSError, ValueError):
        done = {}
    return f"{len(done)} shard(s) written to {out}; the same command resumes after them"


def run_training(train_fn: TrainFn, quiet: bool, out: Path) -> None:
    """Run ``train_fn(progress)`` (progress lines on stderr unless ``quiet``; a ``ValueError`` of the data
    or options is a :class:`SpecliError`) and print its summary on stderr; Ctrl-C exits 130 naming the
    checkpoints of ``out`` that a rerun resumes from."""
    progress = None if quiet else (lambda msg: click.echo(msg, err=True))
    kept = f"checkpoints so far are in {out / 'checkpoints'}; the same command resumes from the latest"
    try:
        with report_interrupt(lambda: kept):
            summary = train_fn(progress)
    except ValueError as exc:
        raise SpecliError(str(exc)) from exc
    acc = "-" if summary.val_acceptance is None else (
        f"{summary.val_acceptance:.3f} (best {summary.best_acceptance:.3f}, saved)")
    click.echo(f"{summary.steps} step(s), loss {summary.last_loss:.4f}, validation acceptance {acc}, "
               f"{summary.seconds_per_step:.2f} s/step -> {summary.head_dir}", err=True)
