"""Capture what C libraries write straight to file descriptor 2, so it neither reaches the user's
terminal nor gets lost: the audio decoders (libsndfile's mpg123) print notes there on bad input."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator


class LibraryStderr:
    """What the C decoders (libsndfile, mpg123, ...) wrote on file descriptor 2 inside :func:`quiet_stderr`."""

    text: str = ""

    def first_line(self) -> str | None:
        """The first message line (terminal control sequences from other threads skipped)."""
        for line in self.text.splitlines():
            line = " ".join(line.split())
            if line and "\x1b" not in line:
                return line.removeprefix("Note: ").rstrip(".")
        return None


@contextlib.contextmanager
def quiet_stderr() -> Iterator[LibraryStderr]:
    """Capture what C libraries write on fd 2 (mpg123 prints 'Note: Illegal Audio-MPEG-Header ...').

    The process's stderr is pointed at a temporary file while the block runs, so nothing reaches the
    user's terminal; the text is kept to explain a failure. Where fd 2 cannot be redirected, nothing is.
    fd 2 is process-wide: another thread's writes during the block are captured as well (keep it short).
    """
    captured = LibraryStderr()
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield captured
        return
    with tempfile.TemporaryFile() as sink:
        try:
            os.dup2(sink.fileno(), 2)
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.text = sink.read(4096).decode("utf-8", "replace")
