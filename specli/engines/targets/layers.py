"""Small building blocks of the lean targets: a linear layer with a CPU fast path, and layer norm
over ``(weight, bias)`` pairs.

With plain ``F.linear`` (MKL ``x·Wᵀ``) on the 2-vCPU Zen4 machines, a product over one row runs
single-threaded and 2–7 rows go row by row, so scoring 3 tokens costs 2.4x one token. ``Linear``
therefore picks, per number of rows ``m``, the formulation measured fastest there (table in
``_ROUTES``; numbers in ``benchmarks/bench_decoder_step.py`` and the fast-path issue):

- ``"wxt"``: ``W·xᵀ`` (MKL with the weight as the left operand), rows padded up to ``_PAD_TO``.
- ``"dnn"``: oneDNN matmul on the same ``[out, in]`` weight (no per-call reorder, no extra copy).
- ``"plain"``: ``F.linear``.

Every route reads the one contiguous ``[out, in]`` weight, so the fast path costs no memory and a
weight tied to an embedding stays shared. fp32 results match ``F.linear`` to ~1e-6 relative;
bf16 runs through oneDNN either way and is deterministic for a given ``m`` and thread count.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
_FAST_DTYPES = (torch.float32, torch.bfloat16)
# Rows -> route, per dtype, for m < len(table); larger m use the last entry. Index 0 is unused.
_ROUTES: dict[torch.dtype, tuple[str, ...]] = {
    torch.float32: ("plain",) + ("wxt",) * 4 + ("dnn",) * 20,
    torch.bfloat16: ("plain",) + ("dnn",) * 24,
}
_PAD_TO = 2  # W·xᵀ over one row is a single-threaded gemv: pad a single row to two


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x [m, in] -> [m, out]`` through oneDNN on the plain ``[out, in]`` weight."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _w_xt(x: torch.Tensor, weight: torch.Tensor, bias_col: torch.Tensor | None) -> torch.Tensor:
    """``x [m, in] -> [m, out]`` computed as ``(W·xᵀ)ᵀ``; a single row is padded to ``_PAD_TO``."""
    m = x.shape[0]
    xt = (x.expand(_PAD_TO, -1) if m < _PAD_TO else x).t()
    y = torch.mm(weight, xt) if bias_col is None else torch.addmm(bias_col, weight, xt)  # [out, m']
    return y[:, :m].t().contiguous()


class Linear:
    """``y = x @ W.T + b`` with ``W`` of shape ``[out, in]`` (Hugging Face layout).

    ``fast=False`` keeps plain ``F.linear`` (the reference, and the baseline of the benchmark).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, fast: bool = True) -> None:
        self.weight = weight.contiguous()  # [out, in]
        self.bias = bias  # [out] or None
        self.out_features, self.in_features = self.weight.shape
        self.fast = fast and self.weight.device.type == "cpu" and self.weight.dtype in _FAST_DTYPES
        self._bias_col = None if bias is None else bias.reshape(-1, 1)  # [out, 1] for W·xᵀ + b

    @classmethod
    def from_weights(cls, w: dict[str, torch.Tensor], prefix: str, dtype: torch.dtype) -> Linear:
        bias = w.get(f"{prefix}.bias")
        return cls(w[f"{prefix}.weight"].to(dtype), None if bias is None else bias.to(dtype))

    def route(self, m: int, dtype: torch.dtype) -> str:
        """The formulation used for ``m`` rows of ``dtype`` input."""
        if not self.fast or dtype != self.weight.dtype or m == 0:
            return "plain"
        table = _ROUTES[dtype]
        route = table[min(m, len(table) - 1)]
        return "plain" if route == "dnn" and not _ONEDNN else route

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        x2 = x.reshape(-1, self.in_features)
        route = self.route(x2.shape[0], x.dtype)
        if route == "plain":
            return F.linear(x, self.weight, self.bias)
        if route == "wxt":
            y = _w_xt(x2, self.weight, self._bias_col)
        else:
            y = _onednn(x2, self.weight, self.bias)
        return y.view(*x.shape[:-1], self.out_features)


def layer_norm(x: torch.Tensor, params: tuple[torch.Tensor, torch.Tensor], eps: float = 1e-5) -> torch.Tensor:
    weight, bias = params
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
