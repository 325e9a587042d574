"""Stopping a batch command early: Ctrl-C, SIGTERM or a closed stdout pipe.

Each says what finished (kept on disk) in one line on stderr and exits as shells report the signal: 130
for Ctrl-C (128 + SIGINT), 143 for SIGTERM (what ``timeout``, systemd and Kubernetes send), 141 for a
closed pipe (128 + SIGPIPE, as ``yes | head`` reports). SIGTERM is raised as :class:`Terminated`, a
``KeyboardInterrupt``, so every place that handles Ctrl-C handles it the same way.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (raised in the main thread, wherever the program is, as Ctrl-C is)."""


def exit_code(exc: KeyboardInterrupt) -> int:
    """The exit status of a run stopped by ``exc``."""
    return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Run the block with SIGTERM raising :class:`Terminated` (main thread only; elsewhere signals cannot be
    handled). A second SIGTERM while the first is being handled ends the process at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(_signum, _frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def report_interrupt(finished: Callable[[], str], label: bool = True) -> Iterator[None]:
    """Run the block; when it is stopped print ``interrupted: <finished()>`` (``finished()`` alone without
    ``label``) on stderr and exit 130 / 143, or say that stdout was closed and exit 141."""
    try:
        yield
    except KeyboardInterrupt as exc:
        click.echo(f"interrupted: {finished()}" if label else finished(), err=True)
        raise SystemExit(exit_code(exc)) from None
    except BrokenPipeError:
        _drop_stdout()
        click.echo(f"stopped: standard output was closed (broken pipe); {finished()}", err=True)
        raise SystemExit(EXIT_BROKEN_PIPE) from None


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so what is still buffered for the closed pipe cannot fail again at exit."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test runner's buffer)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
