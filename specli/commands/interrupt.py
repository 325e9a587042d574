"""Ctrl-C in a batch command: say what finished (kept on disk), then exit 130 as shells report SIGINT."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

EXIT_INTERRUPTED = 130  # 128 + SIGINT


@contextmanager
def report_interrupt(finished: Callable[[], str]) -> Iterator[None]:
    """Run the block; on Ctrl-C print ``interrupted: <finished()>`` on stderr and exit 130."""
    try:
        yield
    except KeyboardInterrupt:
        click.echo(f"interrupted: {finished()}", err=True)
        raise SystemExit(EXIT_INTERRUPTED) from None
