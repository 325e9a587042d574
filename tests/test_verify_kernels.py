"""Triton verify kernels == pure-torch reference (on the CPU under TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from specli.core.verify import reference

kernels = pytest.importorskip("specli.core.verify.triton_kernels", reason="triton is not installed")


def _chain_case(g, b, k, v, cut):
    logits = torch.randn(b, k + 1, v, generator=g)
    draft = logits[:, :k].argmax(-1)
    for r in range(b):
        c = cut if cut is not None else int(torch.randint(0, k + 1, (1,), generator=g))
        if c < k:
            draft[r, c] = (draft[r, c] + 1) % v
    return logits, draft


@pytest.mark.parametrize("b,k,v", [(1, 1, 7), (2, 5, 1500), (3, 8, 2100), (1, 24, 51865)])
@pytest.mark.parametrize("cut", [0, None, "all"])
def test_greedy_chain_kernel(b, k, v, cut):
    g = torch.Generator().manual_seed(b * 100 + k)
    logits, draft = _chain_case(g, b, k, v, k if cut == "all" else cut)
    ref = reference.greedy_chain(logits, draft)
    got = kernels.greedy_chain(logits, draft)
    assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])
    if cut == "all":
        assert (got[0] == k).all()
    if cut == 0:
        assert (got[0] == 0).all()


def test_greedy_chain_kernel_ties_take_the_first_index():
    logits = torch.zeros(1, 3, 2000)
    logits[0, :, 5] = 1.0
    logits[0, :, 1500] = 1.0  # a tie across vocabulary blocks
    logits[0, 1, 7] = 3.0
    draft = torch.tensor([[5, 7]])
    ref, got = reference.greedy_chain(logits, draft), kernels.greedy_chain(logits, draft)
    assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])
    assert got[0].item() == 2 and got[1].item() == 5


@pytest.mark.parametrize("seed", range(6))
def test_greedy_tree_kernel(seed):
    g = torch.Generator().manual_seed(seed)
    b, n, v = 2, 9, 1100
    parents = [-1] + [int(torch.randint(-1, i, (1,), generator=g)) for i in range(1, n)]
    logits = torch.randn(b, n + 1, v, generator=g)
    tokens = torch.randint(0, v, (b, n), generator=g)
    for i in range(n):  # make about half the nodes the target's choice at their parent
        if torch.rand(1, generator=g) < 0.5:
            tokens[:, i] = logits[:, parents[i] + 1].argmax(-1)
    ref = reference.greedy_tree(logits, tokens, parents)
    got = kernels.greedy_tree(logits, tokens, parents)
    for r, k_ in zip(ref, got):
        assert torch.equal(r, k_)


@pytest.mark.parametrize("with_q", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_sample_chain_kernel(with_q, seed):
    g = torch.Generator().manual_seed(seed)
    b, k, v = 16, 6, 3000
    p = (torch.randn(b, k + 1, v, generator=g) * 3).softmax(-1)
    q = (torch.randn(b, k, v, generator=g) * 3).softmax(-1)
    if seed == 0:
        q[:, :2] = p[:, :2]  # identical rows: always accepted
    draft = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(b, k)
    if not with_q:
        draft = p[:, :k].argmax(-1)
    ua, us = torch.rand(b, k, generator=g), torch.rand(b, k + 1, generator=g)
    qq = q if with_q else None
    ref = reference.sample_chain(p, qq, draft, ua, us)
    got = kernels.sample_chain(p, qq, draft, ua, us)
    assert torch.equal(ref[0], got[0])
    assert torch.equal(ref[1], got[1])
    if seed == 0 and with_q:
        assert (got[0] >= 2).all()


def test_sample_chain_kernel_none_and_all_accepted():
    v, k = 50, 4
    p = torch.full((1, k + 1, v), 1.0 / v)
    draft = torch.arange(k)[None]
    none = kernels.sample_chain(p, None, draft, torch.ones(1, k), torch.full((1, k + 1), 0.5))
    assert none[0].item() == 0 and none == reference.sample_chain(p, None, draft, torch.ones(1, k),
                                                                  torch.full((1, k + 1), 0.5))
    all_ = kernels.sample_chain(p, None, draft, torch.zeros(1, k), torch.full((1, k + 1), 0.999))
    assert all_[0].item() == k and all_[1].item() == v - 1
