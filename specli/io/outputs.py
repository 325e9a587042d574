"""Where a batch's outputs go: one name per input (mirrored input paths, a path tag where two would meet) and
an output directory proven usable before any model loads."""

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


def check_output_dir(path: Path, option: str = "the output directory") -> None:
    """Prove ``path`` can take outputs before any work, creating nothing: a file can be made in it, or (when it
    does not exist yet) in its nearest existing ancestor, which must be a directory (a probe file, removed at
    once; each process its own, so runs starting together do not disturb each other). :class:`UsageError` (exit 2)
    with the real reason otherwise (a file in the way, a read-only or virtual file system, no permission)."""
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"cannot create {option} {path}: {probe} is not a directory")
    try:
        fd, name = tempfile.mkstemp(prefix=".specli-probe-", dir=probe)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise UsageError(f"cannot create {option} {path}: {exc.strerror or exc}") from exc
