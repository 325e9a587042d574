"""The one logit filter: model rules, repetition penalty, temperature, top-k, top-p.

Target (plain decoding), verifier and drafters all call :func:`filter_logits` with the same
parameters and each row's own sampled prefix, so every scored position sees exactly the
distribution plain decoding would have sampled from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specli.engines.device import host_to_device
from specli.engines.types import LogitRules

NEG_INF = float("-inf")


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen from the filtered logits; validated at construction."""

    temperature: float = 0.0  # 0 picks the argmax (greedy); > 0 samples
    top_k: int = 0  # keep the k most likely tokens; 0 turns it off
    top_p: float = 1.0  # keep the smallest set whose probability reaches p; 1 turns it off
    repetition_penalty: float = 1.0  # divide (multiply, if negative) logits of tokens already sampled

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingParams()


def filter_logits(
    logits: torch.Tensor,  # [n, vocab] raw logits of n scored rows
    prefixes: Sequence[Sequence[int]],  # sampled tokens before each row
    rules: LogitRules | None,
    params: SamplingParams = GREEDY,
) -> torch.Tensor:
    """Filtered logits ``[n, vocab]`` (float32); ``softmax`` of them is the sampling distribution."""
    x = logits.float()
    x = rules(x, prefixes) if rules is not None else x.clone()
    if params.repetition_penalty != 1.0:
        for i, prefix in enumerate(prefixes):
            if prefix:
                idx = host_to_device(sorted(set(prefix)), torch.long, x.device)
                seen = x[i, idx]
                x[i, idx] = torch.where(seen > 0, seen / params.repetition_penalty, seen * params.repetition_penalty)
    if params.greedy:
        return x
    x = x / params.temperature
    if params.top_k and params.top_k < x.shape[-1]:
        kth = x.topk(params.top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, NEG_INF)
    if params.top_p < 1.0:
        x = _top_p(x, params.top_p)
    return x


def _top_p(x: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_x, order = x.sort(dim=-1, descending=True)
    probs = sorted_x.softmax(-1)
    before = probs.cumsum(-1) - probs  # mass of strictly more likely tokens
    drop_sorted = before >= top_p  # the most likely token is always kept
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return x.masked_fill(drop, NEG_INF)


def choose(filtered: torch.Tensor, params: SamplingParams, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """Tokens ``[n]`` from filtered rows: argmax, or inverse-CDF sampling with the given uniforms."""
    if params.greedy:
        return filtered.argmax(-1)
    if uniform is None:
        raise ValueError("sampling needs uniforms")
    return sample_inverse_cdf(filtered.softmax(-1), uniform)


def sample_inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Index ``[n]`` of ``probs [n, vocab]`` (unnormalised is fine) at CDF position ``uniform [n]``."""
    cdf = probs.cumsum(-1)
    point = (uniform.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, point, right=True).squeeze(-1)
    return idx.clamp(max=probs.shape[-1] - 1)
