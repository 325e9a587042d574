"""``specli synthesize``: text -> audio (``<id>.wav``, ``--format flac``) or CosyVoice speech tokens
(``--format npy``), one utterance a line; the shipped voice specli-en unless ``--model`` / ``--preset`` say
otherwise."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from specli.core.threads import torch_threads
from specli.commands.interrupt import report_interrupt
from specli.commands.batch_run import finish_run, resume_mode
from specli.commands.synthesize_audio import OutcomeTally, VoiceFlags, echo_skipped, run_audio
from specli.tts.synthesis import LoadOptions, PresetOverrides, Synthesizer, load_synthesizer
from specli.errors import PresetError
from specli.models.cosyvoice.lm import KNOWN_MODELS
from specli.models.cosyvoice.voices import SHIPPED_VOICES, VOICE_PRESETS
from specli.presets.synthesis import load_synthesis_preset
from specli.io.outputs import check_output_dir
from specli.io.batch import Outcome, manifest_row
from specli.io.resume import ResumeMode
from specli.io.sharding import DEFAULT_MANIFEST, ShardedRun, launched_world_size
from specli.tts.acoustic.pipeline import AUDIO_DTYPES
from specli.tts.audio_out import AudioOptions, SpokenLine
from specli.tts.pipeline import Resume, RunOptions, read_items, run_synthesis, synthesis_settings


DEFAULT_VOICE = "specli-en"  # what synthesize speaks with when neither --model nor --preset names a model


def _default_preset(model: str | None) -> str:
    """No --model: the shipped voice's preset; a shipped voice: its own (``VOICE_PRESETS``: specli-en-dflash, lossless
    speculation) or ``<name>-ar``; a named model: ``<name>-ar``; a directory: a plain AR preset (RAS)."""
    model = model or DEFAULT_VOICE
    if model in VOICE_PRESETS:
        return VOICE_PRESETS[model]
    return f"{model}-ar" if model in KNOWN_MODELS or model in SHIPPED_VOICES else "cosyvoice2-ar"


@click.command()
@click.argument("inputs", nargs=-1)
@click.option("--text", "texts", multiple=True, help="An utterance to speak (repeatable); ids text_00001, ...")
@click.option("--model", help="specli-en (the shipped voice, the default), cosyvoice2, cosyvoice3, or a checkpoint "
                              "directory (overrides the preset's).")
@click.option("--preset", help="Synthesis preset name or TOML file (default: <model>-ar; the shipped voice "
                               "specli-en: specli-en-dflash, its lossless drafter; specli-en-ar decodes plainly).")
@click.option("--draft", help="Override the preset's drafter: none, pool, or a DSpark / DFlash / EAGLE-3 drafter "
                              "directory (speculators or z-lab format; a drafter shipped beside a voice, e.g. "
                              "specli-en/dflash; or a name under $SPECLI_MODELS_DIR).")
@click.option("--sampler", type=click.Choice(["ras", "vllm", "greedy"]), help="Override the preset's sampler.")
@click.option("--temperature", type=float, help="vllm sampler only.")
@click.option("--top-p", type=float, help="Nucleus mass (ras default 0.8).")
@click.option("--top-k", type=int, help="Nucleus size (ras default 25).")
@click.option("--repetition-penalty", type=float, help="vllm sampler only (over prompt and output tokens).")
@click.option("--seed", type=int, default=0, show_default=True, help="Run seed; each utterance's from (seed, id).")
@click.option("--output-dir", "-o", type=click.Path(file_okay=False, path_type=Path), default=Path("."))
@click.option("--jsonl", type=click.Choice(["-"]), help="Also print one JSON record per utterance to stdout.")
@click.option("--run-manifest", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a JSONL line per input line (status, output, error) and a summary line here (default under "
                   f"torchrun / accelerate launch: OUTPUT_DIR/{DEFAULT_MANIFEST}, by rank 0).")
@click.option("--overwrite", is_flag=True,
              help="Always redo utterances whose output (<id>.npy, .wav or .flac) exists (default: only those made "
                   "with other settings: preset, model, sampler, seed, drafter under a sampler, the line, voice...).")
@click.option("--skip-existing", is_flag=True,
              help="Keep existing outputs even when they were made with other settings.")
@click.option("--batch-size", type=click.IntRange(1), default=1, show_default=True,
              help="Utterances decoded together (continuous batching): the same tokens as at 1 but for float "
                   "near-ties; with --format wav/flac the flow and vocoder then take the finished utterances "
                   "(the same bytes as at 1 for the same tokens).")
@click.option("--threads", type=click.IntRange(1), help="CPU threads for torch (default: torch's choice).")
@click.option("--device", help="auto (CUDA when available), cpu, cuda or cuda:N (default: the preset's, auto).")
@click.option("--progress/--no-progress", default=None, help="A line per utterance on stderr (default: on a terminal).")
@click.option("--format", "fmt", type=click.Choice(["npy", "wav", "flac"]), default="wav", show_default=True,
              help="wav/flac: audio through the flow and vocoder stages (flow.pt, hift.pt or the voice's HiFi-GAN); "
                   "npy: the speech tokens only.")
@click.option("--sample-rate", type=click.IntRange(8000, 192000),
              help="Audio rate (default: the model's vocoder rate, 24000 for CosyVoice, 22050 for specli-en; another "
                   "rate is resampled with soxr).")
@click.option("--flow-steps", type=click.IntRange(1, 100),
              help="Euler steps of the flow stage (default: the model's, 10): fewer are faster and rougher.")
@click.option("--audio-dtype", type=click.Choice(AUDIO_DTYPES),
              help="Compute dtype of the flow and vocoder (default: float32 flow, vocoder as --vocoder-dtype); auto = "
                   "bfloat16 on a CPU with native bf16 (AMX, AVX-512 BF16), else float32 (docs/benchmarks/"
                   "synthesis-bf16/, voice/vocoder-bf16/). Deterministic; they differ by rounding.")
@click.option("--vocoder-dtype", type=click.Choice(AUDIO_DTYPES),
              help="Compute dtype of the vocoder alone (default: --audio-dtype's, else auto = bfloat16 for a HiFi-GAN "
                   "vocoder on a CPU with native bf16, else float32: transparent there, 2.4x / 1.6x faster at 1 / 2 "
                   "threads; docs/benchmarks/voice/vocoder-bf16/).")
@click.option("--prompt-wav", help="Voice prompt recording (<= 30 s, >= 16 kHz) for wav/flac output.")
@click.option("--prompt-text", help="Transcript of --prompt-wav (CosyVoice3: a '...<|endofprompt|>' prefix is added "
                                    "when absent).")
@click.option("--speaker", help="A stored speaker of the model's spk2info.pt (instead of --prompt-wav).")
def synthesize(inputs, texts, model, preset, draft, sampler, temperature, top_p, top_k, repetition_penalty, seed,
               output_dir, jsonl, run_manifest, overwrite, skip_existing, batch_size, threads, device, progress, fmt,
               sample_rate, flow_steps, audio_dtype, vocoder_dtype, prompt_wav, prompt_text, speaker) -> None:
    """Audio (or speech tokens) for text: INPUTS are text files (one utterance a line), '-' (stdin) or JSONL
    manifests (*.jsonl: {"id", "text", "prompt_text", "prompt_tokens", "prompt_wav"}); writes OUTPUT_DIR/<id>.wav
    (the shipped voice specli-en unless --model says otherwise), <id>.flac, or the speech tokens <id>.npy with
    --format npy. No text normalisation is applied (the text is spoken as written).
    A rerun skips the outputs made with the same settings and redoes the others (hidden .<output>.specli files)."""
    mode = resume_mode(overwrite, skip_existing)
    if not inputs and not texts:
        raise click.UsageError("give text files, '-', a *.jsonl manifest or --text")
    if fmt == "npy" and (prompt_wav or prompt_text or speaker or sample_rate is not None or flow_steps is not None
                         or {audio_dtype, vocoder_dtype} - {None, "float32"}):
        raise click.UsageError("--prompt-wav, --prompt-text, --speaker, --sample-rate, --flow-steps, --audio-dtype and "
                               "--vocoder-dtype need --format wav or flac")
    if "-" in inputs and launched_world_size() > 1:  # every rank would read its own part of stdin
        raise click.UsageError("'-' (text on stdin) cannot be split between processes: give text files or --text")
    click.get_current_context().with_resource(torch_threads(threads))  # restored when the command returns
    p = load_synthesis_preset(preset or _default_preset(model))
    check_output_dir(output_dir)  # a usage error before the model loads
    try:
        overrides = PresetOverrides(draft=draft, sampler=sampler, temperature=temperature, top_p=top_p, top_k=top_k,
                                    repetition_penalty=repetition_penalty, seed=seed)
        synth = load_synthesizer(p, LoadOptions(model=model, device=device, overrides=overrides))
    except ValueError as exc:  # sampler settings that do not fit the sampler
        raise PresetError(str(exc)) from exc
    resume = _resume(synth, p.name, mode)
    items = read_items(inputs, texts, sys.stdin.buffer if "-" in inputs else None)
    run = ShardedRun.start([it.where for it in items], run_manifest, output_dir)  # torchrun: this rank's share
    items = run.take(items)
    show = (sys.stderr.isatty() if progress is None else progress) and run.shard.rank == 0
    tally = OutcomeTally()
    own_jsonl = bool(jsonl) and not run.shard.distributed  # a distributed run's records are printed by rank 0

    def report(out: Outcome) -> None:
        if not tally.produced(out):
            echo_skipped(out, own_jsonl)
            return
        if show:
            click.echo(f"[{tally.done}/{len(items)}] {out.id}: {_made(out)}", err=True)
        if own_jsonl:
            click.echo(json.dumps(out.record, ensure_ascii=False))

    batch = RunOptions(output_dir, resume, batch_size, report)
    with report_interrupt(lambda: f"{tally.line()} (written outputs are kept; a rerun resumes)"):
        if fmt != "npy":
            options = AudioOptions(fmt, sample_rate, seed, flow_steps, audio_dtype, vocoder_dtype)
            outcomes = run_audio(synth, items, batch, options, VoiceFlags(prompt_wav, prompt_text, speaker))
        else:
            outcomes = run_synthesis(synth, items, batch)
    for out in outcomes:
        run.add(_row(out, bool(jsonl) and run.shard.distributed))
    finish_run(run, tally.line(), bool(tally.counts["failed"]), lambda record: json.dumps(record, ensure_ascii=False))


def _resume(synth: Synthesizer, preset: str, mode: ResumeMode) -> Resume:
    """What a rerun does with existing outputs (``mode``): redo those made with other settings (saying why on
    stderr), or every one (--overwrite), or none (--skip-existing)."""
    return Resume(synthesis_settings(synth, preset), mode,
                  on_redo=lambda rid, why: click.echo(f"redoing {rid}: {why}", err=True),
                  on_rename=lambda rid, new, other: click.echo(
                      f"naming {rid} {new}: the output named {rid} was made from {other}", err=True))


def _made(out: Outcome) -> str:
    """What the progress line says of a line made now: its tokens, or its audio and real-time factors."""
    if not isinstance(out.result, SpokenLine):
        return f"{len(out.result.tokens)} tokens"
    rec = out.record
    return (f"{rec['duration_s']:.2f} s audio, rtf llm {rec['rtf']['llm']:.2f} flow {rec['rtf']['flow']:.2f} "
            f"vocoder {rec['rtf']['vocoder']:.2f}")


def _row(out: Outcome, with_record: bool) -> dict:
    """The run-manifest row of one input line (``specli.io.batch``); its JSON record too when ``with_record`` (a
    skipped one's read back from its sidecar)."""
    measures: dict = {"tokens": len(out.result.tokens) if out.result else 0}
    if isinstance(out.result, SpokenLine):
        measures["audio_seconds"] = out.result.audio.duration
    return manifest_row(out, measures, with_record, named=True)
