"""Where a batch's outputs go: one name per input (mirrored input paths, a path tag where two would meet) and
an output directory made and proven writable before any model loads."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from specli.errors import UsageError


def path_tag(path: Path) -> str:
    """8 hex digits of the SHA-1 of ``path`` resolved: what tells two inputs apart whose outputs would share a name
    (the same input always gets the same tag)."""
    return hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]


def tagged(base: Path, source: Path) -> Path:
    """``base`` (an output path without extension) with ``source``'s :func:`path_tag`: ``dir/name-1a2b3c4d``."""
    return base.with_name(f"{base.name}-{path_tag(source)}")


def mirrored_bases(found: Sequence[tuple[Path, Path]], output_dir: Path) -> list[Path]:
    """The output base (path without extension) of each ``(file, root)``: the file's path under its root mirrored
    under ``output_dir``; every file whose base another file of the batch shares gets its :func:`path_tag`."""
    bases = [output_dir / f.relative_to(root).with_suffix("") for f, root in found]
    counts: dict[Path, int] = {}
    for b in bases:
        counts[b] = counts.get(b, 0) + 1
    return [tagged(base, f) if counts[base] > 1 else base for (f, _root), base in zip(found, bases)]


def make_output_dir(path: Path, option: str = "the output directory") -> None:
    """Create ``path`` (and its parents) and prove a file can be written there, before any work: :class:`UsageError`
    (exit 2) with the real reason otherwise (a file in the way, a read-only or virtual file system, no permission).
    Safe when several processes make the same directory at once."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".specli-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"cannot create {option} {path}: {_in_the_way(path) or exc.strerror or exc}") from exc


def _in_the_way(path: Path) -> str:
    """"X is not a directory" when ``path`` or its nearest existing ancestor is something else than a directory."""
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return "" if probe.is_dir() else f"{probe} is not a directory"
