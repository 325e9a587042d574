"""Speculative greedy decoding == plain greedy decoding, token for token, for every drafter and strategy.

Property tests on tiny random targets, with drafters that are always wrong, always right (the target
itself), another random model, the n-gram pool, recycling, adaptive length and sparse / random trees.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import examples

from specli.asr.drafters.model import ModelDrafter, ModelDraftOptions
from specli.core.drafters.base import Drafter
from specli.core.drafters.ngram import NgramDrafter, NgramPool
from specli.core.drafters.recycling import RecyclingDrafter
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob, Probe
from specli.core.speculative import SpecOptions, speculative_decode
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


@examples(6)
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
    ref = greedy_decode(TARGET, window(TARGET, audio_seed), DecodeJob(prompt, rules, EOT, max_new, probe=Probe(0, 1)))
    drafter = DRAFTERS[name](seed)
    out = speculative_decode(TARGET, window(TARGET, audio_seed),
                             DecodeJob(prompt, rules, EOT, max_new, probe=Probe(0, 1)), drafter,
                             SpecOptions(max_draft=max_draft))
    assert out.tokens == ref.tokens
    assert out.finished == ref.finished
    assert out.sum_logprob == pytest.approx(ref.sum_logprob, abs=1e-3)
    assert out.probed == pytest.approx(ref.probed, abs=1e-5)
    assert out.stats.tokens == ref.stats.tokens
    assert out.stats.verify_steps <= ref.stats.target_forwards


class RecordingDrafter(Drafter):
    """Wraps a drafter and keeps every proposal it made (chains: their tokens, in order)."""

    def __init__(self, inner) -> None:
        self.inner, self.proposals = inner, []

    def start(self, state, prompt: list[int]) -> None:
        self.inner.start(state, prompt)

    def propose(self, request):
        proposal = self.inner.propose(request)
        assert all(p == i - 1 for i, p in enumerate(proposal.parents))  # a chain
        self.proposals.append(list(proposal.tokens))
        return proposal

    def commit(self, tokens: list[int]) -> None:
        self.inner.commit(tokens)


# window seed 1 decodes 31 tokens then eot within 40 (the eot case); seed 3 is cut by the length limit
@pytest.mark.parametrize(("audio_seed", "finished"), [(1, True), (3, False)])
def test_drafter_that_is_the_target_accepts_everything(audio_seed, finished):
    rules = tiny_rules(False)
    prompt = _prompt([], False)
    ref = greedy_decode(TARGET, window(TARGET, audio_seed), DecodeJob(prompt, rules, EOT, 40))
    assert ref.finished == finished and len(ref.tokens) >= 20  # the inputs are what this test is about
    drafter = RecordingDrafter(ModelDrafter(TARGET, share_encoder=True))
    out = speculative_decode(TARGET, window(TARGET, audio_seed), DecodeJob(prompt, rules, EOT, 40), drafter,
                             SpecOptions(max_draft=4))
    assert out.tokens == ref.tokens and out.finished == ref.finished
    st_ = out.stats
    # the drafter is the target: every drafted token up to the end is accepted. A drafted eot is
    # accepted as the step's last token (counted like a bonus), drafts past the end are not.
    *whole, last = drafter.proposals
    emitted = len(ref.tokens) + ref.finished  # eot included
    left = emitted - sum(len(p) + 1 for p in whole)  # tokens the last step emits: accepted + 1
    used_last = last.index(EOT) if EOT in last else min(len(last), left - 1)
    assert st_.drafted == sum(len(p) for p in drafter.proposals)
    assert st_.accepted == sum(len(p) for p in whole) + used_last
    assert all(len(p) == 4 for p in whole)
    assert st_.tokens == emitted and st_.verify_steps == -(-emitted // 5)  # 4 accepted + 1 per forward
    assert st_.acceptance_length > 4.0
    # per depth, every attempt was accepted except one at the last step when it drafted past the end
    misses = sum(st_.position_attempts) - sum(st_.position_accepts)
    assert misses == int(used_last < len(last))


def test_always_wrong_drafter_costs_one_forward_per_token():
    rules = tiny_rules(False)
    prompt = _prompt([], False)
    ref = greedy_decode(TARGET, window(TARGET, 4), DecodeJob(prompt, rules, EOT, 30))
    out = speculative_decode(TARGET, window(TARGET, 4), DecodeJob(prompt, rules, EOT, 30), AlwaysWrongDrafter(),
                             SpecOptions(max_draft=5))
    assert out.tokens == ref.tokens
    assert out.stats.accepted == 0
    assert out.stats.position_accepts == [0]
    assert out.stats.acceptance_length == 1.0


def test_ngram_pool_learns_across_windows():
    rules = tiny_rules(False)
    prompt = _prompt([], False)
    drafter = NgramDrafter(NgramPool(4), EOT)
    first = speculative_decode(TARGET, window(TARGET, 1), DecodeJob(prompt, rules, EOT, 40), drafter)
    assert first.finished and len(first.tokens) >= 20  # window seed 1: 31 tokens, then eot
    again = speculative_decode(TARGET, window(TARGET, 1), DecodeJob(prompt, rules, EOT, 40), drafter)
    assert again.tokens == first.tokens
    # the pool now holds the whole first hypothesis: the repeat drafts most of it from there
    assert again.stats.target_forwards < first.stats.target_forwards
    assert again.stats.accepted > first.stats.accepted
    assert again.stats.accepted >= len(first.tokens) // 2
