"""Resume bookkeeping: the settings each output was made with, so a rerun redoes only what changed.

Beside the outputs of one input (``<base>.txt``, ``<base>.json``, ...) a hidden sidecar
``.<base>.specli`` (JSON) records the text-affecting settings, the identity of the input they were made
from (:class:`SourceFile`: size, mtime and content digest of an audio file), the SHA-256 of every output
written with them and the file's JSON record (what ``--jsonl -`` prints, read back when the file is skipped).
A rerun redoes an output whose settings or input changed; a sidecar from before inputs were recorded
names no input and is trusted on its settings alone.
Synthesis keeps one per output file (``.<id>.npy.specli``, ``.<id>.wav.specli``): the same machinery
with binary outputs, and :func:`file_fingerprint` to name model files and voice prompts by content.

The sidecar is written (atomically) *before* the outputs, with the hashes of the data about to be
written, so there is no moment where outputs exist without it. At check time an output counts as made
with the recorded settings when its hash matches, or when it changed after the sidecar was written (a
hand edit, kept); an output older than the sidecar with another hash is left over from an interrupted
run with other settings and is redone.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from specli.io.atomic import write_atomic

SIDECAR_VERSION = 1
FULL_HASH_BYTES = 16 << 20  # file_fingerprint: files up to this size are hashed whole
_SAMPLE_BLOCKS, _SAMPLE_BYTES = 256, 64 << 10  # file_fingerprint of a larger file: blocks spread evenly over it

RACY_NS = 2_000_000_000  # SourceFile: an input modified this recently is compared by content next time
_HINTS = ("mtime_ns",)  # identity keys that only save a check (not what tells two inputs apart)

# what a rerun does with an input whose outputs all exist: "changed" redoes it when the settings differ,
# "overwrite" always redoes it, "skip-existing" never does
ResumeMode = Literal["changed", "overwrite", "skip-existing"]


def plain_settings(settings: Mapping[str, object]) -> dict:
    """``settings`` as plain JSON values (tuples -> lists, other objects -> str), keys sorted."""
    return json.loads(json.dumps(dict(settings), sort_keys=True, default=str))


def settings_fingerprint(settings: Mapping[str, object]) -> str:
    """A short stable digest of the settings that change the text (a plain dict of name -> value)."""
    canonical = json.dumps(plain_settings(settings), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _flat(settings: Mapping[str, object], prefix: str = "") -> dict:
    """Nested tables as dotted keys (``decoding.beam_size``)."""
    out: dict = {}
    for key, value in settings.items():
        if isinstance(value, Mapping) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def describe_change(old: Mapping[str, object], new: Mapping[str, object]) -> str:
    """``"preset a -> b, language None -> fr, decoding.beam_size None -> 5"``: what differs, by key."""
    old, new = _flat(plain_settings(old)), _flat(plain_settings(new))
    missing = object()
    parts = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, missing), new.get(key, missing)
        if a != b:
            parts.append(f"{key} {_show(a, missing)} -> {_show(b, missing)}")
    return ", ".join(parts) or "settings changed"


def _show(value: object, missing: object) -> str:
    return "(unset)" if value is missing else str(value)


def sidecar_path(output_base: Path) -> Path:
    """The hidden sidecar of the outputs at ``output_base`` (path without extension)."""
    return output_base.with_name(f".{output_base.name}.specli")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_fingerprint(path: Path) -> str:
    """A short digest of a file's content (OSError when it cannot be read), never of its name or times.

    A file up to 16 MiB is hashed whole; a larger one (a checkpoint) by its size and 256 blocks of 64 KiB
    spread evenly over it: 16 MiB read, so a model's weights are told apart in milliseconds (two trainings
    differ in every block) without reading gigabytes at each run.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size <= FULL_HASH_BYTES:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        else:
            digest.update(f"{size}:".encode())
            step = (size - _SAMPLE_BYTES) / (_SAMPLE_BLOCKS - 1)
            for i in range(_SAMPLE_BLOCKS):
                fh.seek(round(i * step))
                digest.update(fh.read(_SAMPLE_BYTES))
    return digest.hexdigest()[:16]


class Source(Protocol):
    """What an output is made from, as resume tells it apart (a file here; a verb may bring its own)."""

    def identity(self) -> dict:
        """Its identity as the sidecar records it (plain JSON values); OSError when it cannot be read."""

    def change(self, recorded: Mapping[str, object]) -> str | None:
        """Why it is not the input ``recorded`` (an earlier :meth:`identity`), or None when it is."""


@dataclass(frozen=True)
class SourceFile:
    """An input file, told apart by size, mtime and :func:`file_fingerprint` (SHA-256 of the whole file up
    to 16 MiB, of its size and 256 spread blocks above). Equal size and mtime count as the same file without
    reading it (as make and rsync do); another mtime is settled by the content, so a touched or copied
    file with the same bytes is not redone. An mtime younger than :data:`RACY_NS` when recorded is not
    kept (as git's "racily clean" entries): a change in the same clock tick would keep it."""

    path: Path

    def identity(self) -> dict:
        st = self.path.stat()
        racy = time.time_ns() - st.st_mtime_ns < RACY_NS
        return {"size": st.st_size, "mtime_ns": None if racy else st.st_mtime_ns,
                "content": file_fingerprint(self.path)}

    def change(self, recorded: Mapping[str, object]) -> str | None:
        try:
            st = self.path.stat()
            if st.st_size != recorded.get("size"):
                return f"input changed (size {recorded.get('size')} -> {st.st_size} bytes)"
            if st.st_mtime_ns == recorded.get("mtime_ns"):
                return None
            same = file_fingerprint(self.path) == recorded.get("content")
        except OSError as exc:
            return f"input changed (cannot read it: {exc.strerror or exc})"
        return None if same else "input changed (same size, other content)"


@dataclass(frozen=True)
class Sidecar:
    """What a sidecar holds."""

    settings: dict  # the text-affecting settings (plain JSON values)
    outputs: dict  # output file name -> SHA-256 of the text (or bytes) written there
    record: dict  # the file's JSON record (as printed by --jsonl -)
    input: dict | None = None  # the identity of the input the outputs were made from (None: not recorded)

    @property
    def fingerprint(self) -> str:
        return settings_fingerprint(self.settings)


def read_sidecar(path: Path) -> Sidecar | None:
    """The sidecar at ``path``; None when missing, unreadable or of another version."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != SIDECAR_VERSION:
        return None
    settings, outputs, record = data.get("settings"), data.get("outputs"), data.get("record")
    source = data.get("input")
    if not (isinstance(settings, dict) and isinstance(outputs, dict) and isinstance(record, dict)
            and (source is None or isinstance(source, dict))):
        return None
    return Sidecar(settings, outputs, record, source)


def write_sidecar(path: Path, settings: Mapping[str, object], texts: Mapping[Path, str | bytes],
                  record: dict, source: Mapping[str, object] | None = None) -> None:
    """Record ``settings``, the input's identity ``source`` (:meth:`Source.identity`, taken before the work)
    and the hashes of ``texts`` (output path -> text, or bytes, about to be written).

    Entries of a previous sidecar made with the same settings from the same input are kept for outputs not
    rewritten now.
    """
    settings = plain_settings(settings)
    source = None if source is None else plain_settings(source)
    outputs: dict = {}
    previous = read_sidecar(path)
    if (previous is not None and previous.fingerprint == settings_fingerprint(settings)
            and _telling(previous.input) == _telling(source)):
        outputs.update(previous.outputs)
    outputs.update({p.name: _sha256(t if isinstance(t, bytes) else t.encode("utf-8")) for p, t in texts.items()})
    data = {"version": SIDECAR_VERSION, "settings": settings, "outputs": outputs, "record": record,
            **({} if source is None else {"input": source})}
    write_atomic(path, json.dumps(data, ensure_ascii=False, sort_keys=True) + "\n")


def _telling(identity: Mapping[str, object] | None) -> dict | None:
    """What tells inputs apart in an identity (its hints left out)."""
    return None if identity is None else {k: v for k, v in identity.items() if k not in _HINTS}


@dataclass(frozen=True)
class ResumeDecision:
    """Whether to skip an input whose outputs may exist, and what to report."""

    skip: bool
    record: dict | None = None  # the record read back from disk, when skipped (None if none is there)
    redo_reason: str | None = None  # why existing outputs are redone (None: nothing was there / overwrite)


def _json_record(output_base: Path) -> dict | None:
    """The record in ``<base>.json`` when there is one (outputs made without a sidecar)."""
    path = output_base.with_name(f"{output_base.name}.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def decide(outputs: Sequence[Path], output_base: Path, settings: Mapping[str, object],
           mode: ResumeMode = "changed", fallback: Callable[[Path], dict | None] | None = _json_record,
           source: Source | None = None) -> ResumeDecision:
    """Skip or redo one input, given its output paths and the settings of this run.

    ``fallback(output_base)`` is the record of outputs kept by "skip-existing" without a sidecar (default:
    the ``<base>.json`` of a transcription); None: no record. ``source``: the input of this run, compared
    with the one the sidecar records ("changed" mode; a sidecar that records none is not compared).
    """
    if mode == "overwrite" or not outputs or not all(o.is_file() for o in outputs):
        return ResumeDecision(skip=False)
    side_path = sidecar_path(output_base)
    sidecar = read_sidecar(side_path)
    if mode == "skip-existing":
        record = sidecar.record if sidecar else fallback(output_base) if fallback else None
        return ResumeDecision(skip=True, record=record)
    if sidecar is None:
        return ResumeDecision(False, redo_reason="no record of the settings its outputs were made with")
    if sidecar.fingerprint != settings_fingerprint(settings):
        return ResumeDecision(False, redo_reason=f"settings changed ({describe_change(sidecar.settings, settings)})")
    why = None if source is None or sidecar.input is None else source.change(sidecar.input)
    if why is not None:
        return ResumeDecision(False, redo_reason=why)
    side_mtime = side_path.stat().st_mtime_ns
    for out in outputs:
        recorded = sidecar.outputs.get(out.name)
        if recorded is None:
            return ResumeDecision(False, redo_reason=f"{out.name} was made with other settings or input")
        if _sha256(out.read_bytes()) != recorded and out.stat().st_mtime_ns < side_mtime:
            return ResumeDecision(False, redo_reason=f"{out.name} is left over from an interrupted run")
    return ResumeDecision(skip=True, record=sidecar.record)
