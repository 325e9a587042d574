"""Small building blocks of the lean targets: a linear layer with a CPU fast path, and layer norm
over ``(weight, bias)`` pairs.

CPU fast path (issue "CPU fast path"; numbers from the 2-vCPU Zen4 machines, 2 threads, in
``benchmarks/bench_decoder_step.py``): plain ``F.linear`` (MKL ``x·Wᵀ``) runs one row
single-threaded and 2–7 rows row by row, so scoring 3 tokens cost 2.4x one token. ``Linear``
instead reorders its weight ONCE, at construction, into oneDNN's blocked layout and runs every
product through oneDNN. Measured per shape (whisper-base / tiny.en layers and vocabulary heads,
fp32 and bf16, 1–24 rows and the encoder's 1500), this one layout was the fastest or close to it
everywhere (vs ``F.linear``: 1.1–4x on layer matrices, 2–12x on vocabulary heads, 1.1–1.4x
at 1500 rows; never slower beyond noise), so there is no per-``m`` table of layouts and no
second copy of the weight. The one per-``m`` rule: oneDNN is slower on 1–3 rows than on 4, so
fewer than ``_MIN_ROWS`` rows are zero-padded to ``_MIN_ROWS`` and the result sliced.

Memory: the blocked weight replaces the plain one (same size). A weight tied to an embedding (the
Whisper vocabulary head) is no longer shared with it: one extra copy of that matrix.
fp32 results match ``F.linear`` to ~1e-6 relative; both paths are deterministic run to run for a
given shape and thread count. The blocked weight cannot be pickled or deep-copied.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_MIN_ROWS = 4  # fewer rows are zero-padded up to this many (oneDNN is slower below 4 rows)
_PACKABLE = (torch.float32, torch.bfloat16)
_ONEDNN = (
    torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    and hasattr(torch.ops.mkldnn, "_linear_pointwise")
)


def _pack(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight [out, in]`` in oneDNN's blocked layout, or None where the fast path does not apply."""
    if not (_ONEDNN and weight.device.type == "cpu" and weight.dtype in _PACKABLE and weight.dim() == 2):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


class Linear:
    """``y = x @ W.T + b`` with ``W`` of shape ``[out, in]`` (Hugging Face layout).

    ``fast=True`` (default) keeps only the oneDNN-blocked weight where the CPU fast path applies;
    ``fast=False`` keeps the plain weight and calls ``F.linear`` (the reference and the
    benchmark's baseline).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, fast: bool = True) -> None:
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        self.bias = None if bias is None else bias.contiguous()  # [out] or None
        self._packed = _pack(weight) if fast else None
        self._plain = weight.contiguous() if self._packed is None else None  # [out, in]

    @classmethod
    def from_weights(cls, w: dict[str, torch.Tensor], prefix: str, dtype: torch.dtype) -> Linear:
        bias = w.get(f"{prefix}.bias")
        return cls(w[f"{prefix}.weight"].to(dtype), None if bias is None else bias.to(dtype))

    @property
    def fast(self) -> bool:
        """Whether calls go through the oneDNN fast path."""
        return self._packed is not None

    @property
    def weight(self) -> torch.Tensor:
        """The plain ``[out, in]`` weight (a fresh copy when only the blocked layout is kept)."""
        return self._plain if self._plain is not None else self._packed.to_dense()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if self._packed is None or x.dtype != self.dtype or x.device.type != "cpu":
            return F.linear(x, self.weight, self.bias)  # plain path (and F.linear's dtype errors)
        x2 = x.reshape(-1, self.in_features)
        m = x2.shape[0]
        if m == 0:
            return x.new_empty(*x.shape[:-1], self.out_features)
        if m < _MIN_ROWS:
            x2 = torch.cat([x2, x2.new_zeros(_MIN_ROWS - m, self.in_features)])
        y = torch.ops.mkldnn._linear_pointwise(x2, self._packed, self.bias, "none", [], "")
        return y[:m].view(*x.shape[:-1], self.out_features)


def cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, per_row: bool = False) -> torch.Tensor:
    """``softmax(q kᵀ / sqrt(D)) v`` for a few queries ``q [B, H, n, D]`` over a window's ``k, v [B, H, A, D]``,
    computed in the K/V's dtype (the result in ``q``'s). On the CPU a bfloat16 model keeps its window
    cross-attention K/V in float32 (``cross_kv_dtype``): PyTorch's CPU SDPA took 1.47 ms for one bf16 query
    over 1,500 keys (8 heads of 64; one thread) and 0.18 ms in float32, which is also the more exact;
    cross-attention was ~70% of a bf16 whisper-base decoder step.

    ``per_row``: one SDPA call per query row, so that row ``i`` of an ``n``-token forward is computed exactly as
    a one-token forward computes it (SDPA over ``n`` queries differs from ``n`` one-query calls in the last
    bits; after the cast to bf16 that flipped greedy near-ties between verification and AR decoding).
    """
    dtype, q = q.dtype, q.to(k.dtype)
    if per_row and q.shape[2] > 1:
        out = torch.cat([F.scaled_dot_product_attention(q[:, :, i : i + 1], k, v) for i in range(q.shape[2])], 2)
    else:
        out = F.scaled_dot_product_attention(q, k, v)
    return out.to(dtype)


def cross_kv_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype a model computing in ``dtype`` on ``device`` keeps its cross-attention K/V in."""
    return torch.float32 if dtype == torch.bfloat16 and device.type == "cpu" else dtype


def layer_norm(x: torch.Tensor, params: tuple[torch.Tensor, torch.Tensor], eps: float = 1e-5) -> torch.Tensor:
    weight, bias = params
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
