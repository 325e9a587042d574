"""Speculative sampling keeps the target's distribution exactly (statistical tests with stated bounds).

Bound: with N draws over m categories, the expected total-variation distance between an empirical and
its true distribution is at most 0.5 * sqrt(m / N). Each test asserts TV below a bound a few times that
(fixed seeds, so the tests are deterministic), and that a wrong distribution (the draft's) is farther
away than the bound, so the test has the power to fail.
"""

from __future__ import annotations

import torch

from specli.asr.drafters.model import ModelDrafter
from specli.core.job import DecodeJob
from specli.core.logits import SamplingParams, filter_logits
from specli.core.speculative import SpecOptions, speculative_decode
from specli.core.verify import reference
from tiny_models import EOT, NO_TS, SOT, VOCAB, tiny_rules, tiny_target, window

PARAMS = SamplingParams(temperature=0.9, top_k=20, top_p=0.92, repetition_penalty=1.4)


def tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())


def _filtered_probs(g: torch.Generator, rows: int, vocab: int, prefix: list[int]) -> torch.Tensor:
    logits = torch.randn(rows, vocab, generator=g) * 2.0
    return filter_logits(logits, [prefix] * rows, None, PARAMS).softmax(-1)


def test_chain_rejection_sampling_keeps_the_first_token_distribution():
    g = torch.Generator().manual_seed(0)
    vocab, k, n = 12, 3, 20000
    p = _filtered_probs(g, k + 1, vocab, prefix=[1, 1, 4])  # penalty on tokens 1 and 4
    q = torch.randn(k, vocab, generator=g).mul(2).softmax(-1)
    draft = torch.multinomial(q, n, replacement=True, generator=g).T  # [n, k], each drawn from q
    acc, nxt = reference.sample_chain(p.expand(n, -1, -1), q.expand(n, -1, -1), draft,
                                      torch.rand(n, k, generator=g), torch.rand(n, k + 1, generator=g))
    first = torch.where(acc > 0, draft[:, 0], nxt)
    counts = torch.bincount(first, minlength=vocab).float()
    bound = 3 * 0.5 * (vocab / n) ** 0.5
    assert tv(counts, p[0]) < bound
    assert tv(counts, q[0]) > bound
    # the acceptance rate of the first position is sum(min(p, q))
    assert abs(float((acc > 0).float().mean()) - float(torch.minimum(p[0], q[0]).sum())) < 0.02


def test_tree_sibling_rejection_keeps_the_distribution():
    """Two siblings drawn from q plus a deterministic alternative, all children of the root."""
    g = torch.Generator().manual_seed(1)
    vocab, n = 10, 20000
    p = _filtered_probs(g, 4, vocab, prefix=[2])
    q = torch.randn(vocab, generator=g).mul(2).softmax(-1)
    tokens = torch.multinomial(q.expand(n, -1), 2, replacement=True, generator=g)  # [n, 2] i.i.d. from q
    alt = torch.full((n, 1), 7)
    tokens = torch.cat([tokens, alt], 1)
    q_rows = torch.stack([q, q, torch.nn.functional.one_hot(torch.tensor(7), vocab).float()])
    length, path, nxt = reference.sample_tree(p.expand(n, -1, -1), q_rows.expand(n, -1, -1), tokens,
                                              [-1, -1, -1], torch.rand(n, 3, generator=g),
                                              torch.rand(n, 4, generator=g))
    first = torch.where(length > 0, tokens.gather(1, path[:, :1].clamp(min=0)).squeeze(1), nxt)
    counts = torch.bincount(first, minlength=vocab).float()
    bound = 3 * 0.5 * (vocab / n) ** 0.5
    assert tv(counts, p[0]) < bound
    assert tv(counts, q) > bound


def _exact_two_token_marginals(target, prompt, rules, audio_seed):
    """p(x1) and p(x2) of the target's filtered distribution, by enumerating x1."""
    state = window(target, audio_seed)
    out = target.score(state, torch.tensor([prompt]))
    p1 = filter_logits(out.logits[0, -1:], [[]], rules, PARAMS).softmax(-1)[0]
    p2 = torch.zeros(VOCAB)
    for x1 in torch.nonzero(p1 > 0).flatten().tolist():
        st = window(target, audio_seed)
        row = target.score(st, torch.tensor([prompt + [x1]])).logits[0, -1:]
        p2 += p1[x1] * filter_logits(row, [[x1]], rules, PARAMS).softmax(-1)[0]
    return p1, p2


def assert_two_token_marginals(target, drafter, runs: int, max_draft: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Sample the first two tokens ``runs`` times (seeds 0..runs-1) speculatively with ``drafter`` and
    assert their frequencies are within the TV bound of the target's exact marginals. Returns the
    first-token counts, the exact first-token distribution and its bound (for the power checks)."""
    rules, prompt, audio_seed = tiny_rules(False), [SOT, NO_TS], 11
    p1, p2 = _exact_two_token_marginals(target, prompt, rules, audio_seed)
    c1, c2 = torch.zeros(VOCAB), torch.zeros(VOCAB)
    for seed in range(runs):
        job = DecodeJob(prompt, rules, EOT, 2, sampling=PARAMS, generator=torch.Generator().manual_seed(seed))
        out = speculative_decode(target, window(target, audio_seed), job, drafter, SpecOptions(max_draft=max_draft))
        c1[out.tokens[0]] += 1
        c2[out.tokens[1]] += 1
    bound1 = 3 * 0.5 * (int((p1 > 0).sum()) / runs) ** 0.5
    bound2 = 3 * 0.5 * (int((p2 > 0).sum()) / runs) ** 0.5
    assert tv(c1, p1) < bound1
    assert tv(c2, p2) < bound2
    return c1, p1, bound1


def test_speculative_sampling_end_to_end_matches_target():
    target = tiny_target(0, init_std=0.15)
    drafter_model = tiny_target(1, layers=1, init_std=0.15)
    drafter = ModelDrafter(drafter_model, share_encoder=True)
    c1, p1, bound1 = assert_two_token_marginals(target, drafter, runs=1000, max_draft=3)
    q1, _ = _exact_two_token_marginals(drafter_model, [SOT, NO_TS], tiny_rules(False), 11)
    assert tv(p1, q1) > 2 * bound1, "the drafter must differ from the target for this test to have power"
    assert tv(c1, q1) > bound1
