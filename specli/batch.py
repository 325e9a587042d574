"""Batch transcription over files and directories: discovery, output naming, resume, per-file errors.

This is the library API behind ``specli transcribe`` / ``specli translate``; the commands only parse
options, call :func:`run_batch` and print.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from specli.audio import AUDIO_EXTENSIONS, iter_audio_chunks
from specli.engines.language import check_model_name, check_model_support, normalize_language
from specli.engines.strategies import Engine, load_engine
from specli.engines.targets.loader import WhisperModel
from specli.engines.transcription import FileResult, TranscribeOptions, transcribe_stream
from specli.errors import AudioError, SpecliError
from specli.presets import DEFAULT_PRESET, Preset, load_preset
from specli.resume import ResumeMode, decide, sidecar_path, write_sidecar
from specli.vad import VadOptions, transcribe_speech
from specli.writers import WRITERS, SubtitleOptions, result_record, to_json, write_atomic


@dataclass(frozen=True)
class InputFile:
    """One audio file of the batch and where its outputs go (without extension)."""

    path: Path
    output_base: Path


@dataclass(frozen=True)
class Outcome:
    """What happened to one input: a result, an error, or skipped because its outputs exist."""

    path: Path
    result: FileResult | None = None
    error: str | None = None  # one-line reason, when it failed
    skipped: bool = False
    outputs: tuple[Path, ...] = ()
    record: dict | None = None  # the file's JSON record (read back from disk when skipped; None if absent)


def discover(inputs: Iterable[str]) -> tuple[list[tuple[Path, Path]], list[Outcome]]:
    """Expand inputs into ``(file, root)`` pairs; inputs that hold no audio become failed outcomes.

    Directories are searched recursively for audio extensions; ``root`` is the directory an
    output path is made relative to (the input directory, or the file's own directory).
    """
    found: list[tuple[Path, Path]] = []
    bad: list[Outcome] = []
    seen: set[Path] = set()
    for raw in inputs:
        p = Path(raw)
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in AUDIO_EXTENSIONS)
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


def plan_outputs(found: Sequence[tuple[Path, Path]], output_dir: Path) -> list[InputFile]:
    """Output base paths mirror each file's path under its root; collisions get a path hash."""
    bases = [output_dir / f.relative_to(root).with_suffix("") for f, root in found]
    counts: dict[Path, int] = {}
    for b in bases:
        counts[b] = counts.get(b, 0) + 1
    items = []
    for (f, _root), base in zip(found, bases):
        if counts[base] > 1:
            digest = hashlib.sha1(str(f.resolve()).encode()).hexdigest()[:8]
            base = base.with_name(f"{base.name}-{digest}")
        items.append(InputFile(f, base))
    return items


def output_paths(item: InputFile, formats: Sequence[str]) -> list[Path]:
    return [item.output_base.with_name(f"{item.output_base.name}.{fmt}") for fmt in formats]


def render(result: FileResult, fmt: str, source: str, subtitles: SubtitleOptions | None = None) -> str:
    if fmt == "json":
        return to_json(result, source)
    if fmt in ("srt", "vtt") and subtitles is not None:
        return WRITERS[fmt](result, subtitles)
    return WRITERS[fmt](result)


def transcribe_file(model: WhisperModel, path: Path, opts: TranscribeOptions, decode=None,
                    on_window: Callable[[float], None] | None = None, vad: VadOptions | None = None) -> FileResult:
    """Transcribe one file with streaming audio; raises :class:`AudioError` for bad input.

    With ``vad``, the file is read fully and only its speech is transcribed (``specli.vad``).
    """
    kwargs = {} if decode is None else {"decode": decode}
    if vad is not None:
        return transcribe_speech(model, iter_audio_chunks(path), opts, vad, on_window=on_window, **kwargs)
    return transcribe_stream(model, iter_audio_chunks(path), opts, on_window=on_window, **kwargs)


def text_settings(preset: Preset, opts: TranscribeOptions, extra: Mapping[str, object] | None = None) -> dict:
    """The settings that change the text, fingerprinted beside every output (``specli.resume``).

    Every field of ``opts`` is included, so a new ``TranscribeOptions`` field is covered without more
    work; settings that live elsewhere (a decoding or VAD option) go into ``extra``.
    """
    return {"preset": preset.name, "model": preset.model, "dtype": preset.dtype, **asdict(opts), **(extra or {})}


def run_batch(
    model: WhisperModel,
    items: Sequence[InputFile],
    opts: TranscribeOptions,
    formats: Sequence[str],
    overwrite: bool = False,
    decode=None,
    on_window: Callable[[Path, float], None] | None = None,
    settings: Mapping[str, object] | None = None,
    mode: ResumeMode | None = None,
    on_redo: Callable[[Path, str], None] | None = None,
    vad: VadOptions | None = None,
    subtitles: SubtitleOptions | None = None,
) -> Iterator[Outcome]:
    """Transcribe each item and write its outputs atomically, with a sidecar of the settings used.

    An item whose outputs all exist is skipped when they were made with the same ``settings`` (default:
    the fields of ``opts``); otherwise it is redone and ``on_redo(path, reason)`` says why. ``mode``
    "overwrite" (or ``overwrite=True``) always redoes, "skip-existing" keeps whatever exists.
    """
    settings = dict(settings) if settings is not None else {**asdict(opts), **({"vad": asdict(vad)} if vad else {})}
    mode = mode or ("overwrite" if overwrite else "changed")
    for item in items:
        outs = output_paths(item, formats)
        decision = decide(outs, item.output_base, settings, mode)
        if decision.skip:
            record = None if decision.record is None else {**decision.record, "source": str(item.path)}
            yield Outcome(item.path, skipped=True, outputs=tuple(outs), record=record)
            continue
        if decision.redo_reason and on_redo is not None:
            on_redo(item.path, decision.redo_reason)
        try:
            cb = (lambda s, p=item.path: on_window(p, s)) if on_window else None
            result = transcribe_file(model, item.path, opts, decode, cb, vad)
        except AudioError as exc:
            yield Outcome(item.path, error=str(exc))
            continue
        record = result_record(result, str(item.path))
        texts = {out: render(result, fmt, str(item.path), subtitles) for fmt, out in zip(formats, outs)}
        try:
            write_sidecar(sidecar_path(item.output_base), settings, texts, record)  # first: see specli.resume
            for out, text in texts.items():
                write_atomic(out, text)
        except OSError as exc:  # an unwritable output: this file fails, the batch goes on
            yield Outcome(item.path, error=f"{item.path}: cannot write {exc.filename or 'output'}: {exc.strerror or exc}")
            continue
        yield Outcome(item.path, result=result, outputs=tuple(outs), record=record)


def transcribe(
    inputs: Iterable[str | Path],
    preset: str | Preset = DEFAULT_PRESET,
    options: TranscribeOptions = TranscribeOptions(),
    engine: Engine | None = None,
    vad: VadOptions | None = None,
) -> Iterator[Outcome]:
    """Library entry point: transcribe files and directories, yielding one :class:`Outcome` each.

    Nothing is written; failures are reported in ``Outcome.error`` and the batch goes on. A language
    Whisper does not know, or one the model cannot do, raises :class:`specli.errors.UsageError`. Pass a
    loaded ``engine`` (``specli.engines.strategies.load_engine``) to reuse it across calls.
    """
    p = preset if isinstance(preset, Preset) else load_preset(preset)
    options = replace(options, language=normalize_language(options.language))
    if engine is None:
        check_model_name(p.model, options.task, options.language)
        engine = load_engine(p, language=options.language)
    check_model_support(engine.model.special, engine.preset.model, options.task, options.language)
    found, bad = discover(str(i) for i in inputs)
    yield from bad
    for path, _root in found:
        try:
            yield Outcome(path, result=transcribe_file(engine.model, path, options, engine.decode, vad=vad))
        except SpecliError as exc:
            yield Outcome(path, error=str(exc))
