"""Verification of a draft against the target's filtered logits.

:func:`verify` picks the fused Triton kernel on CUDA tensors and the pure-torch reference
otherwise; both take the same random numbers and return the same answer.
"""

from __future__ import annotations

import torch

from specli.engines.drafters.base import DraftProposal
from specli.engines.tree import is_chain
from specli.engines.verify import reference


def _kernels():
    """The Triton module when the logits live on a GPU and Triton is installed, else None."""
    try:
        from specli.engines.verify import triton_kernels
    except ImportError:
        return None
    return triton_kernels


def verify(
    filtered: torch.Tensor,  # [B, n+1, vocab] filtered target logits; row 0 scored the pending token
    proposal: DraftProposal,
    greedy: bool,
    u_accept: torch.Tensor,  # [B, n]
    u_sample: torch.Tensor,  # [B, n+1]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Accepted path length ``[B]``, accepted node indices ``[B, n]`` (-1 padded), next token ``[B]``."""
    b, n = filtered.shape[0], len(proposal)
    tokens = torch.tensor([proposal.tokens] * b, dtype=torch.long, device=filtered.device).reshape(b, n)
    q = None if proposal.q is None else proposal.q[None].expand(b, -1, -1).to(filtered.device)
    kern = _kernels() if filtered.is_cuda else None
    if is_chain(proposal.parents):
        if greedy:
            fn = kern.greedy_chain if kern else reference.greedy_chain
            length, nxt = fn(filtered, tokens)
        else:
            fn = kern.sample_chain if kern else reference.sample_chain
            length, nxt = fn(filtered.softmax(-1), q, tokens, u_accept, u_sample)
        path = torch.arange(n, device=filtered.device).expand(b, n).clone()
        path[path >= length[:, None]] = -1
        return length, path, nxt
    if greedy:
        return reference.greedy_tree(filtered, tokens, proposal.parents)
    return reference.sample_tree(filtered.softmax(-1), q, tokens, proposal.parents, u_accept, u_sample)
