"""Token trees for one verification pass: node parents, attention mask, positions, paths.

A draft is a tree whose node ``i`` has token ``tokens[i]`` and parent ``parents[i]`` (``-1`` is the
root: the last committed token, scored in the same forward). A chain is the tree with
``parents == [-1, 0, 1, ...]``. Parents always come before their children.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specli.core.device import host_to_device


def chain_parents(n: int) -> list[int]:
    return list(range(-1, n - 1))


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node; children of the root have depth 1."""
    out: list[int] = []
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"node {i} has parent {p}: parents must precede their children")
        out.append(1 if p == -1 else out[p] + 1)
    return out


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """Node indices from the root's child down to ``node`` (empty for the root, ``-1``)."""
    path = []
    while node != -1:
        path.append(node)
        node = parents[node]
    return path[::-1]


def tree_inputs(
    parents: Sequence[int], start: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask ``[1, n+1, n+1]`` and positions ``[1, n+1]`` on ``device`` for scoring ``[root] + nodes`` at
    ``start``. Row 0 is the root (at position ``start``); row ``i + 1`` is node ``i``.

    Built on the host and copied once (one transfer each, no readback).
    """
    n = len(parents)
    d = depths(parents)
    rows = [[True] + [False] * n for _ in range(n + 1)]
    for i in range(n):
        for j in path_to(parents, i):
            rows[i + 1][j + 1] = True
    mask = host_to_device([rows], torch.bool, device)
    positions = host_to_device([[start] + [start + x for x in d]], torch.long, device)
    return mask, positions


def is_chain(parents: Sequence[int]) -> bool:
    return list(parents) == chain_parents(len(parents))
