"""Fused verification kernels (Triton): one launch from target logits / probabilities and the draft
to the accepted length and the next token. Pure-torch twins live in ``reference.py``; tests compare
them on the CPU under ``TRITON_INTERPRET=1``. Random numbers are passed in, never drawn here.

One program per batch row; the vocabulary is scanned in blocks of ``BLOCK_V``. Kernels: greedy chain,
greedy tree (walk along the argmax), sampling chain, sampling tree (sibling-wise rejection: the running
residual ``normalize(max(0, r - q))`` of the current node lives in a scratch row of ``V`` floats per
batch row, rewritten in place after each rejected sibling). Probabilities are float32 here and float64
in the reference; they agree except at rounding ties (never seen in the tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specli.core.device import host_to_device

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


@triton.jit
def _copy_row(src_ptr, dst_ptr, V, BLOCK: tl.constexpr):
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < V, other=0.0).to(tl.float32), mask=offs < V)
    tl.debug_barrier()


@triton.jit
def _reject_update(res_ptr, q_ptr, V, tok, HAS_Q: tl.constexpr, BLOCK: tl.constexpr):
    """In place: ``res = normalize(max(0, res - q))`` (``q`` a point mass on ``tok`` without ``HAS_Q``);
    left unchanged when nothing remains (as the reference does)."""
    total = tl.full((), 0.0, tl.float32)
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        total += tl.sum(_residual_block(res_ptr, q_ptr, offs, V, tok, HAS_Q, True), axis=0)
    tl.debug_barrier()
    if total > 0.0:
        for v0 in range(0, V, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            x = _residual_block(res_ptr, q_ptr, offs, V, tok, HAS_Q, True)
            tl.store(res_ptr + offs, x / total, mask=offs < V)
    tl.debug_barrier()


@triton.jit
def _sample_tree_kernel(p_ptr, q_ptr, tok_ptr, par_ptr, ua_ptr, us_ptr, res_ptr, len_ptr, path_ptr, next_ptr,
                        N, V, HAS_Q: tl.constexpr, BLOCK: tl.constexpr):
    """Sibling-wise rejection sampling down a tree; the running residual of the current node lives in
    ``res_ptr`` (one scratch row of ``V`` floats per batch row)."""
    b = tl.program_id(0)
    res_row = res_ptr + b * V
    cur = tl.full((), -1, tl.int64)
    depth = tl.full((), 0, tl.int64)
    done = tl.full((), 0, tl.int32)
    nxt = tl.full((), 0, tl.int64)
    for _step in range(0, N + 1):
        if done == 0:
            _copy_row(p_ptr + (b * (N + 1) + cur + 1) * V, res_row, V, BLOCK)
            chosen = tl.full((), -1, tl.int64)
            for c in range(0, N):
                parent = tl.load(par_ptr + c)
                if (parent == cur) & (chosen < 0):
                    tok = tl.load(tok_ptr + b * N + c)
                    q_row = q_ptr + (b * N + c) * V
                    r_x = tl.load(res_row + tok)
                    q_x = tl.load(q_row + tok).to(tl.float32) if HAS_Q else 1.0
                    if tl.load(ua_ptr + b * N + c) * q_x < r_x:
                        chosen = tl.full((), 0, tl.int64) + c
                    else:
                        _reject_update(res_row, q_row, V, tok, HAS_Q, BLOCK)
            if chosen >= 0:
                tl.store(path_ptr + b * N + depth, chosen)
                depth += 1
                cur = chosen
            else:
                nxt = _sample_row(res_row, q_ptr, V, -1, tl.load(us_ptr + b * (N + 1) + cur + 1), HAS_Q, False,
                                  BLOCK)
                done = tl.full((), 1, tl.int32)
    tl.store(len_ptr + b, depth)
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
    par = host_to_device(list(parents), torch.long, logits.device)
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


def sample_tree(probs, q, tokens, parents, u_accept, u_sample) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel twin of ``reference.sample_tree``: probs ``[B, n+1, V]``, q ``[B, n, V]`` or None, tokens ``[B, n]``."""
    b, n = tokens.shape
    v = probs.shape[-1]
    dev = probs.device
    par = host_to_device(list(parents), torch.long, dev)
    length = torch.empty(b, dtype=torch.long, device=dev)
    path = torch.full((b, n), -1, dtype=torch.long, device=dev)
    nxt = torch.empty(b, dtype=torch.long, device=dev)
    scratch = torch.empty(b, v, dtype=torch.float32, device=dev)  # running residual of each row
    p = probs.float().contiguous()
    q_arg = p if q is None else q.float().contiguous()
    _sample_tree_kernel[(b,)](p, q_arg, tokens.long().contiguous(), par, u_accept.float().contiguous(),
                              u_sample.float().contiguous(), scratch, length, path, nxt, n, v,
                              HAS_Q=q is not None, BLOCK=BLOCK_V)
    return length, path, nxt
