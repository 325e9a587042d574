"""The one file digest of the code base: a file's sha256, read in blocks (weights of tens of MB never held whole)."""

from __future__ import annotations

import hashlib
import os


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of the bytes of the file at ``path``, as lower-case hex."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
