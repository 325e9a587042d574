"""Batch transcription over files and directories: discovery, output naming, resume, per-file errors.

This is the library API behind ``specli transcribe`` / ``specli translate``; the commands only parse
options, call :func:`run_batch` and print.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from specli.io.audio import AUDIO_EXTENSIONS, iter_audio_chunks
from specli.asr.fallback import AR, DecodeMethod
from specli.models.languages import check_model_name, normalize_language
from specli.asr.batched_longform import transcribe_longform
from specli.asr.scheduler import batch_unsupported, run_jobs
from specli.asr.strategies import Engine, load_engine
from specli.asr.windows import (FileResult, FileSteps, TranscribeOptions, run_alone,
                                          transcribe_steps)
from specli.errors import AudioError, SpecliError, UsageError
from specli.presets import DEFAULT_PRESET, LongForm, Preset, load_preset
from specli.io.resume import ResumeMode, SourceFile, decide, sidecar_path, write_sidecar
from specli.asr.vad import VadOptions, speech_steps
from specli.asr.writers import WRITERS, SubtitleOptions, result_record, to_json
from specli.io.atomic import remove_stale_parts, write_atomic
from specli.io.batch import Outcome, in_input_order
from specli.io.outputs import mirrored_bases
from specli.models.speech import SpeechModel


@dataclass(frozen=True)
class InputFile:
    """One audio file of the batch and where its outputs go (without extension)."""

    path: Path
    output_base: Path


def discover(inputs: Iterable[str]) -> tuple[list[tuple[Path, Path]], list[Outcome]]:
    """Expand inputs into ``(file, root)`` pairs; inputs that hold no audio become failed outcomes.

    Directories are searched recursively for audio extensions (:func:`audio_files`); ``root`` is the
    directory an output path is made relative to (the input directory, or the file's own directory).
    """
    found: list[tuple[Path, Path]] = []
    bad: list[Outcome] = []
    seen: set[Path] = set()
    for raw in inputs:
        p = Path(raw)
        if p.is_dir():
            files = audio_files(p)
            if not files:
                bad.append(Outcome(p, error=f"{p}: directory contains no audio files"))
            pairs = [(f, p) for f in files]
        elif p.exists():
            pairs = [(p, p.parent)]
        else:
            bad.append(Outcome(p, error=f"{p}: no such file or directory"))
            pairs = []
        for f, root in pairs:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                found.append((f, root))
    return found, bad


def audio_files(folder: Path) -> list[Path]:
    """The audio files under ``folder`` (sorted), following symlinked directories; a directory reached again
    (a link loop, or two links to one place) is walked once."""
    files: list[Path] = []
    walked: set[tuple[int, int]] = set()
    for top, dirs, names in os.walk(folder, followlinks=True):
        try:
            st = os.stat(top)
        except OSError:
            st = None
        if st is None or (st.st_dev, st.st_ino) in walked:
            dirs[:] = []
            continue
        walked.add((st.st_dev, st.st_ino))
        dirs.sort()  # the first of two links to one directory names its outputs, the same every run
        files += [f for f in (Path(top, n) for n in names) if f.suffix.lower() in AUDIO_EXTENSIONS and f.is_file()]
    return sorted(files)


def plan_outputs(found: Sequence[tuple[Path, Path]], output_dir: Path) -> list[InputFile]:
    """Output base paths mirror each file's path under its root; collisions get a path hash."""
    return [InputFile(f, base) for (f, _root), base in zip(found, mirrored_bases(found, output_dir))]


def output_paths(item: InputFile, formats: Sequence[str]) -> list[Path]:
    return [item.output_base.with_name(f"{item.output_base.name}.{fmt}") for fmt in formats]


def render(result: FileResult, fmt: str, source: str, subtitles: SubtitleOptions | None = None) -> str:
    if fmt == "json":
        return to_json(result, source)
    if fmt in ("srt", "vtt") and subtitles is not None:
        return WRITERS[fmt](result, subtitles)
    return WRITERS[fmt](result)


def file_steps(model: SpeechModel, path: Path, opts: TranscribeOptions, decode=None,
               on_window: Callable[[float], None] | None = None, vad: VadOptions | None = None) -> FileSteps:
    """The step machine of one file with streaming audio (``transcribe_steps``), or with ``vad`` of its
    speech only (the file is read fully, ``specli.asr.vad``); bad input raises :class:`AudioError` from it."""
    kwargs = {} if decode is None else {"decode": decode}
    if vad is not None:
        return speech_steps(model, iter_audio_chunks(path), opts, vad, on_window=on_window, **kwargs)
    return transcribe_steps(model, iter_audio_chunks(path), opts, on_window=on_window, **kwargs)


transcribe_file = run_alone(file_steps, "transcribe_file", """\
Transcribe one file with streaming audio; raises :class:`AudioError` for bad input.

With ``vad``, the file is read fully and only its speech is transcribed (``specli.asr.vad``). Runs
:func:`file_steps` (same arguments), answering each request on its own.""")


DEFAULT_BATCH_SIZE = 8  # the CLI's files in flight: fastest measured on 2-vCPU machines (docs/benchmarks/whisper-cpu)


def batch_size_for(model: SpeechModel, decode, batch_size: int) -> tuple[int, str | None]:
    """The batch size that runs: ``batch_size``, or 1 with the reason when the preset's decoding cannot
    run batched on this model (the caller says so; outputs are the same either way)."""
    if batch_size < 1:
        raise UsageError("batch size must be >= 1")
    if batch_size == 1:
        return 1, None
    why = batch_unsupported(model, decode or AR)
    return (1, why) if why else (batch_size, None)


def rows_in_flight(batch_size: int, files: int, longform: LongForm) -> int:
    """The batch size a run uses: ``batch_size`` chunks in batched long-form, else at most one row per file (more
    files in flight than there are files only costs: one file decodes best on the batch-1 path)."""
    return batch_size if longform == "batched" else min(batch_size, max(files, 1))


def transcribe_files(
    model: SpeechModel,
    jobs: Iterable[tuple[int, Path | None]],
    opts: TranscribeOptions,
    decode=None,
    batch_size: int = 1,
    on_window: Callable[[Path, float], None] | None = None,
    vad: VadOptions | None = None,
    errors: tuple[type[Exception], ...] = (AudioError,),
    longform: LongForm = "sequential",
) -> Iterator[tuple[int, FileResult | Exception]]:
    """``(key, result)`` of each ``(key, path)`` job, up to ``batch_size`` files in flight (continuous
    batching, :mod:`specli.asr.scheduler`), in completion order; a file raising one of ``errors``
    gets the exception as its result and the others go on. A job without a path (nothing to do) comes
    back at once with the result None. ``longform`` "batched": up to ``batch_size`` voiced chunks in flight
    instead (:mod:`specli.asr.batched_longform`)."""
    size, _why = batch_size_for(model, decode, batch_size)
    if longform == "batched":
        paths: dict[int, Path] = {}

        def reads() -> Iterator[tuple[int, Callable | None]]:
            for key, path in jobs:
                if path is not None:
                    paths[key] = path
                yield key, None if path is None else (lambda p=path: iter_audio_chunks(p))

        progress = None if on_window is None else (lambda key, s: on_window(paths[key], s))
        yield from transcribe_longform(model, reads(), opts, decode or AR, size, vad, errors, progress)
        return

    def steps(path: Path | None) -> Callable[[], FileSteps] | None:
        cb = (lambda s: on_window(path, s)) if on_window else None
        return None if path is None else lambda: file_steps(model, path, opts, decode, cb, vad)

    yield from run_jobs(model, ((key, steps(path)) for key, path in jobs), size, decode or AR, errors)


def text_settings(preset: Preset, opts: TranscribeOptions, extra: Mapping[str, object] | None = None) -> dict:
    """The settings that change the text, fingerprinted beside every output (``specli.io.resume``).

    Every field of ``opts`` is included, so a new ``TranscribeOptions`` field is covered without more
    work; settings that live elsewhere (a decoding or VAD option) go into ``extra``.
    """
    batched = {"longform": preset.longform} if preset.longform != "sequential" else {}  # sequential: as before
    return {"preset": preset.name, "model": preset.model, "dtype": preset.dtype, **batched, **option_settings(opts),
            **(extra or {})}


def option_settings(opts: TranscribeOptions) -> dict:
    """The fields of ``opts`` as resume records them; an unset ``instruction`` (every Whisper run) is left out, so
    outputs made before the field existed still resume."""
    fields = asdict(opts)
    if fields.get("instruction") is None:
        fields.pop("instruction", None)
    return fields


@dataclass(frozen=True)
class BatchOptions:
    """How :func:`run_batch` runs a batch, beside what changes the text (:class:`TranscribeOptions`)."""

    decode: DecodeMethod | None = None  # the engine's decoding (``Engine.decode``); None: plain autoregressive
    settings: Mapping[str, object] | None = None  # what resume fingerprints (text_settings); None: opts' fields + vad
    mode: ResumeMode = "changed"  # what a rerun does with an input whose outputs exist (specli.io.resume)
    vad: VadOptions | None = None  # transcribe only the speech Silero VAD finds (specli.asr.vad); None: all
    subtitles: SubtitleOptions | None = None  # srt / vtt layout; None: the writers' defaults
    batch_size: int = 1  # files transcribed together (continuous batching, specli.asr.scheduler)
    longform: LongForm = "sequential"  # the preset's long-form mode; "batched": batch_size voiced chunks together
    on_window: Callable[[Path, float], None] | None = None  # told (file, seconds done) as its windows finish
    on_redo: Callable[[Path, str], None] | None = None  # told (file, why) of each input whose outputs are redone


def run_batch(model: SpeechModel, items: Sequence[InputFile], opts: TranscribeOptions, formats: Sequence[str],
              batch: BatchOptions = BatchOptions()) -> Iterator[Outcome]:
    """Transcribe each item and write its outputs atomically, with a sidecar of the settings used.

    Up to ``batch.batch_size`` files are transcribed together (:func:`transcribe_files`); each file's outputs
    are written as soon as it finishes, and outcomes are yielded in input order.

    An item whose outputs all exist is skipped when they were made with the same ``batch.settings`` (default:
    the fields of ``opts``); otherwise it is redone and ``batch.on_redo(path, reason)`` says why. ``batch.mode``
    "overwrite" always redoes, "skip-existing" keeps whatever exists.
    """
    vad = batch.vad
    settings = (dict(batch.settings) if batch.settings is not None
                else {**option_settings(opts), **({"vad": asdict(vad)} if vad else {})})
    remove_stale_parts(p for item in items for p in [*output_paths(item, formats), sidecar_path(item.output_base)])
    skipped: dict[int, Outcome | None] = {}
    sources: dict[int, dict | None] = {}  # the identity of each input to do, taken before its work

    def todo() -> Iterator[tuple[int, Path | None]]:  # decided as each item's turn comes
        for i, item in enumerate(items):
            skipped[i] = _skip(item, formats, settings, batch.mode, batch.on_redo)
            if not skipped[i]:
                sources[i] = _identity(item.path)
            yield i, None if skipped[i] else item.path

    results = transcribe_files(model, todo(), opts, batch.decode, rows_in_flight(batch.batch_size, len(items),
                                                                               batch.longform),
                               batch.on_window, vad, longform=batch.longform)
    yield from in_input_order((i, skipped.pop(i) or _write(items[i], result, formats, settings, batch.subtitles,
                                                           sources.pop(i, None)))
                              for i, result in results)


def _skip(item: InputFile, formats: Sequence[str], settings: Mapping[str, object], mode: ResumeMode,
          on_redo: Callable[[Path, str], None] | None) -> Outcome | None:
    """The skipped outcome of an item whose outputs are kept (``specli.io.resume``), else None (to do)."""
    outs = output_paths(item, formats)
    decision = decide(outs, item.output_base, settings, mode, source=SourceFile(item.path))
    if decision.skip:
        record = None if decision.record is None else {**decision.record, "source": str(item.path)}
        return Outcome(item.path, skipped=True, outputs=tuple(outs), record=record)
    if decision.redo_reason and on_redo is not None:
        on_redo(item.path, decision.redo_reason)
    return None


def _identity(path: Path) -> dict | None:
    """The input's identity for its sidecar (:class:`SourceFile`); None when it cannot be read (its
    decoding fails and says why)."""
    try:
        return SourceFile(path).identity()
    except OSError:
        return None


def _write(item: InputFile, result: FileResult | Exception, formats: Sequence[str], settings: Mapping[str, object],
           subtitles: SubtitleOptions | None, source: dict | None = None) -> Outcome:
    """Write one finished item's outputs atomically (sidecar first, recording the input's identity
    ``source``) and return its outcome."""
    if isinstance(result, Exception):
        return Outcome(item.path, error=str(result))
    outs = output_paths(item, formats)
    record = result_record(result, str(item.path))
    texts = {out: render(result, fmt, str(item.path), subtitles) for fmt, out in zip(formats, outs)}
    try:
        write_sidecar(sidecar_path(item.output_base), settings, texts, record, source)  # first: see specli.io.resume
        for out, text in texts.items():
            write_atomic(out, text)
    except OSError as exc:  # an unwritable output: this file fails, the batch goes on
        hidden = exc.filename is None or Path(exc.filename).name.startswith(".")  # the sidecar: name the output
        named = outs[0] if hidden else exc.filename
        return Outcome(item.path, error=f"{item.path}: cannot write {named}: {exc.strerror or exc}")
    return Outcome(item.path, result=result, outputs=tuple(outs), record=record)


def transcribe(
    inputs: Iterable[str | Path],
    preset: str | Preset = DEFAULT_PRESET,
    options: TranscribeOptions = TranscribeOptions(),
    engine: Engine | None = None,
    vad: VadOptions | None = None,
    batch_size: int = 1,
) -> Iterator[Outcome]:
    """Library entry point: transcribe files and directories, yielding one :class:`Outcome` each (in
    input order; up to ``batch_size`` files are transcribed together).

    Nothing is written; failures are reported in ``Outcome.error`` and the batch goes on. A language
    Whisper does not know, or one the model cannot do, raises :class:`specli.errors.UsageError`. Pass a
    loaded ``engine`` (``specli.asr.strategies.load_engine``) to reuse it across calls.
    """
    p = preset if isinstance(preset, Preset) else load_preset(preset)
    options = replace(options, language=normalize_language(options.language))
    if engine is None:
        check_model_name(p.model, options.task, options.language)
        engine = load_engine(p, language=options.language)
    engine.model.speech_hooks().check_support(engine.preset.model, options.task, options.language)
    found, bad = discover(str(i) for i in inputs)
    yield from bad
    paths = [path for path, _root in found]
    longform = engine.preset.longform
    results = transcribe_files(engine.model, enumerate(paths), options, engine.decode,
                               rows_in_flight(batch_size, len(paths), longform), vad=vad, errors=(SpecliError,),
                               longform=longform)
    yield from in_input_order((i, Outcome(paths[i], error=str(r)) if isinstance(r, Exception)
                               else Outcome(paths[i], result=r)) for i, r in results)
