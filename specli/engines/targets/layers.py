"""Small building blocks of the lean targets: a linear layer whose weight layout is chosen once at
load time, and layer norm over ``(weight, bias)`` pairs."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class Linear:
    """``y = x @ W.T + b`` with ``W`` of shape ``[out, in]`` (Hugging Face layout)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight.contiguous()  # [out, in]
        self.bias = bias  # [out] or None

    @classmethod
    def from_weights(cls, w: dict[str, torch.Tensor], prefix: str, dtype: torch.dtype) -> Linear:
        bias = w.get(f"{prefix}.bias")
        return cls(w[f"{prefix}.weight"].to(dtype), None if bias is None else bias.to(dtype))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        return F.linear(x, self.weight, self.bias)


def layer_norm(x: torch.Tensor, params: tuple[torch.Tensor, torch.Tensor], eps: float = 1e-5) -> torch.Tensor:
    weight, bias = params
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
