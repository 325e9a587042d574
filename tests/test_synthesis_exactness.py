"""Speculative decoding keeps each speech sampler's distribution exactly (ras, vllm) or its tokens (greedy).

Outcome: the first 3 generated tokens (eos pads a sequence that stopped earlier), K = 8^3 outcomes.
The exact joint distribution ``P`` is enumerated from the toy target's table through the sampler's rules.

Bound. For N independent runs with empirical distribution ``P_N``:
``E[TV(P_N, P)] <= 1/2 sum_k sqrt(P_k (1 - P_k) / N)`` (Jensen on each ``E|P_N,k - P_k|``), and one run
moves TV by at most 1/N, so McDiarmid gives ``P(TV > E[TV] + t) <= exp(-2 N t^2)``. The tests assert
``TV < bound(P, N, delta) = 1/2 sum_k sqrt(P_k (1 - P_k) / N) + sqrt(ln(1/delta) / (2 N))`` with
delta = 1e-6 (seeds are fixed, so the tests are deterministic). Power: deliberately broken verifiers
(accept every draft; resample from p instead of the residual; residual (p - q) without the clamp)
must exceed the same bound, plain sampling without RAS's repetition check must too, and the draft
model's own distribution is farther from P than twice the bound.

What a count detects (``detectable`` / ``runs_for``). If the runs really follow Q with TV(Q, P) = d, McDiarmid
on Q's side gives ``TV(Q_N, P) >= d - 1/2 sum_k sqrt(Q_k (1 - Q_k) / N) - sqrt(ln(1/beta) / (2 N))`` with
probability 1 - beta, so the check fails with power >= 1 - beta once ``d >= (S + sqrt(ln(1/delta)/2) +
sqrt(ln(1/beta)/2)) / sqrt(N)``, S = sum_k sqrt(P_k (1 - P_k)) (Q's spread taken as P's). RUNS = 1000 detects
TV 0.27 (ras, S 4.3) and 0.32 (vllm, S 6.0) with power 0.99: the size of the subtle bugs above (measured at
1000 runs: resample from p 0.28, residual without the clamp 0.31; RAS without its repetition check is 0.26
from P exactly), so the count is what they need, not less.

Drafters: always right (the target's own table, q = p: every draft accepted), always wrong (a token of
probability 0), random point-mass trees, an argmax chain (point masses, often right), the library's
ModelDrafter over a noisy copy of the table (sampled chain with q + point-mass alternatives: a sparse
tree), i.i.d. sampled sibling trees with q, and the n-gram pool wrapped in RecyclingDrafter (tries).
Runs: ~17k short decodes, about 40 s of one CPU core.
"""

from __future__ import annotations

import math

import pytest
import torch

from specli.asr.drafters.model import ModelDrafter, ModelDraftOptions
from specli.core.drafters.ngram import NgramDrafter, NgramPool
from specli.core.drafters.recycling import RecyclingDrafter
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob
from specli.core.logits import filter_logits
from specli.core.sampling import SamplerOptions, build_sampler, request_generator
from specli.core.speculative import SpecOptions, speculative_decode
from specli.core.verify import reference
from speech_toy import (
    EOS,
    SOS,
    V,
    ArgmaxChainDrafter,
    IidTreeDrafter,
    RandomTreeDrafter,
    TableTarget,
    WrongDrafter,
    random_table,
)

STEPS, RUNS, DELTA = 3, 1000, 1e-6
PROMPT = [3, 1]  # prompt speech tokens: the vllm repetition penalty counts them
TARGET = TableTarget(random_table(0, scale=1.5, eos_bias=1.0))
DRAFT_MODEL = TableTarget(TARGET.table + random_table(1, scale=1.0))  # a noisy copy: ~55% accepted

SAMPLERS = {
    # CosyVoice2 style: eos (= the masked id) is banned for the first 2 tokens
    "ras": build_sampler(SamplerOptions("ras"), min_len_mask_id=EOS, min_len=2),
    "vllm": build_sampler(SamplerOptions("vllm", temperature=0.9, top_k=6, top_p=0.95, repetition_penalty=1.1),
                          prompt_tokens=PROMPT, stop_ids=[EOS], min_len=2),
    # CosyVoice3 quirk: sos is masked below min length, eos stays allowed
    "greedy": build_sampler(SamplerOptions("greedy"), min_len_mask_id=SOS, min_len=2),
}


def exact_joint(target: TableTarget, sampler, prompt=PROMPT, steps=STEPS) -> torch.Tensor:
    """``P [V^steps]`` of the first ``steps`` tokens under plain sampling with ``sampler``."""
    out = torch.zeros(V ** steps, dtype=torch.float64)

    def walk(prefix: list[int], mass: float) -> None:
        if len(prefix) == steps:
            out[outcome(prefix)] += mass
            return
        logits = target.next_logits(prompt + prefix)[None]
        p = filter_logits(logits, [prefix], sampler.rules, sampler.params).double().softmax(-1)[0]
        for x in torch.nonzero(p > 0).flatten().tolist():
            if x == EOS:
                out[outcome(prefix + [EOS] * (steps - len(prefix)))] += mass * float(p[x])
            else:
                walk(prefix + [x], mass * float(p[x]))

    walk([], 1.0)
    return out / out.sum()


def outcome(tokens: list[int]) -> int:
    idx = 0
    for t in tokens:
        idx = idx * V + t
    return idx


def padded(result) -> list[int]:
    toks = list(result.tokens[:STEPS])
    return toks + [EOS] * (STEPS - len(toks)) if len(toks) < STEPS else toks


def tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def bound(p: torch.Tensor, n: int, delta: float = DELTA) -> float:
    return 0.5 * float((p * (1 - p) / n).sqrt().sum()) + math.sqrt(math.log(1 / delta) / (2 * n))


def runs_for(p: torch.Tensor, distance: float, power: float = 0.99, delta: float = DELTA) -> int:
    """Runs at which ``tv(counts, p) < bound(p, runs, delta)`` fails with probability >= ``power`` when the runs
    follow a distribution ``distance`` (TV) from ``p`` (see the module docstring)."""
    spread = float((p * (1 - p)).sqrt().sum())
    tail = math.sqrt(math.log(1 / delta) / 2) + math.sqrt(math.log(1 / (1 - power)) / 2)
    return math.ceil(((spread + tail) / distance) ** 2)


def detectable(p: torch.Tensor, n: int, power: float = 0.99, delta: float = DELTA) -> float:
    """The TV distance from ``p`` that ``n`` runs detect with probability >= ``power`` (inverse of runs_for)."""
    spread = float((p * (1 - p)).sqrt().sum())
    return (spread + math.sqrt(math.log(1 / delta) / 2) + math.sqrt(math.log(1 / (1 - power)) / 2)) / math.sqrt(n)


def spec_counts(sampler, drafter, runs=RUNS, max_draft=4, seed0=0) -> torch.Tensor:
    counts = torch.zeros(V ** STEPS, dtype=torch.float64)
    for i in range(runs):
        job = DecodeJob(PROMPT, sampler.rules, EOS, STEPS, sampling=sampler.params,
                        generator=torch.Generator().manual_seed(seed0 + i))
        res = speculative_decode(TARGET, TARGET.start(), job, drafter, SpecOptions(max_draft=max_draft))
        counts[outcome(padded(res))] += 1
    return counts


def drafters(name: str):
    pool = NgramPool(3)
    g = torch.Generator().manual_seed(7)
    for _ in range(20):  # earlier "utterances" for the n-gram pool
        pool.add(torch.randint(0, 5, (6,), generator=g).tolist() + [EOS])
    return {
        "always-right chain": ModelDrafter(TableTarget(TARGET.table), share_encoder=True),
        "always-wrong chain": WrongDrafter(),
        "random tree": RandomTreeDrafter(3),
        "model sparse tree": ModelDrafter(DRAFT_MODEL, ModelDraftOptions(tree_topk=2, tree_threshold=0.9),
                                          share_encoder=True),
        "iid sampled tree": IidTreeDrafter(DRAFT_MODEL),
        "ngram + recycling tree": RecyclingDrafter(NgramDrafter(pool, EOS)),
        "argmax chain": ArgmaxChainDrafter(TARGET),  # point masses on the target's top token
    }[name]


DRAFTERS = ["always-right chain", "always-wrong chain", "random tree", "model sparse tree", "iid sampled tree",
            "ngram + recycling tree"]


@pytest.mark.parametrize("name,drafter", [("ras", d) for d in DRAFTERS + ["argmax chain"]]
                         + [("vllm", d) for d in DRAFTERS])
def test_speculative_sampling_keeps_the_joint_distribution(name, drafter):
    sampler = SAMPLERS[name]
    p = exact_joint(TARGET, sampler)
    counts = spec_counts(sampler, drafters(drafter))
    assert tv(counts, p) < bound(p, RUNS), f"{name} with {drafter}"


def plain_counts(sampler, runs=RUNS) -> torch.Tensor:
    counts = torch.zeros(V ** STEPS, dtype=torch.float64)
    for i in range(runs):
        job = DecodeJob(PROMPT, sampler.rules, EOS, STEPS, sampling=sampler.params,
                        generator=request_generator(0, f"plain-{i}"))
        res = greedy_decode(TARGET, TARGET.start(), job)
        counts[outcome(padded(res))] += 1
    return counts


@pytest.mark.parametrize("name", ["ras", "vllm"])
def test_plain_sampling_matches_the_enumerated_distribution(name):
    p = exact_joint(TARGET, SAMPLERS[name])
    assert tv(plain_counts(SAMPLERS[name]), p) < bound(p, RUNS)


def test_the_bound_tells_ras_from_its_nucleus_and_the_drafters_distribution():
    """Samples of RAS without its repetition check fail the bound; the drafter's distribution is far off; the
    distances the module docstring says RUNS detects hold, and runs_for inverts detectable."""
    nucleus_only = build_sampler(SamplerOptions("ras", tau_r=2.0), min_len_mask_id=EOS, min_len=2)
    p = exact_joint(TARGET, SAMPLERS["ras"])
    stated = (round(detectable(p, RUNS), 2), round(detectable(exact_joint(TARGET, SAMPLERS["vllm"]), RUNS), 2))
    assert stated == (0.27, 0.32), stated
    assert runs_for(p, detectable(p, RUNS)) in (RUNS, RUNS + 1)  # ceil of a float round trip
    assert tv(plain_counts(nucleus_only), p) > bound(p, RUNS)
    for name in ("ras", "vllm"):
        p = exact_joint(TARGET, SAMPLERS[name])
        assert tv(exact_joint(DRAFT_MODEL, SAMPLERS[name]), p) > 2 * bound(p, RUNS)


def _accept_always(p, q_row, token, u):
    return True


def _resample_from_p(p, q_row, token):
    return p


def _residual_without_clamp(p, q_row, token):
    if q_row is None:
        res = p.clone()
        res[token] = 0.0
    else:
        res = p - q_row
    return res / res.sum() if float(res.sum()) > 0 else p


@pytest.mark.parametrize("bug,drafter", [
    ("accept always", "random tree"),
    ("resample from p", "argmax chain"),
    ("residual without clamp", "iid sampled tree"),
])
def test_a_broken_verifier_fails_the_same_bound(monkeypatch, bug, drafter):
    patch = {"accept always": ("_accepts", _accept_always), "resample from p": ("_residual", _resample_from_p),
             "residual without clamp": ("_residual", _residual_without_clamp)}[bug]
    monkeypatch.setattr(reference, *patch)
    sampler = SAMPLERS["ras"]
    p = exact_joint(TARGET, sampler)
    counts = spec_counts(sampler, drafters(drafter))
    assert tv(counts, p) > bound(p, RUNS), f"{bug} went unnoticed"


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_is_token_identical(drafter):
    sampler = SAMPLERS["greedy"]
    d = drafters(drafter)
    for seed in range(6):
        table = random_table(10 + seed, scale=1.0, eos_bias=-1.0)
        target = TableTarget(table)
        if drafter == "always-right chain":
            d = ModelDrafter(TableTarget(table), share_encoder=True)
        prompt = [seed % 5, (3 * seed + 1) % 5]
        plain = greedy_decode(target, target.start(), DecodeJob(prompt, sampler.rules, EOS, 12))
        spec = speculative_decode(target, target.start(),
                                  DecodeJob(prompt, sampler.rules, EOS, 12, sampling=sampler.params), d,
                                  SpecOptions(max_draft=4))
        assert spec.tokens == plain.tokens and spec.finished == plain.finished
        assert SOS not in plain.tokens[:2]
