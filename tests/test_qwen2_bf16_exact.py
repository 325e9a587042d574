"""The lean Qwen2 / Qwen3-MoE decoder in bfloat16: a scored chain or tree attends row by row as one-token steps
do, so its logits equal AR steps' bit for bit and speculative greedy decoding gives bf16 AR's tokens exactly,
with drafters always right, always wrong and random (the audio-LLM presets can then run in bf16 losslessly).

Without the row-by-row path, CPU SDPA over n masked queries rounds differently from n one-query calls, and in
bf16 that flips logit ties between verification and AR decoding."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from specli.core.drafters.base import DraftProposal
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob
from specli.core.speculative import SpecOptions, speculative_decode
from specli.core.tree import tree_inputs
from specli.models.qwen2 import Qwen2Dims, Qwen2Target

VOCAB, EOS = 97, 3


def _target(kind: str, dtype: torch.dtype = torch.bfloat16, positions: int = 512) -> Qwen2Target:
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=positions, rope_theta=5000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
    if kind == "qwen2":
        cfg = Qwen2Config(intermediate_size=96, **common)
        ref = Qwen2ForCausalLM(cfg)
    else:
        cfg = Qwen3MoeConfig(intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                             head_dim=16, **common)
        ref = Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(3.0)  # sharper logits: decoding does not collapse onto one token
    return Qwen2Target(Qwen2Dims.from_hf_config(cfg.to_dict()), dict(ref.state_dict()), dtype)


TARGETS = {kind: _target(kind) for kind in ("qwen2", "qwen3-moe")}
PROMPT = (5, 17, 29, 41, 8, 60, 12)


def _job(max_new: int = 40) -> DecodeJob:
    return DecodeJob(PROMPT, None, EOS, max_new)


@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_scoring_a_chain_equals_one_token_steps_bit_for_bit(kind):
    target = TARGETS[kind]
    ref = greedy_decode(target, target.start(256), _job()).tokens
    for start in range(0, 24, 4):
        for n in (2, 3, 5, 8):
            chain = ref[start : start + n]
            state = target.start(256)
            target.score(state, torch.tensor([list(PROMPT) + ref[:start]]))
            together = target.score(state, torch.tensor([chain])).logits[0]
            state = target.start(256)
            target.score(state, torch.tensor([list(PROMPT) + ref[:start]]))
            steps = torch.cat([target.score(state, torch.tensor([[t]])).logits[0] for t in chain])
            assert torch.equal(together, steps), (kind, start, n)


@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_tree_rows_equal_their_paths_one_token_steps(kind):
    target = TARGETS[kind]
    parents, toks, pending = [-1, 0, -1, 2, 0, 1], [5, 7, 9, 11, 13, 15], 21
    state = target.start(256)
    target.score(state, torch.tensor([list(PROMPT)]))
    mask, pos = tree_inputs(parents, state.length)
    tree = target.score(state, torch.tensor([[pending, *toks]]), positions=pos, tree_mask=mask).logits[0]
    for node in range(len(toks)):
        path, i = [], node
        while i >= 0:
            path.insert(0, toks[i])
            i = parents[i]
        s = target.start(256)
        target.score(s, torch.tensor([list(PROMPT)]))
        steps = [target.score(s, torch.tensor([[t]])).logits[0, 0] for t in [pending, *path]]
        assert torch.equal(tree[0], steps[0]) and torch.equal(tree[node + 1], steps[-1]), (kind, node)


class ListDrafter:
    """Proposes ``budget`` tokens: the reference continuation (right), wrong ones or random ones."""

    def __init__(self, kind: str, ref: list[int], seed: int) -> None:
        self.kind, self.ref, self.rng = kind, ref, random.Random(seed)

    def start(self, state, prompt: list[int]) -> None:
        pass

    def propose(self, request) -> DraftProposal:
        done, n = len(request.tokens) - request.prompt_len, request.budget
        if self.kind == "right":
            draft = (self.ref + [EOS] * n)[done : done + n]
        elif self.kind == "wrong":
            draft = [(t + 1) % VOCAB for t in (self.ref + [EOS] * n)[done : done + n]]
        else:
            draft = [self.rng.randrange(VOCAB) for _ in range(n)]
        return DraftProposal(draft, list(range(-1, n - 1)), [1.0] * n)

    def commit(self, tokens: list[int]) -> None:
        pass


@settings(max_examples=24, deadline=None)
@given(kind=st.sampled_from(sorted(TARGETS)), drafter=st.sampled_from(["right", "wrong", "random"]),
       max_draft=st.integers(1, 9), seed=st.integers(0, 50))
def test_bf16_speculative_greedy_equals_bf16_greedy(kind, drafter, max_draft, seed):
    target = TARGETS[kind]
    ref = greedy_decode(target, target.start(256), _job())
    out = speculative_decode(target, target.start(256), _job(), ListDrafter(drafter, ref.tokens, seed),
                             SpecOptions(max_draft=max_draft))
    assert out.tokens == ref.tokens and out.finished == ref.finished


@pytest.mark.parametrize("kind", sorted(TARGETS))
@pytest.mark.parametrize("drafting", [False, True])
def test_ragged_batches_equal_batch_one_greedy(kind, drafting):
    """Rows at different lengths (continuous batching) score query by query over their own keys: AR and
    n-gram-drafted speculative rows give each job's batch-1 bf16 greedy tokens exactly."""
    from specli.core.batched import RowJob, decode_all
    from specli.core.drafters.batched import batch_drafter
    from specli.core.drafters.ngram import NgramDrafter, NgramPool

    target = TARGETS[kind]
    rng = random.Random(7)
    jobs = [DecodeJob(tuple(rng.randrange(4, VOCAB) for _ in range(rng.randrange(3, 15))), None, EOS,
                      rng.randrange(8, 40)) for _ in range(6)]
    ref = [greedy_decode(target, target.start(256), job) for job in jobs]
    drafter = batch_drafter(NgramDrafter(NgramPool(), EOS), 3) if drafting else None
    got = dict(decode_all(target, [RowJob(i, None, job) for i, job in enumerate(jobs)], 3, 256, drafter=drafter,
                          options=SpecOptions(max_draft=5)))
    for i, res in enumerate(ref):
        assert got[i].tokens == res.tokens and got[i].finished == res.finished, i


@pytest.mark.parametrize("kind", ["qwen2", "qwen3-moe"])
@pytest.mark.parametrize("plen", [300, 688, 1000])
def test_long_prompts_are_cached_alike_by_ar_and_speculation(kind, plen):
    """AR prefills all but the last prompt token and then scores that token alone, as speculation does: a prefill
    of plen rows tiles attention and matmuls differently from one of plen - 1, and in bf16 the prompt's cached K/V
    then differ in the last bits (a tiny Qwen2-Audio's greedy transcript of a 22-s clip left AR at token 26)."""
    target = _target(kind, positions=2048)
    rng = random.Random(plen)
    job = DecodeJob(tuple(rng.randrange(4, VOCAB) for _ in range(plen)), None, EOS, 12)
    ar_state, spec_state = target.start(plen + 32), target.start(plen + 32)
    ref = greedy_decode(target, ar_state, job)
    out = speculative_decode(target, spec_state, job, ListDrafter("wrong", ref.tokens, 0), SpecOptions(max_draft=3))
    assert out.tokens == ref.tokens
    n = plen + len(ref.tokens) - 1  # positions both caches hold
    assert torch.equal(ar_state.cache.keys[..., :n, :], spec_state.cache.keys[..., :n, :])
    assert torch.equal(ar_state.cache.values[..., :n, :], spec_state.cache.values[..., :n, :])
