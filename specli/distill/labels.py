"""Labels that survive a machine: the token ids of on-policy windows, small enough to commit.

A ``distill data`` shard holds per window fp16 tensors (about 1.5 MB for whisper-base); a label holds what
produced them: the audio file (path and sha256), the window's first sample and length, the prompt length,
the token ids and the temperature of the kept decode. :func:`rebuild` recomputes the tensors as labelling did
(the same window reader, log-mel, encoder and target ``score``), so a committed label file and the audio give
the shards back on a new machine without decoding again (bit for bit where the labels were made at batch 1;
a batched labelling encoded its windows together, which rounds differently in the last bits).

File: JSON lines. The first line is the header ``{"specli_labels": 1, "model", "fingerprint", "dtype"}``;
then one line per audio file ``{"audio", "sha256", "task", "timestamps", "language", "windows": [{"start",
"samples", "plen", "temperature", "tokens"}]}``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specli.asr.drafters.eagle_head import target_fingerprint
from specli.asr.windows import WindowReader
from specli.distill.data import (DataSummary, Progress, add_shard, dtype_name, read_manifest,
                                 window_record, write_manifest)
from specli.errors import SpecliError
from specli.io.atomic import write_atomic
from specli.io.audio import N_SAMPLES, iter_audio_chunks
from specli.io.digest import file_sha256
from specli.models.whisper.loader import WhisperModel

VERSION = 1
WINDOW_KEYS = ("start", "samples", "plen", "temperature", "tokens")


@dataclass(frozen=True)
class LabelSummary:
    """What :func:`export_labels` wrote."""

    files: int  # audio files labelled
    windows: int  # windows
    tokens: int  # token ids in all (prompts included)


def export_labels(data_dir: Path, out: Path) -> LabelSummary:
    """Write the labels of ``data_dir``'s shards (``distill data`` output) to ``out`` atomically."""
    manifest = read_manifest(data_dir)
    if not manifest["done"]:
        raise SpecliError(f"{data_dir}: no distillation shards (run `specli distill data` first)")
    lines = [json.dumps({"specli_labels": VERSION, "model": manifest.get("model"),
                         "fingerprint": manifest.get("fingerprint"), "dtype": manifest.get("dtype")})]
    windows = tokens = 0
    for key, entry in sorted(manifest["done"].items(), key=lambda kv: kv[1]["shard"]):
        records = torch.load(data_dir / entry["shard"], weights_only=True)["windows"]
        if "sha256" not in entry or any("start" not in r for r in records):
            raise SpecliError(f"{data_dir / entry['shard']}: made before labels were kept (no window spans or "
                              "sha256): label the audio again")
        rows = [{"start": r["start"], "samples": r["samples"], "plen": r["plen"], "temperature": r["temperature"],
                 "tokens": r["tokens"].tolist()} for r in records]
        lines.append(json.dumps({"audio": key, "sha256": entry["sha256"], "task": entry["task"],
                                 "timestamps": entry["timestamps"], "language": entry["language"], "windows": rows}))
        windows, tokens = windows + len(rows), tokens + sum(len(r["tokens"]) for r in rows)
    write_atomic(out, "\n".join(lines) + "\n")
    return LabelSummary(len(lines) - 1, windows, tokens)


def read_labels(path: Path) -> tuple[dict, list[dict]]:
    """``(header, file entries)`` of a label file; a malformed one is a :class:`SpecliError` naming the line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecliError(f"{path}: cannot read labels ({exc})") from exc
    lines = [line for line in text.splitlines() if line.strip()]
    entries = []
    for n, line in enumerate(lines, 1):
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecliError(f"{path}:{n}: not JSON ({exc.msg})") from exc
        if not isinstance(item, dict):
            raise SpecliError(f"{path}:{n}: expected an object")
        entries.append(item)
    if not entries or entries[0].get("specli_labels") != VERSION:
        raise SpecliError(f"{path}: not a specli label file (version {VERSION} header missing)")
    for n, entry in enumerate(entries[1:], 2):
        missing = [k for k in ("audio", "sha256", "windows") if k not in entry]
        missing += sorted({k for w in entry.get("windows", []) for k in WINDOW_KEYS if k not in w})
        if missing:
            raise SpecliError(f"{path}:{n}: missing {', '.join(missing)}")
    return entries[0], entries[1:]


def locate(entry: dict, search: Sequence[Path]) -> Path:
    """The audio of a label entry: its recorded path, else a file of the same name under ``search``, checked
    by sha256 either way."""
    recorded = Path(entry["audio"])
    # lazily: the search folders are walked only when the recorded path is missing or changed
    candidates = itertools.chain([recorded], (p for d in search for p in sorted(Path(d).rglob(recorded.name))))
    for path in candidates:
        if path.is_file() and file_sha256(path) == entry["sha256"]:
            return path
    where = f" or under {', '.join(map(str, search))}" if search else " (give --audio-dir to search elsewhere)"
    raise SpecliError(f"{recorded}: audio with sha256 {entry['sha256'][:12]}... not found at its path{where}")


def file_records(model: WhisperModel, path: Path, windows: list[dict]) -> list[dict]:
    """The shard records of one file's labelled windows, recomputed from its audio."""
    hooks, target = model.speech_hooks(), model.target
    reader = WindowReader(iter_audio_chunks(path))
    records = []
    for w in sorted(windows, key=lambda w: w["start"]):
        audio = reader.window(w["start"], N_SAMPLES)
        if len(audio) != w["samples"]:
            raise SpecliError(f"{path}: the window at sample {w['start']} has {len(audio)} samples, the labels "
                              f"say {w['samples']}")
        mel, frames = hooks.features(audio)
        state = target.start(target.encode(mel, [frames]), features=mel)
        rec = window_record(model, state.audio_features[0], w["tokens"], w["plen"])
        records.append(rec | {"start": w["start"], "samples": w["samples"], "temperature": w["temperature"]})
    return records


def rebuild(labels: Path, model: WhisperModel, out: Path, search: Sequence[Path] = (),
            progress: Progress | None = None) -> DataSummary:
    """Write ``distill data`` shards to ``out`` from a label file (resumable: files in ``out``'s manifest are
    skipped). The target must be the labels' (same fingerprint); a file whose audio is missing or changed fails
    alone: the others are rebuilt, then one error naming each such file is raised."""
    header, entries = read_labels(labels)
    if header.get("fingerprint") not in (None, target_fingerprint(model.target.dims)):
        raise SpecliError(f"{labels}: labelled by another target ({header.get('model')!r}), not {model.name!r}")
    out.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(out, model)
    manifest.setdefault("dtype", dtype_name(model))
    todo = [e for e in entries if e["audio"] not in manifest["done"]]
    done = windows = 0
    failed: list[SpecliError] = []
    for entry in todo:
        try:
            records = file_records(model, locate(entry, search), entry["windows"])
        except SpecliError as exc:
            failed.append(exc)
            continue
        shard = add_shard(out, manifest, entry["audio"], records, task=entry.get("task"),
                          timestamps=entry.get("timestamps"), language=entry.get("language"), sha256=entry["sha256"])
        done, windows = done + 1, windows + len(records)
        if progress is not None:
            progress(f"{entry['audio']}: {len(records)} window(s) -> {shard}", len(entries) - len(todo) + done,
                     len(entries))
    write_manifest(out, manifest)
    if failed:
        raise SpecliError("\n".join(map(str, failed)))
    return DataSummary(done, len(entries) - len(todo), windows)
