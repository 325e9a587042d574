"""Where a batch's outputs go: one name per input (mirrored input paths, a path tag where two would meet) and
an output directory proven usable before any model loads."""

from __future__ import annotations

import hashlib
import os
import shutil
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
    """Prove ``path`` can take outputs before any work (:func:`uncreatable_dir`), leaving nothing behind;
    :class:`UsageError` (exit 2) with the real reason otherwise (a file in the way, a read-only or virtual file
    system, an over-long name, no permission)."""
    why = uncreatable_dir(path)
    if why:
        raise UsageError(f"cannot create {option} {path}: {why}")


def uncreatable_dir(path: Path) -> str | None:
    """Why no directory can be at ``path`` with files written in it, or None when one can; nothing is left.

    It is tried for real: the missing part of ``path`` is made inside a hidden directory made (then removed)
    in its nearest existing ancestor, or a nameless file is made in ``path`` when it exists. So read-only
    mounts, ``/proc``, over-long names and a root user's unchecked modes give the real reason where
    ``os.access`` says yes.
    """
    target = Path(os.path.normpath(path.absolute()))
    probe = target
    while not os.path.exists(probe) and probe != probe.parent:  # False, not OSError, for an over-long name
        probe = probe.parent
    if not os.path.isdir(probe):
        return f"{probe} is not a directory"
    try:
        if probe == target:
            tempfile.TemporaryFile(dir=probe).close()
            return None
        trial = tempfile.mkdtemp(prefix=".specli-probe-", dir=probe)
    except OSError as exc:
        return f"cannot write in {probe}: {exc.strerror or exc}"
    made, shown = Path(trial), probe  # the trial directory, and the path the user gave, one level at a time
    try:
        for part in target.relative_to(probe).parts:
            made, shown = made / part, shown / part
            made.mkdir()
    except OSError as exc:
        return f"cannot create {shown}: {exc.strerror or exc}"
    finally:
        shutil.rmtree(trial, ignore_errors=True)
    return None
