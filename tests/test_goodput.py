"""Goodput-driven draft length (core/goodput.py): the arithmetic, the decisions under given costs, and that it never
changes the output (greedy == AR token for token, alone and in batches; sampling keeps the target's law)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import examples

from specli.asr.drafters.model import ModelDrafter
from specli.core.batched import RowJob, decode_all
from specli.core.drafters.batched import PerRowDrafters
from specli.core.goodput import (Calibration, FixedCosts, GoodputController, OnlineCosts, expected_accepted,
                                 goodput)
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob
from specli.core.logits import SamplingParams, filter_logits
from specli.core.speculative import SpecOptions, speculative_decode
from tiny_models import EOT, NO_TS, SOT, AlwaysWrongDrafter, RandomTreeDrafter, tiny_rules, tiny_target, window

TARGET = tiny_target(0)
OTHER = tiny_target(1, layers=1)
FREE = FixedCosts(draft_s=0.0, base=1.0, slope=0.0)  # drafting costs nothing, verifying k tokens as one
DEAR = FixedCosts(draft_s=0.5, base=1.0, slope=1.0)  # verifying 2 tokens costs twice one, a draft half a step
DRAFTERS = {
    "always-wrong": lambda seed: AlwaysWrongDrafter(),
    "always-right": lambda seed: ModelDrafter(TARGET, share_encoder=True),
    "other-model": lambda seed: ModelDrafter(OTHER),
    "random-tree": lambda seed: RandomTreeDrafter(seed),
}


def test_expected_accepted_and_goodput() -> None:
    assert expected_accepted([]) == 0.0
    assert expected_accepted([1.0, 1.0, 1.0]) == 3.0
    assert expected_accepted([0.5, 0.5]) == pytest.approx(0.5 + 0.25)
    assert goodput([], FREE) == 1.0  # plain decoding: one token a forward
    assert goodput([1.0, 1.0], FREE) == 3.0
    assert goodput([0.5], DEAR) == pytest.approx(1.5 / (0.5 + 2.0))


def test_free_drafting_drafts_and_dear_verification_does_not() -> None:
    free, dear = GoodputController(FREE), GoodputController(DEAR)
    assert free.should_draft() and free.keep_drafting([0.9, 0.9])
    assert not dear.should_draft()  # 1 + 0.7 tokens for 2.5 steps: plain decoding (1 a step) wins
    assert not dear.keep_drafting([0.99])
    # a middling cost table: drafting pays while the chain is likely to survive, not after
    mid = GoodputController(FixedCosts(draft_s=0.05, base=1.0, slope=0.1))
    assert mid.should_draft() and mid.keep_drafting([0.9, 0.9]) and not mid.keep_drafting([0.9, 0.2, 0.1])


def test_batched_rows_make_drafting_dearer() -> None:
    costs = FixedCosts(draft_s=0.05, base=1.0, slope=0.15, row_exp=0.0)
    assert GoodputController(costs, rows=1).keep_drafting([0.6])
    rowy = FixedCosts(draft_s=0.05 * 8, base=1.0, slope=0.15, row_exp=0.0)  # 8 rows' draft steps a forward
    assert not GoodputController(rowy, rows=8).keep_drafting([0.6])


def test_calibration_learns_acceptance() -> None:
    cal = Calibration()
    assert cal.accept(0.8) == 0.8 and cal.first() == pytest.approx(0.7)  # before warm-up: the prior
    for _ in range(8):
        cal.record([0.8, 0.8, 0.8], 0)  # confident drafter, never right
    assert cal.accept(0.8) == 0.0 and cal.first() < 0.1


def test_online_costs_learn_from_timings() -> None:
    costs = OnlineCosts(FixedCosts(draft_s=0.01, base=1.0, slope=0.1))
    assert costs.verify(1, 3) == pytest.approx(1.2)  # the prior
    costs.record_verify(1, 1, 0.02)  # seconds: the prior's units (one-token forwards) are rescaled
    assert costs.draft() == pytest.approx(0.01 * 0.02) and costs.verify(1, 3) == pytest.approx(0.02 * 1.2)
    for _ in range(30):
        costs.record_verify(1, 3, 2.0)
        costs.record_draft(0.3, 3)
    assert costs.verify(1, 3) == pytest.approx(2.0, rel=1e-3) and costs.draft() == pytest.approx(0.1, rel=1e-3)
    assert costs.verify(1, 4) == pytest.approx(2.0 * 1.3 / 1.2, rel=1e-3)  # unseen: the nearest, scaled


def _decode(drafter, costs, audio_seed: int, max_new: int, sampling=SamplingParams(), seed=0):
    job = DecodeJob([SOT, NO_TS], tiny_rules(False), EOT, max_new, sampling=sampling,
                    generator=torch.Generator().manual_seed(seed))
    return speculative_decode(TARGET, window(TARGET, audio_seed), job, drafter, SpecOptions(max_draft=6, costs=costs))


@examples(5)
@given(audio_seed=st.integers(0, 1000), max_new=st.integers(1, 40), seed=st.integers(0, 1000))
@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_output_equals_ar_whatever_the_costs(name: str, audio_seed: int, max_new: int, seed: int) -> None:
    ref = greedy_decode(TARGET, window(TARGET, audio_seed), DecodeJob([SOT, NO_TS], tiny_rules(False), EOT, max_new))
    free = _decode(DRAFTERS[name](seed), FREE, audio_seed, max_new)
    dear = _decode(DRAFTERS[name](seed), DEAR, audio_seed, max_new)
    online = _decode(DRAFTERS[name](seed), OnlineCosts(FixedCosts(0.01, 1.0)), audio_seed, max_new)
    for out in (free, dear, online):
        assert out.tokens == ref.tokens and out.finished == ref.finished
    assert dear.stats.drafted == 0  # verification too dear: drafting switched itself off
    if name == "always-right" and len(ref.tokens) > 2:
        assert free.stats.drafted > 0 and free.stats.target_forwards < ref.stats.target_forwards


def test_draft_lengths_are_reported() -> None:
    out = _decode(DRAFTERS["always-right"](0), FREE, 3, 30)
    lengths = out.stats.draft_lengths
    assert sum(lengths) == out.stats.verify_steps and any(lengths[1:])


@pytest.mark.parametrize("costs", [FREE, DEAR])
def test_batched_rows_equal_batch1(costs) -> None:
    jobs = [RowJob(k, window(TARGET, 10 + k).audio_features,
                   DecodeJob([SOT, NO_TS], tiny_rules(False), EOT, 20)) for k in range(4)]
    ref = {j.key: greedy_decode(TARGET, TARGET.start(j.context), j.job).tokens for j in jobs}
    drafter = PerRowDrafters(lambda: ModelDrafter(TARGET, share_encoder=True))
    got = dict(decode_all(TARGET, jobs, 3, drafter=drafter, options=SpecOptions(max_draft=4, costs=costs)))
    assert {k: r.tokens for k, r in got.items()} == ref
    drafted = sum(r.stats.drafted for r in got.values())
    assert (drafted == 0) == (costs is DEAR)


def test_sampling_keeps_the_first_token_law() -> None:
    """Goodput only shortens drafts: sampled first tokens still follow the target's filtered distribution."""
    params = SamplingParams(temperature=1.0)
    logits = TARGET.score(window(TARGET, 7), torch.tensor([[SOT, NO_TS]])).logits[0, -1:]
    probs = filter_logits(logits, [[]], tiny_rules(False), params).softmax(-1)[0]
    counts = torch.zeros_like(probs)
    runs = 600
    for i in range(runs):
        out = _decode(ModelDrafter(OTHER), FixedCosts(0.01, 1.0, 0.05), 7, 1, params, seed=i)
        counts[out.tokens[0] if out.tokens else EOT] += 1
    tv = 0.5 * float((counts / runs - probs).abs().sum())
    assert tv < 3 * 0.5 * (int((probs > 1e-3).sum()) / runs) ** 0.5
