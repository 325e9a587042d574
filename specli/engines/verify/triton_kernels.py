"""Fused verification kernels (Triton): one launch from target logits / probabilities and the draft
to the accepted length and the next token. Pure-torch twins live in ``reference.py``; tests compare
them on the CPU under ``TRITON_INTERPRET=1``. Random numbers are passed in, never drawn here.

One program per batch row; the vocabulary is scanned in blocks of ``BLOCK_V``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 1024


@triton.jit
def _row_argmax(row_ptr, V, BLOCK: tl.constexpr):
    """Index of the first maximum of one row of length ``V``."""
    best = tl.full((), float("-inf"), tl.float32)
    best_i = tl.full((), 0, tl.int64)
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        i = (tl.argmax(x, axis=0) + v0).to(tl.int64)
        take = m > best
        best = tl.where(take, m, best)
        best_i = tl.where(take, i, best_i)
    return best_i


@triton.jit
def _greedy_chain_kernel(logits_ptr, draft_ptr, acc_ptr, next_ptr, K, V, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    done = tl.full((), 0, tl.int32)
    accepted = tl.full((), 0, tl.int64)
    nxt = tl.full((), 0, tl.int64)
    for j in range(0, K + 1):
        choice = _row_argmax(logits_ptr + (b * (K + 1) + j) * V, V, BLOCK)
        d = tl.load(draft_ptr + b * K + j, mask=j < K, other=-1)
        match = (j < K) & (d == choice) & (done == 0)
        stop = (done == 0) & (match == 0)
        accepted = tl.where(match, accepted + 1, accepted)
        nxt = tl.where(stop, choice, nxt)
        done = tl.where(stop, 1, done)
    tl.store(acc_ptr + b, accepted)
    tl.store(next_ptr + b, nxt)


@triton.jit
def _greedy_tree_kernel(logits_ptr, tok_ptr, par_ptr, len_ptr, path_ptr, next_ptr, N, V,
                        BLOCK: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    offs_n = tl.arange(0, BLOCK_N)
    parents = tl.load(par_ptr + offs_n, mask=offs_n < N, other=-2)
    tokens = tl.load(tok_ptr + b * N + offs_n, mask=offs_n < N, other=-1)
    cur = tl.full((), -1, tl.int64)
    depth = tl.full((), 0, tl.int64)
    done = tl.full((), 0, tl.int32)
    nxt = tl.full((), 0, tl.int64)
    for _step in range(0, N + 1):
        choice = _row_argmax(logits_ptr + (b * (N + 1) + cur + 1) * V, V, BLOCK)
        match = (parents == cur) & (tokens == choice) & (offs_n < N)
        child = tl.min(tl.where(match, offs_n, BLOCK_N), axis=0).to(tl.int64)
        found = (child < BLOCK_N) & (done == 0)
        stop = (done == 0) & (child >= BLOCK_N)
        tl.store(path_ptr + b * N + depth, child, mask=found)
        depth = tl.where(found, depth + 1, depth)
        cur = tl.where(found, child, cur)
        nxt = tl.where(stop, choice, nxt)
        done = tl.where(stop, 1, done)
    tl.store(len_ptr + b, depth)
    tl.store(next_ptr + b, nxt)


@triton.jit
def _residual_block(p_ptr, q_ptr, offs, V, tok, HAS_Q: tl.constexpr, USE_RESIDUAL: tl.constexpr):
    p = tl.load(p_ptr + offs, mask=offs < V, other=0.0).to(tl.float32)
    if USE_RESIDUAL:
        if HAS_Q:
            q = tl.load(q_ptr + offs, mask=offs < V, other=0.0).to(tl.float32)
            p = tl.maximum(p - q, 0.0)
        else:
            p = tl.where(offs == tok, 0.0, p)
    return p


@triton.jit
def _sample_row(p_ptr, q_ptr, V, tok, u, HAS_Q: tl.constexpr, USE_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    """Inverse-CDF sample of ``p`` (or of ``max(0, p - q)``) at uniform ``u``: count(cdf <= u * total)."""
    total = tl.full((), 0.0, tl.float32)
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        total += tl.sum(_residual_block(p_ptr, q_ptr, offs, V, tok, HAS_Q, USE_RESIDUAL), axis=0)
    point = u * total
    running = tl.full((), 0.0, tl.float32)
    count = tl.full((), 0, tl.int64)
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        x = _residual_block(p_ptr, q_ptr, offs, V, tok, HAS_Q, USE_RESIDUAL)
        cdf = running + tl.cumsum(x, axis=0)
        count += tl.sum(((cdf <= point) & (offs < V)).to(tl.int64), axis=0)
        running += tl.sum(x, axis=0)
    return tl.minimum(count, V - 1)


@triton.jit
def _sample_chain_kernel(p_ptr, q_ptr, draft_ptr, ua_ptr, us_ptr, acc_ptr, next_ptr, K, V,
                         HAS_Q: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    done = tl.full((), 0, tl.int32)
    accepted = tl.full((), 0, tl.int64)
    nxt = tl.full((), 0, tl.int64)
    for j in range(0, K):
        p_row = p_ptr + (b * (K + 1) + j) * V
        q_row = q_ptr + (b * K + j) * V
        d = tl.load(draft_ptr + b * K + j)
        p_x = tl.load(p_row + d).to(tl.float32)
        q_x = tl.load(q_row + d).to(tl.float32) if HAS_Q else 1.0
        ok = tl.load(ua_ptr + b * K + j) * q_x < p_x
        rejected = (done == 0) & (ok == 0)
        accepted = tl.where((done == 0) & ok, accepted + 1, accepted)
        if rejected:
            nxt = _sample_row(p_row, q_row, V, d, tl.load(us_ptr + b * (K + 1) + j), HAS_Q, True, BLOCK)
        done = tl.where(rejected, 1, done)
    if done == 0:
        nxt = _sample_row(p_ptr + (b * (K + 1) + K) * V, q_ptr, V, -1, tl.load(us_ptr + b * (K + 1) + K),
                          HAS_Q, False, BLOCK)
    tl.store(acc_ptr + b, accepted)
    tl.store(next_ptr + b, nxt)


def greedy_chain(logits: torch.Tensor, draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel twin of ``reference.greedy_chain``: logits ``[B, k+1, V]``, draft ``[B, k]``."""
    b, k1, v = logits.shape
    acc = torch.empty(b, dtype=torch.long, device=logits.device)
    nxt = torch.empty(b, dtype=torch.long, device=logits.device)
    _greedy_chain_kernel[(b,)](logits.contiguous(), draft.long().contiguous(), acc, nxt, k1 - 1, v, BLOCK=BLOCK_V)
    return acc, nxt


def greedy_tree(logits: torch.Tensor, tokens: torch.Tensor, parents) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel twin of ``reference.greedy_tree``."""
    b, n = tokens.shape
    v = logits.shape[-1]
    par = torch.as_tensor(list(parents), dtype=torch.long, device=logits.device)
    length = torch.empty(b, dtype=torch.long, device=logits.device)
    path = torch.full((b, n), -1, dtype=torch.long, device=logits.device)
    nxt = torch.empty(b, dtype=torch.long, device=logits.device)
    block_n = max(2, triton.next_power_of_2(max(n, 1)))
    _greedy_tree_kernel[(b,)](logits.contiguous(), tokens.long().contiguous(), par, length, path, nxt, n, v,
                              BLOCK=BLOCK_V, BLOCK_N=block_n)
    return length, path, nxt


def sample_chain(probs, q, draft, u_accept, u_sample) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel twin of ``reference.sample_chain`` (``q`` None: point-mass drafts)."""
    b, k1, v = probs.shape
    acc = torch.empty(b, dtype=torch.long, device=probs.device)
    nxt = torch.empty(b, dtype=torch.long, device=probs.device)
    q_arg = probs if q is None else q.float().contiguous()
    _sample_chain_kernel[(b,)](probs.float().contiguous(), q_arg, draft.long().contiguous(),
                               u_accept.float().contiguous(), u_sample.float().contiguous(), acc, nxt, k1 - 1, v,
                               HAS_Q=q is not None, BLOCK=BLOCK_V)
    return acc, nxt
