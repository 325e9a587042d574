"""Atomic file output: every file specli writes appears whole or not at all (temporary file + rename)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

_PART = re.compile(r"\.(.+)\.[0-9a-f]{8}\.part")  # the temporary name of an output being written


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8, line ends as they are) to ``path`` atomically (see :func:`write_atomic_with`)."""
    write_atomic_with(path, lambda fh: fh.write(text.encode("utf-8")))


def write_atomic_with(path: Path, fill: Callable[[BinaryIO], object]) -> None:
    """Let ``fill`` write ``path``'s bytes to a temporary file in the same directory, then rename it.

    The temporary file is hidden (``.<name>.<random>.part``), locked while it is written (see
    :func:`remove_stale_parts`) and created with the usual permissions (0666 less the umask), so the output
    gets the mode a plain write would give it. If ``fill``, the sync or the rename fails, the temporary file
    is removed and ``path`` is untouched; an OSError names ``path``, never the temporary file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        fd = None
        while fd is None:  # the name is known before the file exists: a signal at any point still removes it
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
            try:
                fd = _open_part(tmp)
            except FileExistsError:  # another writer's name: never ours to remove
                tmp = None
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
            os.replace(tmp, path)  # still locked: never taken for stale
    except BaseException as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):  # e.g. a name too long to have been created
                tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and (exc.filename is None or _PART.fullmatch(Path(exc.filename).name)):
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise


def _open_part(tmp: Path) -> int | None:
    """Create the temporary file ``tmp``, exclusively locked (a lock the kernel drops when the process dies); None
    when another run removed it as stale between the open and the lock (take another name)."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_nlink:
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def remove_stale_parts(paths: Iterable[Path]) -> list[Path]:
    """Remove the temporary files of ``paths`` left by a writer that died (a SIGKILL inside a write); return them.

    A temporary file is stale when nobody holds its lock; one being written by a live process (a concurrent
    run) is left alone. Each directory is listed once.
    """
    by_dir: dict[Path, set[str]] = {}
    for p in paths:
        by_dir.setdefault(p.parent, set()).add(p.name)
    removed = []
    for folder, names in by_dir.items():
        try:
            entries = [e for e in os.scandir(folder) if (m := _PART.fullmatch(e.name)) and m.group(1) in names]
        except OSError:  # no such directory yet: nothing left there
            continue
        removed += [Path(e.path) for e in entries if _remove_if_unlocked(Path(e.path))]
    return removed


def _remove_if_unlocked(part: Path) -> bool:
    try:
        fd = os.open(part, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # fails while its writer lives
        part.unlink()
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


#: name prefix of the hidden directories a cache entry is built in (``<prefix><entry>-<random>``)
PARTIAL_PREFIX = ".partial-"


def publish_dir(final: Path, build: Callable[[Path], object], complete: Callable[[Path], bool]) -> Path:
    """Make the directory ``final`` (a shared cache entry) whole or not at all, safe when processes make it at once.

    ``build`` fills a hidden partial directory beside ``final`` (``.partial-<name>-<random>``, mode 0755), which
    is then renamed into place. When the rename finds ``final`` already there (another process made it first),
    ``complete(final)`` verifies that entry and it is returned; an entry there that is not complete (an older
    format, a damaged copy) is moved aside and replaced. The partial directory never outlives the call, whether
    it succeeds or fails (OSError from the file system, whatever ``build`` raises)."""
    if complete(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{PARTIAL_PREFIX}{final.name}-", dir=final.parent))
    try:
        build(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it 0700; a cache entry is as readable as the others
        if final.exists() and not complete(final):
            _discard(final)
        try:
            os.replace(tmp, final)
        except OSError:
            if not complete(final):  # not another process's finished entry
                raise
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _discard(entry: Path) -> None:
    """Remove ``entry`` by first renaming it to a partial name (no reader ever sees it half deleted)."""
    aside = entry.with_name(f"{PARTIAL_PREFIX}{entry.name}-old-{secrets.token_hex(4)}")
    try:
        os.replace(entry, aside)
    except FileNotFoundError:  # another process moved it first
        return
    shutil.rmtree(aside, ignore_errors=True)
