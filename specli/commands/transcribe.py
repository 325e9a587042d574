"""``specli transcribe`` and ``specli translate``: parse options, build the engine, run, write.

To add an option: append it to ``OPTIONS``; read it from ``kw`` in :func:`_transcribe_options` (a
``TranscribeOptions`` field is fingerprinted for resume automatically) or, when it changes the text but
lives elsewhere, also add it to the dict :func:`_text_settings` returns.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path

import click

from specli.io.audio import audio_duration
from specli.asr.pipeline import (DEFAULT_BATCH_SIZE, BatchOptions, batch_size_for, discover, plan_outputs, run_batch,
                                 text_settings)
from specli.commands.batch_run import finish_run, resume_mode
from specli.commands.decoding_flags import DECODING_FLAGS, decoding_options
from specli.core.threads import torch_threads
from specli.commands.interrupt import report_interrupt
from specli.models.languages import check_model_name, normalize_language
from specli.asr.strategies import Engine, load_engine
from specli.asr.windows import TranscribeOptions
from specli.errors import AudioError
from specli.presets import DEFAULT_PRESET, Preset, load_preset, preset_for_model
from specli.commands.progress import BatchProgress, RunSummary
from specli.io.batch import Outcome, manifest_row
from specli.io.sharding import DEFAULT_MANIFEST, ShardedRun, launched_world_size
from specli.asr.vad import VadOptions, load_vad
from specli.models.speech import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS
from specli.asr.writers import FORMATS, SubtitleOptions, json_line
from specli.io.outputs import check_output_dir


# the one option list of both commands (decorators, in --help order)
OPTIONS = [
    click.argument("inputs", nargs=-1, required=True),
    click.option("--preset", default=DEFAULT_PRESET, show_default=True, help="Preset name or TOML file."),
    click.option("--model", help="Override the preset's model: bundled name, HF id/dir, CTranslate2 dir."),
    click.option("--instruction", help="Audio-LLM models: the instruction put after the audio for qwen2-audio / "
                 "qwen3-omni (default: the model's documented ASR / translation instruction, naming the "
                 "--language); qwen3-asr's context (system turn: hotwords, domain words; default none)."),
    click.option("--language", help="Language code or name (fr, French, castilian); omit to detect it per file."),
    click.option("--output-dir", "-o", type=click.Path(file_okay=False, path_type=Path), default=Path(".")),
    click.option("--output-format", "-f", type=click.Choice([*FORMATS, "all"]), default="txt", show_default=True),
    click.option("--jsonl", "jsonl", type=click.Choice(["-"]), help="Also print one JSON record per file to stdout."),
    click.option("--run-manifest", type=click.Path(dir_okay=False, path_type=Path),
                 help="Write a JSONL line per input (status, outputs, error) and a summary line here (default under "
                      f"torchrun / accelerate launch: OUTPUT_DIR/{DEFAULT_MANIFEST}, by rank 0)."),
    click.option("--overwrite", is_flag=True,
                 help="Always redo inputs whose outputs exist (default: only those made with other settings)."),
    click.option("--skip-existing", is_flag=True,
                 help="Keep existing outputs even when they were made with other settings."),
    click.option("--fail-fast", is_flag=True, help="Stop at the first failed input."),
    click.option("--threads", type=click.IntRange(1), help="CPU threads for torch (default: torch's choice)."),
    click.option("--batch-size", type=click.IntRange(1), default=None,
                 help="Files transcribed together (continuous batching: windows of several files share encoder "
                      "calls and greedy decoder steps; a finished file makes room for the next). Outputs and resume "
                      "are as at 1, up to rare near-tie flips; temperature fallbacks, best-of and beam search run "
                      f"per file. Default {DEFAULT_BATCH_SIZE} (fastest measured on 2-core CPUs), or 1 for a preset "
                      "whose drafter cannot batch (an explicit N > 1 then warns)."),
    click.option("--device", help="auto (CUDA when available), cpu, cuda or cuda:N (default: the preset's, auto)."),
    click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16", "int8"]),
                 help="Override the preset's dtype (auto: bfloat16 on CPUs with native bf16 (AVX512-BF16 / AMX), "
                 "float32 on other CPUs, float16 on CUDA; int8: weight-only int8 decoder on the CPU, its own lossless "
                 "reference like bf16)."),
    click.option("--timestamps/--no-timestamps", default=True, show_default=True),
    click.option("--compile-encoder", is_flag=True, help="torch.compile the encoder (tens of seconds once)."),
    click.option("--progress/--no-progress", default=None, help="Progress on stderr (default: when a terminal)."),
    click.option("--vad", is_flag=True,
                 help="Transcribe only the speech Silero VAD finds (needs specli[vad]); times stay the file's. "
                      "Chunks follow faster-whisper's VadOptions semantics, with speech_pad_ms 400, "
                      "min_speech_duration_ms 250, max_speech_duration_s 30."),
    click.option("--vad-threshold", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True), default=0.5,
                 show_default=True,
                 help="With --vad: speech probability that starts speech (it ends below this - 0.15)."),
    click.option("--vad-min-silence-ms", type=click.IntRange(0), default=2000, show_default=True,
                 help="With --vad: silence that ends a speech chunk, in ms."),
    click.option("--word-timestamps", is_flag=True,
                 help="Time every word (cross-attention alignment, as openai-whisper); json gets 'words'."),
    click.option("--prepend-punctuations", default=PREPEND_PUNCTUATIONS, show_default=True,
                 help="With --word-timestamps: punctuation merged into the next word."),
    click.option("--append-punctuations", default=APPEND_PUNCTUATIONS, show_default=True,
                 help="With --word-timestamps: punctuation merged into the previous word."),
    click.option("--max-line-width", type=click.IntRange(1),
                 help="Needs --word-timestamps: characters in a srt/vtt line before it breaks."),
    click.option("--max-line-count", type=click.IntRange(1),
                 help="Needs --word-timestamps: lines in a srt/vtt cue (with --max-line-width, cues span segments)."),
    click.option("--highlight-words", is_flag=True,
                 help="Needs --word-timestamps: underline each word in srt/vtt as it is spoken."),
    *DECODING_FLAGS,
]


def _options(f):
    for opt in reversed(OPTIONS):
        f = opt(f)
    return f


def _transcribe_options(task: str, kw: dict, language: str | None) -> TranscribeOptions:
    """``TranscribeOptions`` from the parsed options (``language`` already normalised to a code)."""
    return TranscribeOptions(task=task, language=language, timestamps=kw["timestamps"],
                             word_timestamps=kw["word_timestamps"], prepend_punctuations=kw["prepend_punctuations"],
                             append_punctuations=kw["append_punctuations"], decoding=decoding_options(kw),
                             instruction=kw["instruction"])


def _subtitle_options(kw: dict) -> SubtitleOptions:
    """srt / vtt layout; the options that need word timings are a usage error without them."""
    sub = SubtitleOptions(kw["max_line_width"], kw["max_line_count"], kw["highlight_words"])
    if sub.needs_words and not kw["word_timestamps"]:
        raise click.UsageError("--max-line-width, --max-line-count and --highlight-words need --word-timestamps")
    return sub


def _vad_options(kw: dict) -> VadOptions | None:
    """``VadOptions`` when --vad is on; a VAD setting without --vad is a usage error."""
    ctx = click.get_current_context()
    if not kw["vad"]:
        for name in ("vad_threshold", "vad_min_silence_ms"):
            if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE:
                raise click.UsageError(f"--{name.replace('_', '-')} needs --vad")
        return None
    return VadOptions(threshold=kw["vad_threshold"], min_silence_duration_ms=kw["vad_min_silence_ms"])


def _text_settings(preset: Preset, opts: TranscribeOptions, kw: dict) -> dict:
    """The settings that change the text (resume redoes outputs made with others).

    ``preset`` is the loaded engine's (effective model and dtype); ``opts`` fields are included already.
    """
    extra: dict = {}
    vad = _vad_options(kw)
    if vad is not None:
        extra["vad"] = dataclasses.asdict(vad)
    if _subtitle_options(kw).needs_words:
        extra["subtitles"] = dataclasses.asdict(_subtitle_options(kw))
    return text_settings(preset, opts, extra)


def _read_inputs(inputs: tuple[str, ...]) -> list[str]:
    paths = [i for i in inputs if i != "-"]
    if "-" in inputs and launched_world_size() > 1:  # every rank would read its own part of stdin
        raise click.UsageError("'-' (paths on stdin) cannot be split between processes: give files or directories")
    if "-" in inputs:
        paths += [line.strip() for line in sys.stdin if line.strip()]
    return paths


def _safe_duration(path: Path) -> float:
    try:
        return audio_duration(path)
    except AudioError:
        return 0.0


def _load(task: str, kw: dict, p: Preset, language: str | None) -> Engine:
    """Load the engine, rejecting (exit 2) a task or language the model cannot do, before any input."""
    check_model_name(kw["model"] or p.model, task, language)
    engine = load_engine(p, kw["model"], kw["dtype"], language, kw["compile_encoder"], kw["device"])
    engine.model.speech_hooks().check_support(engine.preset.model, task, language)
    if engine.model.target.compiled_encoder is not None:
        click.echo(f"encoder compiled in {engine.model.target.compiled_encoder.compile_seconds:.1f} s", err=True)
    return engine


def _check_outputs(output_dir: Path, run_manifest: Path | None) -> None:
    """Refuse (usage error) an output directory or run manifest that could not be created, before any model
    loads; nothing is created here, so a rejected run leaves no trace."""
    check_output_dir(output_dir)
    if run_manifest is not None:
        check_output_dir(run_manifest.absolute().parent, "the run manifest's directory")


def _run(task: str, kw: dict) -> None:
    mode = resume_mode(kw["overwrite"], kw["skip_existing"])
    click.get_current_context().with_resource(torch_threads(kw["threads"]))  # restored when the command returns
    p = load_preset(kw["preset"])
    if click.get_current_context().get_parameter_source("preset") is click.core.ParameterSource.DEFAULT:
        chosen = preset_for_model(p, kw["model"])  # --model of another family or without a head: see there
        if chosen.draft != p.draft and chosen.family == p.family:
            click.echo(f"note: {p.name}'s drafter is trained for {p.model}; {kw['model']} runs with "
                       + (f"preset {chosen.name}" if chosen.name != p.name else "no drafter (the same text)"), err=True)
        p = chosen
    language = normalize_language(kw["language"])
    opts = _transcribe_options(task, kw, language)
    found, bad = discover(_read_inputs(kw["inputs"]))
    items = plan_outputs(found, kw["output_dir"])
    formats = list(FORMATS) if kw["output_format"] == "all" else [kw["output_format"]]
    vad = _vad_options(kw)
    subtitles = _subtitle_options(kw)  # a usage error (exit 2) before the model loads
    _check_outputs(kw["output_dir"], kw["run_manifest"])  # usage errors before the model loads
    if vad is not None or p.longform == "batched":
        load_vad()  # a missing VAD model fails (exit 3) before the Whisper model loads
    run, bad, items = _shard(kw, bad, items)  # under torchrun / accelerate launch: this rank's share
    engine = _load(task, kw, p, language)
    summary = RunSummary()

    def stopped() -> str:  # Ctrl-C, SIGTERM or a closed stdout: what finished is written and kept
        summary.interrupted = True
        return summary.line()

    with report_interrupt(stopped, label=False):
        with BatchProgress(len(items), sum(_safe_duration(i.path) for i in items), kw["progress"]) as bar:
            in_flight = _InFlight(bar)
            batch = BatchOptions(decode=engine.decode, settings=_text_settings(engine.preset, opts, kw), mode=mode,
                                 vad=vad, subtitles=subtitles, batch_size=_batch_size(kw, engine),
                                 longform=engine.preset.longform,
                                 on_window=in_flight.window,
                                 on_redo=lambda path, why: bar.message(f"redoing {path}: {why}"))
            outcomes = run_batch(engine.model, items, opts, formats, batch)
            for outcome in itertools.chain(bad, outcomes):
                in_flight.done(outcome.path)
                summary.add(outcome)
                run.add(_row(outcome, bool(kw["jsonl"]) and run.shard.distributed))
                _report(outcome, bar, None if run.shard.distributed else kw["jsonl"])
                if outcome.error and kw["fail_fast"]:
                    break
        finish_run(run, summary.line(), bool(summary.failed), json_line)


def _shard(kw: dict, bad: list, items: list) -> tuple[ShardedRun, list, list]:
    """Join a torchrun / accelerate launch (``specli.io.sharding``) and keep this rank's share of the inputs
    (without a launcher, every input); only rank 0 draws a progress bar."""
    run = ShardedRun.start([str(x.path) for x in [*bad, *items]], kw["run_manifest"], kw["output_dir"])
    if run.shard.rank != 0:
        kw["progress"] = False
    n = len(bad)  # the inputs that hold no audio come first, as they are reported
    return run, [bad[i] for i in run.mine if i < n], [items[i - n] for i in run.mine if i >= n]


def _row(outcome: Outcome, with_record: bool) -> dict:
    """The run-manifest row of one outcome (``specli.io.batch``); its JSON record too when ``with_record``."""
    seconds = outcome.result.stats.audio_seconds if outcome.result else 0.0
    return manifest_row(outcome, {"audio_seconds": seconds}, with_record)


def _batch_size(kw: dict, engine: Engine) -> int:
    """--batch-size (default DEFAULT_BATCH_SIZE), or 1 when the preset's decoding cannot run batched: with a
    warning when the user asked for more."""
    asked = kw["batch_size"]
    default = 1 if kw["fail_fast"] else DEFAULT_BATCH_SIZE  # --fail-fast: nothing after the failing file is done
    size, why = batch_size_for(engine.model, engine.decode, default if asked is None else asked)
    if why and asked is not None:
        click.echo(f"warning: --batch-size {kw['batch_size']} runs as 1 with preset {engine.preset.name}: {why}",
                   err=True)
    return size


class _InFlight:
    """Seconds done in each file being transcribed (several at --batch-size N), summed on the bar."""

    def __init__(self, bar: BatchProgress) -> None:
        self.bar, self.seconds = bar, {}

    def window(self, path: Path, seconds: float) -> None:
        self.seconds[path] = seconds
        self.bar.window(sum(self.seconds.values()))

    def done(self, path: Path) -> None:
        self.seconds.pop(path, None)


def _report(outcome, bar: BatchProgress, jsonl: str | None) -> None:
    """One outcome on stderr (failures, skipped files without a record) and stdout (its JSON record)."""
    if outcome.error:
        bar.message(f"failed: {outcome.error}")
        return
    if outcome.result is not None:
        bar.file_done(outcome.result.stats.audio_seconds)
    if jsonl:
        if outcome.record is not None:
            click.echo(json_line(outcome.record))
        else:
            bar.message(f"skipped {outcome.path}: no JSON record of it on disk to print")


@click.command()
@_options
def transcribe(**kw) -> None:
    """Transcribe audio files and directories (or '-' for paths on stdin)."""
    _run("transcribe", kw)


@click.command()
@_options
def translate(**kw) -> None:
    """Translate speech into English text (Whisper's translate task)."""
    _run("translate", kw)
