"""Preallocated, position-indexed self-attention KV caches.

Slot ``i`` of the cache holds the keys and values of the token at decoder position ``i`` of the
current sequence. Rolling back is moving ``length`` (:meth:`KVCache.crop`); keeping one path of a
scored token tree is :meth:`KVCache.compact`. Nothing is ever reallocated while decoding.

:class:`KVCache` holds one sequence (or rows that share one length: beams); :class:`RaggedKVCache`
holds a batch of independent sequences with one length per row (core/batched.py). Targets score
through the protocol both share: ``begin`` (the attention mask), ``update`` per layer (write this
score's K/V, return what to attend to), ``end``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specli.core.device import host_to_device


class _KVTensors:
    """The preallocated keys and values both caches hold: ``[layers, rows, heads, slots, head_dim]`` each."""

    def __init__(self, shape: tuple[int, int, int, int, int], dtype: torch.dtype, device: torch.device | str) -> None:
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, H, T, D]
        self.values = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, H, T, D]

    @property
    def device(self) -> torch.device:
        """Where the cache (and so the decode step's tensors) lives."""
        return self.keys.device


class KVCache(_KVTensors):
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
        super().__init__((layers, batch, heads, max_len, head_dim), dtype, device)
        self.length = 0  # slots [0, length) hold valid tokens

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

    @classmethod
    def over(cls, keys: torch.Tensor, values: torch.Tensor, length: int) -> KVCache:
        """A cache over existing ``[L, B, H, T, D]`` tensors (e.g. one row of a :class:`RaggedKVCache`)."""
        cache = cls.__new__(cls)
        cache.keys, cache.values, cache.length = keys, values, length
        return cache

    @torch.inference_mode()
    def widened(self, rows: int) -> KVCache:
        """A new ``rows``-row cache whose filled slots are row 0's, copied into every row (beam search)."""
        layers, _b, heads, max_len, head_dim = self.keys.shape
        cache = KVCache(layers, rows, heads, max_len, head_dim, self.keys.dtype, self.device)
        cache.keys[:, :, :, : self.length] = self.keys[:, :1, :, : self.length]
        cache.values[:, :, :, : self.length] = self.values[:, :1, :, : self.length]
        cache.length = self.length
        return cache

    @torch.inference_mode()
    def reorder(self, sources: Sequence[int]) -> None:
        """Row ``i`` takes the filled slots of row ``sources[i]`` (beam search keeps its best hypotheses)."""
        n = self.length
        idx = host_to_device(list(sources), torch.long, self.device)
        self.keys[:, :, :, :n] = self.keys[:, :, :, :n].index_select(1, idx)
        self.values[:, :, :, :n] = self.values[:, :, :, :n].index_select(1, idx)

    # the score protocol shared with RaggedKVCache: begin -> update per layer -> end
    def span(self, batch: int, n: int) -> int:
        """One past the last slot a score of ``n`` tokens writes."""
        return self.length + n

    def positions(self, batch: int, n: int, device: torch.device | str) -> torch.Tensor:
        """Default decoder positions ``[batch, n]`` of ``n`` chained tokens."""
        return torch.arange(self.length, self.length + n, device=device).expand(batch, n)

    def begin(self, batch: int, n: int, tree_mask: torch.Tensor | None,  # [B or 1, n, n] bool
              device: torch.device | str) -> torch.Tensor | None:
        """Attention mask of a score of ``n`` tokens appended at ``length`` (see :func:`cached_attention_mask`)."""
        return cached_attention_mask(self.length, n, tree_mask, device)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this score's ``k``/``v`` ``[B, H, n, D]`` and return the layer's keys/values to attend to."""
        self.write(layer, self.length, k, v)
        return self.view(layer, self.length + k.shape[2])

    def end(self, n: int) -> None:
        """The score wrote ``n`` slots: they now count (the caller crops or compacts what it rejects)."""
        self.length += n

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


class RaggedKVCache(_KVTensors):
    """Self-attention cache of a batch of independent sequences: ``[layers, capacity, heads, slots,
    head_dim]`` with one length per row (``lengths``, kept on the host).

    A score over ``B`` rows uses rows ``[0, B)`` (the decoder keeps its active rows compacted at the
    front): row ``b``'s ``n`` tokens are written at slots ``lengths[b] + t`` and attend to the row's
    ``lengths[b]`` cached slots plus the causal (or tree) mask among themselves. A score never moves
    ``lengths``: the caller sets the accepted length with :meth:`set_length` (chain: the accepted
    prefix) or :meth:`keep` (tree: one root-to-leaf path). Rejected K/V stay in place, masked, and are
    overwritten later. ``max_len`` bounds a row's sequence; ``spare`` extra slots absorb the padding
    of rows that score fewer tokens than the widest row.
    """

    def __init__(self, layers: int, capacity: int, heads: int, max_len: int, head_dim: int, spare: int = 0,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        super().__init__((layers, capacity, heads, max_len + spare, head_dim), dtype, device)  # [L, N, H, S, D]
        self.max_len = max_len  # longest sequence of one row
        self.lengths = [0] * capacity  # slots [0, lengths[b]) of row b hold its valid tokens
        self._step: tuple | None = None  # (rows, n, scatter indices or None) of the score in progress

    @property
    def capacity(self) -> int:
        return self.keys.shape[1]

    def row(self, b: int) -> KVCache:
        """Row ``b`` as a batch-1 :class:`KVCache` over the same memory (prefill of an admitted row)."""
        return KVCache.over(self.keys[:, b : b + 1], self.values[:, b : b + 1], self.lengths[b])

    def set_length(self, b: int, length: int) -> None:
        if not 0 <= length <= self.max_len:
            raise ValueError(f"row length {length} outside [0, {self.max_len}]")
        self.lengths[b] = length

    @torch.inference_mode()
    def keep(self, b: int, start: int, indices: Sequence[int]) -> None:
        """Row ``b`` keeps slots ``[0, start)`` plus ``indices`` (increasing), moved to ``start...``."""
        idx = host_to_device(list(indices), torch.long, self.device)
        n = idx.numel()
        if n and list(indices) != list(range(start, start + n)):  # a chain prefix is already in place
            self.keys[:, b, :, start : start + n] = self.keys[:, b].index_select(2, idx)
            self.values[:, b, :, start : start + n] = self.values[:, b].index_select(2, idx)
        self.set_length(b, start + n)

    @torch.inference_mode()
    def move(self, src: int, dst: int) -> None:
        """Copy row ``src`` (its valid slots and length) into row ``dst`` (compaction of the batch)."""
        n = self.lengths[src]
        self.keys[:, dst, :, :n] = self.keys[:, src, :, :n]
        self.values[:, dst, :, :n] = self.values[:, src, :, :n]
        self.lengths[dst] = n

    def span(self, batch: int, n: int) -> int:
        return max(self.lengths[:batch]) + n

    def positions(self, batch: int, n: int, device: torch.device | str) -> torch.Tensor:
        """Default positions ``[batch, n]``: row ``b`` continues at ``lengths[b]``."""
        return host_to_device([[length + t for t in range(n)] for length in self.lengths[:batch]], torch.long, device)

    def begin(self, batch: int, n: int, tree_mask: torch.Tensor | None,  # [B or 1, n, n] bool
              device: torch.device | str) -> torch.Tensor | None:
        """Prepare a score of ``n`` tokens on rows ``[0, batch)``; returns its mask ``[B, 1, n, span]``."""
        lens = self.lengths[:batch]
        if self.span(batch, n) > self.keys.shape[3]:
            raise ValueError(f"KV cache overflow: {self.span(batch, n)} > {self.keys.shape[3]} slots")
        if min(lens) == max(lens):  # every row at the same length: the batch-1 layout, plain slices
            self._step = (batch, n, None)
            return cached_attention_mask(lens[0], n, tree_mask, device)
        starts = host_to_device(lens, torch.long, device)  # [B]
        slots = starts[:, None] + torch.arange(n, device=device)  # [B, n]
        self._step = (batch, n, slots)
        col = torch.arange(max(lens) + n, device=device)
        rel = col[None, :] - starts[:, None]  # [B, span] slot relative to the row's first new token
        if tree_mask is None:
            tree_mask = torch.ones(n, n, dtype=torch.bool, device=device).tril()[None]
        tree = tree_mask.to(device, torch.bool).expand(batch, n, n)
        new = tree.gather(2, rel.clamp(0, n - 1)[:, None, :].expand(batch, n, -1)) & (rel >= 0)[:, None, :]
        new &= (rel < n)[:, None, :]
        return ((rel < 0)[:, None, :] | new).unsqueeze(1)

    @torch.inference_mode()
    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this score's ``k``/``v`` ``[B, H, n, D]`` at each row's slots; keys/values to attend to."""
        batch, n, slots = self._step
        if slots is None:
            start = self.lengths[0]
            self.keys[layer, :batch, :, start : start + n] = k
            self.values[layer, :batch, :, start : start + n] = v
        else:
            rows = torch.arange(batch, device=k.device)[:, None]  # [B, 1]
            self.keys[layer][rows, :, slots] = k.transpose(1, 2)  # indexed view: [B, n, H, D]
            self.values[layer][rows, :, slots] = v.transpose(1, 2)
        end = self.span(batch, n)
        return self.keys[layer, :batch, :, :end], self.values[layer, :batch, :, :end]

    def end(self, n: int) -> None:
        """Lengths do not move: the caller sets each row's accepted length."""
        self._step = None


def exact_row_keys(mask: torch.Tensor, tree: bool) -> list[int | torch.Tensor] | None:
    """Per row of a score, the cache slots it attends to, for row-by-row attention (bf16 targets attend one query
    at a time, as one-token steps do: masked SDPA over n queries rounds differently): a chain's row r its first ``start + r + 1`` slots (an int), a tree's row its prefix and ancestors (slot indices, in
    order: the slots its root-to-node path holds after ``cache.compact``, where one-token steps would see them).
    None where rows differ in mask (a ragged batch): masked SDPA then."""
    if mask.shape[0] != 1:
        return None
    if not tree:
        n = mask.shape[2]
        start = mask.shape[3] - n
        return [start + r + 1 for r in range(n)]
    return [row.nonzero()[:, 0] for row in mask[0, 0]]


def row_keys(k: torch.Tensor, v: torch.Tensor, keys: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values ``[B, H, *, D]`` one row attends to (see :func:`exact_row_keys`)."""
    if isinstance(keys, int):
        return k[:, :, :keys], v[:, :, :keys]
    return k.index_select(2, keys), v.index_select(2, keys)


def ragged_row_keys(mask: torch.Tensor) -> list[list[int | torch.Tensor]]:
    """Per batch row ``b`` and query row ``r`` of a mask ``[B, 1, n, span]`` (rows at their own lengths), the
    cache slots that query attends to: an int ``k`` where they are the first ``k`` slots (a chain), else their
    indices in order (a tree). For row-by-row attention across a ragged batch (see :func:`exact_row_keys`)."""
    out: list[list[int | torch.Tensor]] = []
    for b in range(mask.shape[0]):
        rows: list[int | torch.Tensor] = []
        for r in range(mask.shape[2]):
            idx = mask[b, 0, r].nonzero()[:, 0]
            n = idx.numel()
            rows.append(n if n and int(idx[-1]) == n - 1 else idx)
        out.append(rows)
    return out


RowPlan = list[tuple[slice, list[int | torch.Tensor]]]  # (batch rows, per query row the keys it attends to)


def row_plan(mask: torch.Tensor, tree: bool, lengths: Sequence[int] | None = None) -> RowPlan:
    """How to attend query by query under ``mask [B or 1, 1, n, span]``: one entry for all batch rows when they
    share a mask (one length), else one per row (a ragged batch). ``lengths`` (each batch row's cached length, a
    :class:`RaggedKVCache`'s) gives a ragged chain's keys on the host: the mask is not read back."""
    if mask.shape[0] == 1:
        return [(slice(None), exact_row_keys(mask, tree))]
    if lengths is not None and not tree:  # row b's query r sees its first lengths[b] + r + 1 slots
        return [(slice(b, b + 1), [start + r + 1 for r in range(mask.shape[2])]) for b, start in enumerate(lengths)]
    return [(slice(b, b + 1), keys) for b, keys in enumerate(ragged_row_keys(mask))]


def attend_by_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: RowPlan, attend) -> torch.Tensor:
    """``attend(q_row, k_row, v_row)`` for every query row of ``q [B, H, n, D]`` alone over its own keys (a
    batch-1 one-token step's call), concatenated back to ``[B, H, n, D]``."""
    return torch.cat([torch.cat([attend(q[rows, :, r : r + 1], *row_keys(k[rows], v[rows], keys))
                                 for r, keys in enumerate(per_query)], 2) for rows, per_query in plan], 0)
