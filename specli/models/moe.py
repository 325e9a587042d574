"""A sparse mixture-of-experts MLP (Qwen3-MoE / Qwen3-Omni thinker) with grouped expert dispatch.

Routing is transformers' ``TopKRouter``: router logits in the model's dtype, softmax in float32, the top-k
probabilities, renormalised to sum to one when ``norm_topk_prob``, cast back. Dispatch is grouped: the
``tokens x k`` (token, expert) pairs are sorted by expert, each expert runs once over its contiguous group (one
fused gate/up product, SiLU, down), the outputs are weighted and scattered back with one ``index_add_``. A
verification of ``n`` tokens touches up to ``k * n`` distinct experts (:attr:`MoE.experts_touched` counts
them per forward).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class ExpertTally:
    """Distinct experts touched by decoder forwards (summed over the MoE layers), by tokens in the forward: what
    a verification of ``n`` tokens costs in expert weights read (``n = 1``: a plain batch-1 decode step; a batch
    forward of ``B`` rows of ``k`` tokens counts as ``B * k`` tokens)."""

    by_tokens: dict[int, list[int]] = field(default_factory=dict)  # tokens of a forward -> [forwards, experts]

    def add(self, rows: int, tokens: int, experts: int) -> None:
        """One forward of ``rows`` rows of ``tokens`` tokens that touched ``experts`` experts in all layers."""
        entry = self.by_tokens.setdefault(rows * tokens, [0, 0])
        entry[0] += 1
        entry[1] += experts

    def reset(self) -> None:
        self.by_tokens.clear()

    @property
    def forwards(self) -> int:
        return sum(f for f, _ in self.by_tokens.values())

    @property
    def experts(self) -> int:
        return sum(e for _, e in self.by_tokens.values())

    def layer_mean(self, tokens: int, layers: int) -> float | None:
        """Mean distinct experts a layer (of ``layers`` MoE layers) in forwards of ``tokens`` tokens; None: none seen."""
        return self.mean(tokens) / layers if tokens in self.by_tokens else None

    def mean(self, tokens: int | None = None) -> float:
        """Mean experts touched per forward (of ``tokens`` tokens; None: every forward)."""
        f, e = self.by_tokens.get(tokens, [0, 0]) if tokens is not None else (self.forwards, self.experts)
        return e / f if f else 0.0


class MoE:
    """Experts stored as transformers 5 keeps them: ``gate_up_proj [E, 2I, H]`` (gate rows first),
    ``down_proj [E, H, I]``, router ``gate.weight [E, H]``."""

    def __init__(self, w: dict[str, torch.Tensor], prefix: str, dtype: torch.dtype, top_k: int,
                 norm_topk_prob: bool) -> None:
        self.router = w[f"{prefix}.gate.weight"].to(dtype)  # [E, H]
        self.gate_up = w[f"{prefix}.experts.gate_up_proj"].to(dtype)  # [E, 2I, H]
        self.down = w[f"{prefix}.experts.down_proj"].to(dtype)  # [E, H, I]
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.width = self.down.shape[2]
        self.experts_touched = 0  # distinct experts of the last forward

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k weights ``[T, k]`` (model dtype) and expert ids ``[T, k]`` of tokens ``x [T, H]``."""
        logits = F.linear(x, self.router)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(logits.dtype), experts

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [T, H]
        weights, experts = self.route(x)
        flat = experts.reshape(-1)  # [T * k]: pair p is token p // k
        order = torch.argsort(flat, stable=True)  # pairs grouped by expert, tokens ascending within a group
        counts = torch.bincount(flat, minlength=self.router.shape[0]).tolist()
        token = order // self.top_k
        xs = x[token]  # [T * k, H] gathered in expert order
        out = torch.empty_like(xs)
        start = 0
        for e, c in enumerate(counts):
            if c:
                gate, up = F.linear(xs[start : start + c], self.gate_up[e]).split(self.width, dim=-1)
                out[start : start + c] = F.linear(F.silu(gate) * up, self.down[e])
                start += c
        self.experts_touched = sum(1 for c in counts if c)
        out = out * weights.reshape(-1)[order, None]
        return torch.zeros_like(x).index_add_(0, token, out).reshape(shape)
