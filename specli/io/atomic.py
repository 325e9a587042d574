"""Atomic file output: every file specli writes appears whole or not at all (temporary file + rename)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8, line ends as they are) to ``path`` atomically (see :func:`write_atomic_with`)."""
    write_atomic_with(path, lambda fh: fh.write(text.encode("utf-8")))


def write_atomic_with(path: Path, fill: Callable[[BinaryIO], object]) -> None:
    """Let ``fill`` write ``path``'s bytes to a temporary file in the same directory, then rename it.

    The temporary file is hidden (``.<name>.<random>.part``) and created with the usual
    permissions (0666 less the umask), so the output gets the mode a plain write would give it.
    If ``fill``, the sync or the rename fails, the temporary file is removed and ``path`` is untouched.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
