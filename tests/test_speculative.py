"""Speculative greedy decoding == plain greedy decoding, token for token, for every drafter and strategy.

Property tests on tiny random targets, with drafters that are always wrong, always right (the target
itself), another random model, the n-gram pool, recycling, adaptive length and sparse / random trees.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specli.engines.drafters.model import ModelDrafter, ModelDraftOptions
from specli.engines.drafters.ngram import NgramDrafter, NgramPool
from specli.engines.drafters.recycling import RecyclingDrafter
from specli.engines.greedy import greedy_decode
from specli.engines.speculative import SpecOptions, speculative_decode
from tiny_models import (EOT, NO_TS, SOT, AlwaysWrongDrafter, NoisyTreeDrafter, RandomTreeDrafter, tiny_rules,
                         tiny_target, window)

TARGET = tiny_target(0)
OTHER = tiny_target(1, layers=1)

DRAFTERS = {
    "always-wrong": lambda seed: AlwaysWrongDrafter(),
    "target-itself": lambda seed: ModelDrafter(TARGET, share_encoder=True),
    "other-model": lambda seed: ModelDrafter(OTHER),
    "adaptive": lambda seed: ModelDrafter(OTHER, ModelDraftOptions(confidence_threshold=0.3)),
    "sparse-tree": lambda seed: ModelDrafter(OTHER, ModelDraftOptions(tree_topk=2, tree_threshold=0.7)),
    "self-sparse-tree": lambda seed: ModelDrafter(TARGET, ModelDraftOptions(tree_topk=3, tree_threshold=0.99),
                                                  share_encoder=True),
    "ngram-pool": lambda seed: NgramDrafter(NgramPool(3), EOT),
    "recycling-other": lambda seed: RecyclingDrafter(ModelDrafter(OTHER)),
    "recycling-noisy-self": lambda seed: RecyclingDrafter(NoisyTreeDrafter(ModelDrafter(TARGET, share_encoder=True),
                                                                           seed, corrupt=0.25)),
    "random-tree": lambda seed: RandomTreeDrafter(seed),
    "noisy-self-tree": lambda seed: NoisyTreeDrafter(ModelDrafter(TARGET, share_encoder=True), seed),
}


def _prompt(extra: list[int], timestamps: bool) -> list[int]:
    return [SOT, *extra] + ([] if timestamps else [NO_TS])


@settings(max_examples=6, deadline=None)
@given(
    audio_seed=st.integers(0, 1000),
    extra=st.lists(st.integers(6, 35), max_size=3),
    timestamps=st.booleans(),
    max_draft=st.sampled_from([1, 2, 3, 5, 8, 13]),
    max_new=st.integers(1, 40),
    seed=st.integers(0, 1000),
)
@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_speculative_greedy_equals_greedy(name, audio_seed, extra, timestamps, max_draft, max_new, seed):
    rules = tiny_rules(timestamps)
    prompt = _prompt(extra, timestamps)
    ref = greedy_decode(TARGET, window(TARGET, audio_seed), prompt, rules, EOT, max_new, no_speech=1)
    drafter = DRAFTERS[name](seed)
    out = speculative_decode(TARGET, window(TARGET, audio_seed), prompt, rules, EOT, max_new, no_speech=1,
                             drafter=drafter, options=SpecOptions(max_draft=max_draft))
    assert out.tokens == ref.tokens
    assert out.finished == ref.finished
    assert out.sum_logprob == pytest.approx(ref.sum_logprob, abs=1e-3)
    assert out.no_speech_prob == pytest.approx(ref.no_speech_prob, abs=1e-5)
    assert out.stats.tokens == ref.stats.tokens
    assert out.stats.verify_steps <= ref.stats.target_forwards


def test_drafter_that_is_the_target_accepts_everything():
    rules = tiny_rules(False)
    prompt = _prompt([], False)
    ref = greedy_decode(TARGET, window(TARGET, 3), prompt, rules, EOT, 40)
    out = speculative_decode(TARGET, window(TARGET, 3), prompt, rules, EOT, 40,
                             drafter=ModelDrafter(TARGET, share_encoder=True), options=SpecOptions(max_draft=4))
    assert out.tokens == ref.tokens
    st_ = out.stats
    assert st_.accepted == sum(st_.position_attempts[:4]) - 0 or st_.accepted > 0
    assert all(a == t for a, t in zip(st_.position_accepts[:-1], st_.position_attempts[:-1]))
    assert st_.verify_steps <= -(-len(ref.tokens) // 5) + 1


def test_always_wrong_drafter_costs_one_forward_per_token():
    rules = tiny_rules(False)
    prompt = _prompt([], False)
    ref = greedy_decode(TARGET, window(TARGET, 4), prompt, rules, EOT, 30)
    out = speculative_decode(TARGET, window(TARGET, 4), prompt, rules, EOT, 30,
                             drafter=AlwaysWrongDrafter(), options=SpecOptions(max_draft=5))
    assert out.tokens == ref.tokens
    assert out.stats.accepted == 0
    assert out.stats.position_accepts == [0]
    assert out.stats.acceptance_length == 1.0


def test_ngram_pool_learns_across_windows():
    rules = tiny_rules(False)
    prompt = _prompt([], False)
    drafter = NgramDrafter(NgramPool(4), EOT)
    first = speculative_decode(TARGET, window(TARGET, 5), prompt, rules, EOT, 30, drafter=drafter)
    again = speculative_decode(TARGET, window(TARGET, 5), prompt, rules, EOT, 30, drafter=drafter)
    assert again.tokens == first.tokens
    assert again.stats.target_forwards < first.stats.target_forwards or len(first.tokens) < 3
