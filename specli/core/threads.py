"""torch's intra-op thread count for one call: ``--threads`` / ``BenchOptions.threads`` set it for the call and
the count found on entry is put back when it returns, so a process that embeds specli (or runs its commands
in-process, as Click's test runner does) keeps its own setting. Inter-op threads cannot be changed once work has
run, so they are left alone."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block at ``n`` intra-op threads (None or 0: the count as it is), then restore the count it found."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
