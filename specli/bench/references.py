"""Reference transcripts: sidecar ``.txt`` files beside the audio, or a TSV manifest."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from specli.bench.peers import BenchError

TEXT_COLUMNS = ("reference_text", "text", "reference", "transcript")


def sidecar_references(files: Sequence[str]) -> dict[str, str]:
    """``clip.wav`` -> the text of ``clip.txt`` beside it, for the clips that have one."""
    out = {}
    for f in files:
        txt = Path(f).with_suffix(".txt")
        if txt.is_file():
            out[f] = " ".join(txt.read_text(encoding="utf-8").split())
    return out


def manifest_references(manifest: Path, files: Sequence[str]) -> dict[str, str]:
    """A TSV ``path<TAB>text`` (optionally with a header naming ``path`` and a text column).

    Relative paths are relative to the manifest's directory; files are matched by resolved path.
    """
    try:
        rows = list(csv.reader(manifest.read_text(encoding="utf-8").splitlines(), delimiter="\t"))
    except OSError as exc:
        raise BenchError(f"{manifest}: cannot read references ({exc})") from exc
    rows = [r for r in rows if r and r[0].strip()]
    path_col, text_col = 0, 1
    if rows and rows[0][0].strip().lower() == "path":
        header = [h.strip().lower() for h in rows.pop(0)]
        text_col = next((header.index(c) for c in TEXT_COLUMNS if c in header), -1)
        if text_col < 0:
            raise BenchError(f"{manifest}: header has no text column (one of {', '.join(TEXT_COLUMNS)})")
    table = {}
    for row in rows:
        if len(row) <= text_col:
            raise BenchError(f"{manifest}: row {row!r} has no text column")
        table[(manifest.parent / row[path_col].strip()).resolve()] = row[text_col].strip()
    return {f: table[Path(f).resolve()] for f in files if Path(f).resolve() in table}


def load_references(spec: str | None, files: Sequence[str]) -> dict[str, str]:
    """``None`` -> no references; ``"sidecar"`` -> .txt beside each clip; else a TSV manifest path."""
    if not spec:
        return {}
    if spec == "sidecar":
        return sidecar_references(files)
    path = Path(spec)
    if not path.is_file():
        raise BenchError(f"references: {spec!r} is neither 'sidecar' nor a TSV file")
    return manifest_references(path, files)
