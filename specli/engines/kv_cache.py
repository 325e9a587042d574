"""Preallocated, position-indexed self-attention KV cache.

Slot ``i`` of the cache holds the keys and values of the token at decoder position ``i`` of the
current sequence. Rolling back is moving ``length`` (:meth:`KVCache.crop`); keeping one path of a
scored token tree is :meth:`KVCache.compact`. Nothing is ever reallocated while decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specli.engines.device import host_to_device


class KVCache:
    """Keys and values of every decoder layer, ``[layers, batch, heads, max_len, head_dim]`` each.

    All rows of the batch share one ``length`` (batch-shaped tensors, one sequence length).
    """

    def __init__(
        self,
        layers: int,
        batch: int,
        heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (layers, batch, heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, H, T, D]
        self.values = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, H, T, D]
        self.length = 0  # slots [0, length) hold valid tokens

    @property
    def device(self) -> torch.device:
        """Where the cache (and so the decode step's tensors) lives."""
        return self.keys.device

    @property
    def max_len(self) -> int:
        return self.keys.shape[3]

    @torch.inference_mode()
    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``/``v`` (``[B, H, n, D]``) at slots ``[start, start + n)`` of ``layer``."""
        n = k.shape[2]
        if start + n > self.max_len:
            raise ValueError(f"KV cache overflow: {start + n} > {self.max_len} slots")
        self.keys[layer, :, :, start : start + n] = k
        self.values[layer, :, :, start : start + n] = v

    def view(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``layer`` for slots ``[0, end)``: ``[B, H, end, D]`` each."""
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def crop(self, length: int) -> None:
        """Forget every slot from ``length`` on (a rollback; nothing is copied)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        self.length = length

    @torch.inference_mode()
    def compact(self, start: int, indices: Sequence[int] | torch.Tensor) -> None:
        """Keep slots ``[0, start)`` plus ``indices`` (absolute, increasing), moved to ``start...``.

        Used after scoring a token tree at slots ``[start, start + n)``: ``indices`` are the slots of
        the accepted root-to-leaf path; afterwards ``length == start + len(indices)``.
        """
        # checked on the host copy when given one (a device tensor would cost a sync per step)
        host = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
        if host and (min(host) < start or max(host) >= self.length):
            raise ValueError(f"compact indices {host} outside [{start}, {self.length})")
        idx = host_to_device(host, torch.long, self.keys.device)
        n = idx.numel()
        if n:
            self.keys[:, :, :, start : start + n] = self.keys.index_select(3, idx)
            self.values[:, :, :, start : start + n] = self.values.index_select(3, idx)
        self.length = start + n


def cached_attention_mask(start: int, n: int, tree_mask: torch.Tensor | None,  # [B or 1, n, n] bool
                          device: torch.device | str) -> torch.Tensor | None:
    """Boolean mask ``[B or 1, 1, n, start + n]``: every cached slot, plus the tree (or causal) mask."""
    if tree_mask is None:
        if n == 1:
            return None
        tree_mask = torch.ones(n, n, dtype=torch.bool, device=device).tril().unsqueeze(0)
    prefix = torch.ones(tree_mask.shape[0], n, start, dtype=torch.bool, device=device)
    return torch.cat([prefix, tree_mask.to(torch.bool)], dim=2).unsqueeze(1)
