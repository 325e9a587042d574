"""On-policy distillation data for EAGLE heads: the target's own greedy transcripts, window by window.

Each input file is transcribed exactly as inference decodes it (``transcribe_stream`` with default
options and plain greedy decoding, so conditioning on previous text, timestamps and seeking are the
same), recording every window's encoder output, prompt and sampled tokens (eot included when the
window finished). One extra target ``score`` over the whole sequence gives the low / mid / last
decoder hidden states of every position.

Shards (``shard-NNNNN.pt``, one per input file, written atomically with ``torch.save`` of plain
tensors and ints only; read back with ``torch.load(weights_only=True)``) hold per window:

* ``tokens`` int64 ``[T]``: prompt + sampled (+ eot), ``plen`` int: prompt length;
* ``audio`` fp16 ``[audio_ctx, d]``: the encoder output the head cross-attends to (recomputing it
  from mel would cost an encoder forward per window per epoch);
* ``low`` / ``mid`` / ``last`` fp16 ``[T, d]``: the target's hidden states of every row;
* ``start`` / ``samples`` ints: the window's first sample and length in its file (16 kHz), ``temperature``
  float: the temperature of the kept decode (:mod:`specli.distill.labels` keeps these, the tokens and the
  file's sha256 as small committed labels, and rebuilds the tensors from them).

Per window that is ``audio_ctx * d * 2 + 3 * T * d * 2`` bytes: 1.15 MB + 2.3 KB/token for
tiny (d=384), 1.5 MB + 3 KB/token for base (d=512). ``manifest.json`` lists the finished inputs;
a rerun skips them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specli.io.atomic import write_atomic, write_atomic_with
from specli.io.audio import iter_audio_chunks
from specli.io.digest import file_sha256
from specli.asr.drafters.eagle_head import target_fingerprint
from specli.asr.fallback import AR, WindowDecode
from specli.models.whisper.loader import WhisperModel
from specli.asr.scheduler import transcribe_batched
from specli.asr.windows import (TranscribeOptions, WindowObserver, WindowSpan, transcribe_steps,
                                transcribe_stream)
from specli.core.device import DTYPES
from specli.errors import SpecliError

MANIFEST = "manifest.json"
Progress = Callable[[str, int, int], None]  # (message, files done, files total)


@dataclass(frozen=True)
class DataSummary:
    """What one ``generate`` call did."""

    done: int  # inputs processed now
    skipped: int  # inputs already in the manifest
    windows: int  # windows written now


def open_manifest(out: Path, fingerprint: str | None = None, name: str | None = None) -> dict:
    """The manifest of ``out`` (empty when new); refuses one made with another target (``fingerprint``)."""
    path = out / MANIFEST
    manifest = json.loads(path.read_text()) if path.is_file() else {"done": {}, "next_shard": 0}
    if fingerprint is not None:
        if manifest.setdefault("fingerprint", fingerprint) != fingerprint:
            raise SpecliError(f"{out}: data was generated with another target ({manifest.get('model')!r})")
        manifest.setdefault("model", name)
    return manifest


def read_manifest(out: Path, model: WhisperModel | None = None) -> dict:
    """The manifest of ``out`` (empty when new); refuses one made with another target."""
    if model is None:
        return open_manifest(out)
    return open_manifest(out, target_fingerprint(model.target.dims), model.name)


def write_manifest(out: Path, manifest: dict) -> None:
    write_atomic(out / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))


def add_shard(out: Path, manifest: dict, key: str, records: list[dict], **info) -> str:
    """Write ``records`` as the next shard (atomically), list it under ``key`` and save the manifest."""
    shard = f"shard-{manifest['next_shard']:05d}.pt"
    write_atomic_with(out / shard, lambda fh: torch.save({"windows": records}, fh))
    manifest["done"][key] = {"shard": shard, "windows": len(records), **info}
    manifest["next_shard"] += 1
    write_manifest(out, manifest)
    return shard


def _recorder(windows: list[dict], eot: int) -> WindowObserver:
    """A window observer that records each window's encoder output, prompt, kept tokens, span and temperature."""

    def record(state, prompt: list[int], win: WindowDecode, span: WindowSpan) -> None:
        res = win.result
        tokens = list(prompt) + res.tokens + ([eot] if res.finished else [])
        windows.append({"audio": state.audio_features[0], "tokens": tokens, "plen": len(prompt),
                        "start": span.start, "samples": span.samples, "temperature": win.temperature})

    return record


def _records(model: WhisperModel, windows: list[dict]) -> list[dict]:
    """Shard records of recorded windows: :func:`window_record` plus where each window lies and its temperature."""
    return [window_record(model, w["audio"], w["tokens"], w["plen"])
            | {"start": w["start"], "samples": w["samples"], "temperature": w["temperature"]} for w in windows]


def window_record(model: WhisperModel, audio: torch.Tensor, tokens: list[int], plen: int) -> dict:
    """One window's shard record: tokens, encoder output and the hidden states of every row (fp16)."""
    target = model.target
    tokens = tokens[: target.dims.text_ctx]
    state = target.start(audio[None])
    out = target.score(state, torch.tensor([tokens]))
    h = out.hidden
    return {
        "tokens": torch.tensor(tokens, dtype=torch.long), "plen": plen, "audio": audio.half().clone(),
        "low": h.low[0].half().clone(), "mid": h.mid[0].half().clone(), "last": h.last[0].half().clone(),
    }


def file_records(model: WhisperModel, path: Path, opts: TranscribeOptions = TranscribeOptions()) -> list[dict]:
    """Transcribe ``path`` as inference does (``opts``: fallback included) and return its windows' records."""
    windows: list[dict] = []
    transcribe_stream(model, iter_audio_chunks(path), opts, on_decode=_recorder(windows, model.special.eot))
    return _records(model, windows)


def _labelled(model: WhisperModel, paths: Sequence[Path], opts: TranscribeOptions,
              batch_size: int) -> Iterator[tuple[Path, list[dict] | SpecliError]]:
    """``(path, window records or the file's error)`` of each file as it finishes: one at a time
    (``file_records``), or up to ``batch_size`` files in flight through the batched scheduler (the same
    greedy tokens: batched decoding equals batch-1 decoding; fallback re-decodes run per file)."""
    if batch_size == 1:
        for path in paths:
            try:
                yield path, file_records(model, path, opts)
            except SpecliError as exc:
                yield path, exc
        return
    seen: dict[Path, list[dict]] = {p: [] for p in paths}

    def job(path: Path):
        return lambda: transcribe_steps(model, iter_audio_chunks(path), opts,
                                        on_decode=_recorder(seen[path], model.special.eot))

    jobs = ((p, job(p)) for p in paths)
    for path, result in transcribe_batched(model, jobs, batch_size, AR, errors=(SpecliError,)):
        windows = seen.pop(path)
        if isinstance(result, SpecliError):
            yield path, result
        else:
            yield path, _records(model, windows)


def generate(
    inputs: Sequence[Path], model: WhisperModel, out: Path, progress: Progress | None = None,
    options: TranscribeOptions = TranscribeOptions(), batch_size: int = 1,
) -> DataSummary:
    """Write one shard per input not yet in ``out``'s manifest (decoded with ``options`` as inference
    would: task, language, timestamps; ``batch_size`` files at a time); the manifest is updated after each
    file and records each input's task, timestamp mode and language. A file that cannot be read fails
    alone: the others are labelled, then the first such error is raised."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    out.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(out, model)
    manifest.setdefault("dtype", dtype_name(model))
    todo = list(dict.fromkeys(Path(p) for p in inputs if str(Path(p).resolve()) not in manifest["done"]))
    skipped, windows, done = len(inputs) - len(todo), 0, 0
    failed: list[SpecliError] = []
    for path, records in _labelled(model, todo, options, batch_size):
        if isinstance(records, SpecliError):
            failed.append(records)
            continue
        shard = add_shard(out, manifest, str(path.resolve()), records, task=options.task,
                          timestamps=options.timestamps, language=options.language, sha256=file_sha256(path))
        done, windows = done + 1, windows + len(records)
        if progress is not None:
            progress(f"{path}: {len(records)} window(s) -> {shard}", skipped + done, len(inputs))
    write_manifest(out, manifest)
    if failed:
        raise failed[0]
    return DataSummary(done, skipped, windows)


def dtype_name(model: WhisperModel) -> str:
    """The preset name of the target's numeric type (``int8`` for the weight-only int8 decoder)."""
    return next(name for name, dt in DTYPES.items() if dt == model.target.dtype)


def load_windows(data_dir: Path) -> list[dict]:
    """Every window record of the shards listed in ``data_dir``'s manifest (in manifest order)."""
    manifest = read_manifest(data_dir)
    if not manifest["done"]:
        raise SpecliError(f"{data_dir}: no distillation shards (run `specli distill data` first)")
    windows: list[dict] = []
    for entry in sorted(manifest["done"].values(), key=lambda e: e["shard"]):
        windows += torch.load(data_dir / entry["shard"], weights_only=True)["windows"]
    return windows
