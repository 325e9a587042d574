"""bfloat16 targets: a verified chain is computed row by row exactly as AR steps compute it, so speculative
greedy decoding gives AR's tokens bit for bit (not only up to near-ties), with drafters always right, always
wrong, random and a trained-shape EAGLE head, at any draft length.

Why it needs care: PyTorch's CPU SDPA over ``n`` masked queries rounds differently from ``n`` one-query calls
where the key count crosses its block boundaries, and in bf16 that flipped exact logit ties (common at bf16
resolution) between verification and AR decoding.
"""

from __future__ import annotations

import random

import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import examples

from specli.core.drafters.base import DraftProposal
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob
from specli.core.speculative import SpecOptions, speculative_decode
from tiny_models import EOT, NO_TS, SOT, AlwaysWrongDrafter, tiny_rules, tiny_target, window

TARGET = tiny_target(0, dtype=torch.bfloat16)


class ListDrafter:
    """Proposes ``budget`` tokens: the reference continuation (right) or random ones."""

    def __init__(self, kind: str, ref: list[int], seed: int) -> None:
        self.kind, self.ref, self.rng = kind, ref, random.Random(seed)

    def start(self, state, prompt: list[int]) -> None:
        pass

    def propose(self, request) -> DraftProposal:
        done = len(request.tokens) - request.prompt_len
        n = request.budget
        if self.kind == "right":
            draft = (self.ref + [EOT] * n)[done : done + n]
        else:
            draft = [self.rng.randrange(6, 48) for _ in range(n)]
        return DraftProposal(draft, list(range(-1, n - 1)), [1.0] * n)

    def commit(self, tokens: list[int]) -> None:
        pass


def test_scoring_a_chain_equals_one_token_steps_bit_for_bit():
    prompt = [SOT, NO_TS]
    ref = greedy_decode(TARGET, window(TARGET, 4), DecodeJob(prompt, tiny_rules(False), EOT, 40)).tokens
    for start in range(0, 30, 3):
        for n in range(2, 8):
            chain = ref[start : start + n]
            state = window(TARGET, 4)
            TARGET.score(state, torch.tensor([prompt + ref[:start]]))
            together = TARGET.score(state, torch.tensor([chain])).logits[0]
            state = window(TARGET, 4)
            TARGET.score(state, torch.tensor([prompt + ref[:start]]))
            steps = torch.cat([TARGET.score(state, torch.tensor([[t]])).logits[0] for t in chain])
            assert torch.equal(together, steps), (start, n)


@examples(30)
@given(seed=st.integers(0, 40), kind=st.sampled_from(["right", "wrong", "random"]), max_draft=st.integers(1, 9),
       timestamps=st.booleans())
def test_bf16_speculative_greedy_equals_bf16_greedy(seed, kind, max_draft, timestamps):
    prompt = [SOT] if timestamps else [SOT, NO_TS]
    rules = tiny_rules(timestamps)
    ref = greedy_decode(TARGET, window(TARGET, seed), DecodeJob(prompt, rules, EOT, 40))
    drafter = AlwaysWrongDrafter() if kind == "wrong" else ListDrafter(kind, ref.tokens, seed)
    out = speculative_decode(TARGET, window(TARGET, seed), DecodeJob(prompt, rules, EOT, 40), drafter,
                             SpecOptions(max_draft=max_draft))
    assert out.tokens == ref.tokens and out.finished == ref.finished


@examples(10)
@given(seeds=st.lists(st.integers(0, 40), min_size=2, max_size=6), capacity=st.integers(2, 4),
       drafting=st.booleans())
def test_bf16_ragged_batches_equal_batch_one_greedy(seeds, capacity, drafting):
    """Rows at their own lengths (continuous batching) attend query by query over their own keys, as batch-1
    one-token steps do: bf16 batched AR (and batched speculative) rows give each window's batch-1 bf16 greedy
    tokens exactly."""
    from specli.core.batched import RowJob, decode_all
    from specli.core.drafters.batched import PerRowDrafters

    jobs = []
    for key, seed in enumerate(seeds):
        w = window(TARGET, seed)
        prompt = [SOT] + [NO_TS] * (key % 2)  # timestamps on every other row: rows drift apart in length
        jobs.append(RowJob(key, (w.audio_features, w.features), DecodeJob(prompt, tiny_rules(key % 2 == 0), EOT,
                                                                           10 + 5 * key)))
    ref = {j.key: greedy_decode(TARGET, window(TARGET, seeds[j.key]), j.job) for j in jobs}
    drafter = PerRowDrafters(AlwaysWrongDrafter) if drafting else None
    got = dict(decode_all(TARGET, jobs, capacity, drafter=drafter, options=SpecOptions(max_draft=3)))
    for key, res in ref.items():
        assert got[key].tokens == res.tokens and got[key].finished == res.finished, key
