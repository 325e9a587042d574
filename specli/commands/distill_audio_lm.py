"""``specli distill data|train`` for audio-LLM presets (Qwen2-Audio, Qwen3-ASR, Qwen3-Omni): on-policy greedy
transcripts and EAGLE-3 / DFlash drafter training through the one training loop.

Used by :mod:`specli.commands.distill` when ``--preset`` names an audio-LLM preset; this module does not import
that one (no import loop).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click
from click.core import ParameterSource

from specli.io.outputs import check_output_dir
from specli.models.speech import DecodingOptions
from specli.models.languages import normalize_language
from specli.asr.pipeline import discover
from specli.asr.windows import TranscribeOptions
from specli.core.device import resolve_device
from specli.distill.audio_lm_data import audio_lm_target, generate_audio_lm, read_audio_lm_manifest
from specli.distill.data import load_windows
from specli.distill.loop import TrainSummary
from specli.distill.speech_train import SpeechTrainOptions, train_speech
from specli.errors import SpecliError
from specli.models.registry import family
from specli.presets import load_any_preset
from specli.presets.audio_llm import AudioLLMPreset
from specli.asr.drafters.eagle_head import target_fingerprint

# the options each command takes with an audio-LLM preset (others given explicitly: exit 2)
DATA_FLAGS = ("inputs", "preset_name", "out", "task", "language", "model", "aux_layers", "quiet")
TRAIN_FLAGS = ("data_dirs", "preset_name", "out", "epochs", "steps", "lr", "batch", "checkpoint_every", "val_every",
               "draft_vocab", "drafter", "model", "layers", "block", "anchors", "quiet")
EXPLICIT = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT, ParameterSource.PROMPT)


def is_audio_lm_preset(name: str) -> bool:
    """True when ``name`` is a transcription preset of an audio-LLM family."""
    return isinstance(load_any_preset(name), AudioLLMPreset)


def check_flags(allowed: tuple[str, ...]) -> None:
    """A usage error (exit 2) for options given explicitly that audio-LLM presets do not take."""
    ctx = click.get_current_context()
    given = [p for p in ctx.command.params
             if p.name not in allowed and ctx.get_parameter_source(p.name) in EXPLICIT]
    if given:
        names = ", ".join(next((o for o in p.opts if o.startswith("--")), p.opts[0]) for p in given)
        raise click.UsageError(f"{names}: not for audio-LLM presets")


def load_audio_lm(preset_name: str, model: str | None):
    """The preset's audio LLM (or ``model``: a directory or name) in the preset's dtype on its device."""
    preset = load_any_preset(preset_name)
    return family(preset.family).load(model or preset.model, preset.dtype, device=resolve_device(preset.device))


def run_audio_lm_data(inputs, preset_name: str, out: Path, task: str, language: str | None, model: str | None,
                      aux_layers: str | None, quiet: bool) -> None:
    """Transcribe INPUTS greedily as ``transcribe`` does and write one shard per file to ``out``."""
    if not inputs:
        raise click.UsageError("give audio files or directories")
    try:
        layers = tuple(int(x) for x in aux_layers.split(",")) if aux_layers else ()
    except ValueError as exc:
        raise click.BadParameter(f"--aux-layers must be comma-separated integers: {exc}") from exc
    found, bad = discover(inputs)
    for outcome in bad:
        click.echo(f"error: {outcome.error}", err=True)
    if not found:
        raise SpecliError("no audio input")
    check_output_dir(out, "the --out directory")  # a usage error before the model loads
    loaded = load_audio_lm(preset_name, model)
    language = normalize_language(language)
    loaded.speech_hooks().check_support(model or load_any_preset(preset_name).model, task, language)
    progress = None if quiet else (lambda msg, done, total: click.echo(f"[{done}/{total}] {msg}", err=True))
    # greedy labels, no sampled fallback: `transcribe --temperature-increment-on-fallback 0` decodes the same text
    opts = TranscribeOptions(task=task, language=language, decoding=DecodingOptions(temperatures=(0.0,)))
    s = generate_audio_lm([f for f, _root in found], loaded, out, opts, layers, progress)
    click.echo(f"{s.done} file(s), {s.windows} window(s), {s.tokens} transcript token(s) written; {s.skipped} "
               f"already done -> {out}", err=True)


def audio_lm_training(data_dirs, preset_name: str, out: Path | None, model: str | None, **train_kw):
    """Check the shards of ``data_dirs`` and load the target; the training of an EAGLE-3 / DFlash drafter on
    them (to run with its progress callback) and its output directory."""
    manifests = [read_audio_lm_manifest(d) for d in data_dirs]
    keys = ("fingerprint", "aux_layers", "options")
    if any({k: m.get(k) for k in keys} != {k: manifests[0].get(k) for k in keys} for m in manifests):
        raise SpecliError("the data directories were generated with different targets, layers or options")
    if train_kw.get("drafter") not in ("eagle3", "dflash"):
        raise click.UsageError("audio-LLM presets train --drafter eagle3 or dflash")
    try:
        opts = replace(SpeechTrainOptions(**train_kw), val_sequences=0)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    loaded = load_audio_lm(preset_name, model)
    if manifests[0].get("fingerprint") != target_fingerprint(loaded.target.dims):
        raise SpecliError(f"{data_dirs[0]}: data was generated with another target ({manifests[0].get('model')!r})")
    target = out or Path(f"{opts.drafter}-drafter")
    records = [r for d in data_dirs for r in load_windows(d)]

    def run(progress) -> TrainSummary:
        return train_speech(records, audio_lm_target(loaded), target, opts, None, manifests[0], progress)

    return run, target
