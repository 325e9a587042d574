"""Verification of a draft against the target's filtered logits.

:func:`verify` runs the fused Triton kernels (``triton_kernels.py``) on CUDA tensors and the
pure-torch reference (``reference.py``) otherwise, for chains and trees, greedy and sampling; both
take the same random numbers and return the same answer. ``backend`` forces one of them: tests
run the kernels on CPU tensors under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Literal, get_args

import torch

from specli.core.device import host_to_device
from specli.core.drafters.base import DraftProposal
from specli.core.tree import is_chain
from specli.core.verify import reference

Backend = Literal["auto", "reference", "triton"]
BACKENDS: tuple[str, ...] = get_args(Backend)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _kernels(device: torch.device, backend: Backend) -> ModuleType | None:
    """The Triton module to use for tensors on ``device``, or None for the reference."""
    if backend == "reference" or (backend == "auto" and device.type != "cuda"):
        return None
    try:  # imported on first use: triton is an optional dependency, slow to import
        triton_kernels = importlib.import_module("specli.core.verify.triton_kernels")
    except ImportError as exc:
        if backend == "auto":
            return None
        raise RuntimeError("verify backend 'triton' needs the triton package") from exc
    if device.type != "cuda" and not _interpreting():
        raise RuntimeError("verify backend 'triton' on CPU tensors needs TRITON_INTERPRET=1 before triton loads")
    return triton_kernels


def verify(
    filtered: torch.Tensor,  # [B, n+1, vocab] filtered target logits; row 0 scored the pending token
    proposal: DraftProposal,
    greedy: bool,
    u_accept: torch.Tensor,  # [B, n]
    u_sample: torch.Tensor,  # [B, n+1]
    backend: Backend = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Accepted path length ``[B]``, accepted node indices ``[B, n]`` (-1 padded), next token ``[B]``.

    ``backend``: ``auto`` (kernels on CUDA, reference elsewhere), ``reference`` or ``triton``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    b, n, dev = filtered.shape[0], len(proposal), filtered.device
    tokens = host_to_device([proposal.tokens] * b, torch.long, dev).reshape(b, n)
    q = None if proposal.q is None else proposal.q[None].expand(b, -1, -1).to(dev)
    kern = _kernels(dev, backend)
    impl = kern if kern is not None else reference
    u_accept, u_sample = u_accept.to(dev), u_sample.to(dev)
    if is_chain(proposal.parents):
        if greedy:
            length, nxt = impl.greedy_chain(filtered, tokens)
        else:
            length, nxt = impl.sample_chain(filtered.softmax(-1), q, tokens, u_accept, u_sample)
        path = torch.arange(n, device=dev).expand(b, n)
        return length, path.masked_fill(path >= length[:, None], -1), nxt  # no boolean indexing: no sync
    if greedy:
        return impl.greedy_tree(filtered, tokens, proposal.parents)
    return impl.sample_tree(filtered.softmax(-1), q, tokens, proposal.parents, u_accept, u_sample)
