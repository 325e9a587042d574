"""``specli distill data|train`` for synthesis presets: on-policy speech-token data and drafter training.

Used by :mod:`specli.commands.distill` when ``--preset`` names a synthesis preset (``task =
"synthesize"``); the Whisper path is there. This module does not import that one (no import loop):
training is prepared here and run by the caller.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import click

from specli.io.outputs import check_output_dir
from specli.core.device import resolve_device
from specli.core.sampling import SamplerOptions
from specli.distill.data import load_windows
from specli.distill.loop import Progress, TrainSummary
from specli.distill.speech_data import SpeechDataOptions, generate_speech, read_speech_manifest
from specli.distill.speech_train import SpeechTrainOptions, train_speech
from specli.errors import PresetError, SpecliError
from specli.models.cosyvoice.lm import CosyVoiceModel, lm_fingerprint, load_cosyvoice
from specli.presets import preset_task
from specli.presets.synthesis import load_synthesis_preset
from specli.tts.pipeline import read_items
from specli.tts.synthesis import PresetOverrides, build_synthesizer

TrainFn = Callable[[Progress | None], TrainSummary]  # progress -> what training did


def is_speech_preset(name: str) -> bool:
    """True when ``name`` is a synthesis preset (its family runs in the synthesis pipeline)."""
    return preset_task(name) == "synthesize"


def load_speech_target(preset_name: str, model: str | None = None,
                       sampler: str | None = None) -> tuple[CosyVoiceModel, SamplerOptions]:
    """The preset's CosyVoice LM (or ``model``) and its deployment sampler settings."""
    preset = load_synthesis_preset(preset_name)
    loaded = load_cosyvoice(model or preset.model, preset.dtype, device=resolve_device(preset.device))
    try:
        synth = build_synthesizer(preset, loaded, PresetOverrides(draft="none", sampler=sampler))
    except ValueError as exc:
        raise PresetError(str(exc)) from exc
    return loaded, synth.options.sampler


def run_speech_data(inputs, texts, preset_name: str, out: Path, model: str | None, sampler: str | None, seed: int,
                    aux_layers: str | None, per_shard: int, quiet: bool) -> None:
    """Regenerate on-policy labels for the utterances of INPUTS / --text and write shards to ``out``."""
    items = read_items(inputs, texts, sys.stdin.buffer if "-" in inputs else None)
    for it in items:
        if it.request is None:
            click.echo(f"error: {it.where}: {it.error}", err=True)
    requests = [it.request for it in items if it.request is not None]
    if not requests:
        raise SpecliError("no utterance to speak (give text files, a *.jsonl manifest, '-' or --text)")
    try:
        layers = tuple(int(x) for x in aux_layers.split(",")) if aux_layers else ()
        opts_kw = dict(seed=seed, aux_layers=layers, per_shard=per_shard)
    except ValueError as exc:
        raise click.BadParameter(f"--aux-layers must be comma-separated integers: {exc}") from exc
    check_output_dir(out, "the --out directory")  # a usage error before the model loads
    loaded, sampler_opts = load_speech_target(preset_name, model, sampler)
    try:
        opts = SpeechDataOptions(sampler=sampler_opts, **opts_kw)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    progress = None if quiet else (lambda msg, done, total: click.echo(f"[{done}/{total}] {msg}", err=True))
    s = generate_speech(requests, loaded, out, opts, progress)
    click.echo(f"{s.kept} sequence(s) kept ({s.tokens} tokens), {s.dropped} without eos dropped, {s.failed} failed; "
               f"{s.skipped} already done -> {out}", err=True)


def speech_training(data_dirs, preset_name: str, out: Path | None, val_dir: Path | None, model: str | None,
                    **train_kw) -> tuple[TrainFn, Path]:
    """Check the shards of ``data_dirs`` and load the target; the training of a DSpark / DFlash / EAGLE-3
    drafter on them (to run with its progress callback) and its output directory."""
    manifests = [read_speech_manifest(d) for d in data_dirs]
    keys = ("fingerprint", "aux_layers", "sampler", "seed")
    if any({k: m.get(k) for k in keys} != {k: manifests[0].get(k) for k in keys} for m in manifests):
        raise SpecliError("the data directories were generated with different targets, layers or samplers")
    try:
        opts = SpeechTrainOptions(**train_kw)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    loaded, _ = load_speech_target(preset_name, model)
    if manifests[0].get("fingerprint") != lm_fingerprint(loaded):
        raise SpecliError(f"{data_dirs[0]}: data was generated with another target ({manifests[0].get('model')!r})")
    target = out or Path(f"{opts.drafter}-drafter")
    records = [r for d in data_dirs for r in load_windows(d)]
    val = None
    if val_dir is not None:
        read_speech_manifest(val_dir)
        val = load_windows(val_dir)
    return (lambda progress: train_speech(records, loaded, target, opts, val, manifests[0], progress)), target
