"""Whether outputs can go somewhere, found out before any work (a usage error then, not a failure per file)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


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
