"""One exactness matrix over (target x dtype): the tiny Whisper decoder in bfloat16 and int8 (weight-only), the lean
Qwen2 and Qwen3-MoE decoders in bfloat16. In each, a scored chain or tree attends row by row as one-token steps do, so
its logits equal AR steps' bit for bit and speculative greedy decoding gives that target's AR tokens exactly (not
only up to near-ties), with drafters always right, always wrong and random, at any draft length; ragged batches
give each row's batch-1 tokens. A new family or dtype is one entry of ``MATRIX``.

Why it needs care: PyTorch's CPU SDPA over ``n`` masked queries rounds differently from ``n`` one-query calls where
the key count crosses its block boundaries, and in bf16 that flipped exact logit ties (common at bf16 resolution)
between verification and AR decoding. int8 adds its kernel, whose rows must not depend on the row count
(test_int8_exact checks the kernel itself).
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from conftest import examples

from specli.core.drafters.base import Drafter, DraftProposal
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob
from specli.core.speculative import SpecOptions, speculative_decode
from specli.core.tree import tree_inputs
from specli.models.qwen2 import Qwen2Dims, Qwen2Target
from tiny_models import EOT, NO_TS, SOT, AlwaysWrongDrafter, tiny_rules, tiny_target, window

# (target, dtype): every test below that takes `case` runs on each
MATRIX = [("whisper", "bfloat16"), ("whisper", "int8"), ("qwen2", "bfloat16"), ("qwen3-moe", "bfloat16")]
IDS = [f"{t}-{d}" for t, d in MATRIX]
QWEN_VOCAB, QWEN_EOS = 97, 3
QWEN_PROMPT = (5, 17, 29, 41, 8, 60, 12)


class ListDrafter(Drafter):
    """Proposes ``budget`` tokens: the reference continuation (right), each reference token plus one (wrong) or
    random tokens in ``[low, high)``."""

    def __init__(self, kind: str, ref: list[int], seed: int, eos: int, low: int, high: int) -> None:
        self.kind, self.ref, self.rng, self.eos, self.low, self.high = kind, ref, random.Random(seed), eos, low, high

    def start(self, state, prompt: list[int]) -> None:
        pass

    def propose(self, request) -> DraftProposal:
        done, n = len(request.tokens) - request.prompt_len, request.budget
        if self.kind == "right":
            draft = (self.ref + [self.eos] * n)[done : done + n]
        elif self.kind == "wrong":
            draft = [(t + 1) % self.high for t in (self.ref + [self.eos] * n)[done : done + n]]
        else:
            draft = [self.rng.randrange(self.low, self.high) for _ in range(n)]
        return DraftProposal(draft, list(range(-1, n - 1)), [1.0] * n)

    def commit(self, tokens: list[int]) -> None:
        pass


class WhisperCase:
    """The tiny Whisper decoder over random encoder features (a seed picks the features); variants: timestamps
    off / on (their prompt and logit rules)."""

    eos, max_seed, variants, examples = EOT, 40, (False, True), 30
    chain_starts, chain_lengths = range(0, 30, 3), range(2, 8)

    def __init__(self, dtype: torch.dtype) -> None:
        self.target = tiny_target(0, dtype=dtype)

    def state(self, seed: int = 4):
        return window(self.target, seed)

    def job(self, timestamps: bool = False, max_new: int = 40) -> DecodeJob:
        return DecodeJob([SOT] if timestamps else [SOT, NO_TS], tiny_rules(timestamps), EOT, max_new)

    def drafter(self, kind: str, ref: list[int], seed: int):
        # always wrong: a suppressed token at every position
        return AlwaysWrongDrafter() if kind == "wrong" else ListDrafter(kind, ref, seed, EOT, 6, 48)


def qwen_target(kind: str, dtype: torch.dtype = torch.bfloat16, positions: int = 512) -> Qwen2Target:
    torch.manual_seed(0)
    common = dict(vocab_size=QWEN_VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=positions, rope_theta=5000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=False)
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


class QwenCase:
    """The lean Qwen2 / Qwen3-MoE decoder after a fixed text prompt (a seed picks only the random drafter's
    tokens); 12 examples a kind (24 over the two, as before the merge)."""

    eos, max_seed, variants, examples = QWEN_EOS, 50, (None,), 12
    chain_starts, chain_lengths = range(0, 24, 4), (2, 3, 5, 8)

    def __init__(self, kind: str, dtype: torch.dtype) -> None:
        self.target = qwen_target(kind, dtype)

    def state(self, seed: int = 0):
        return self.target.start(256)

    def job(self, _variant=None, max_new: int = 40) -> DecodeJob:
        return DecodeJob(QWEN_PROMPT, None, QWEN_EOS, max_new)

    def drafter(self, kind: str, ref: list[int], seed: int):
        return ListDrafter(kind, ref, seed, QWEN_EOS, 0, QWEN_VOCAB)


@pytest.fixture(scope="module")
def cases():
    """The matrix's targets by (target, dtype), built on first use (immutable: tests only decode)."""
    built: dict = {}

    def get(target: str, dtype: str):
        if (target, dtype) not in built:
            dt = getattr(torch, dtype)
            built[target, dtype] = WhisperCase(dt) if target == "whisper" else QwenCase(target, dt)
        return built[target, dtype]

    return get


def chain_equals_steps(case) -> None:
    """Scoring each chain of the greedy continuation at once gives the logits of one-token steps, bit for bit."""
    target, job = case.target, case.job()
    prompt = list(job.prompt)
    ref = greedy_decode(target, case.state(), job).tokens
    for start in case.chain_starts:
        for n in case.chain_lengths:
            chain = ref[start : start + n]
            state = case.state()
            target.score(state, torch.tensor([prompt + ref[:start]]))
            together = target.score(state, torch.tensor([chain])).logits[0]
            state = case.state()
            target.score(state, torch.tensor([prompt + ref[:start]]))
            steps = torch.cat([target.score(state, torch.tensor([[t]])).logits[0] for t in chain])
            assert torch.equal(together, steps), (start, n)


@pytest.mark.parametrize(("target", "dtype"), MATRIX, ids=IDS)
def test_scoring_a_chain_equals_one_token_steps_bit_for_bit(cases, target, dtype):
    chain_equals_steps(cases(target, dtype))


@pytest.mark.parametrize(("target", "dtype"), MATRIX, ids=IDS)
def test_speculative_greedy_equals_greedy_of_the_same_dtype(cases, target, dtype):
    case = cases(target, dtype)

    @examples(case.examples)
    @given(seed=st.integers(0, case.max_seed), kind=st.sampled_from(["right", "wrong", "random"]),
           max_draft=st.integers(1, 9), variant=st.sampled_from(case.variants))
    def check(seed, kind, max_draft, variant):
        ref = greedy_decode(case.target, case.state(seed), case.job(variant))
        out = speculative_decode(case.target, case.state(seed), case.job(variant),
                                 case.drafter(kind, ref.tokens, seed), SpecOptions(max_draft=max_draft))
        assert out.tokens == ref.tokens and out.finished == ref.finished

    check()


# a token tree: node i's parent (-1: a root on the cached prefix), in topological order as drafters build them
PARENTS = [-1, 0, 0, 1, 1, 2, 3, 3, 5, 6, 8]


def _path(node: int, parents=PARENTS) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("start", [0, 5, 17])
@pytest.mark.parametrize(("target", "dtype"), MATRIX, ids=IDS)
def test_scoring_a_tree_equals_one_token_steps_along_each_path(cases, target, dtype, start):
    """Trees (sparse-tree, dynamic-tree, recycling presets): each node's logits are those of one-token steps along
    its root-to-node path, bit for bit, so tree speculation is lossless against AR too. The tree's deepest path
    follows the greedy continuation, its other nodes are random tokens."""
    case = cases(target, dtype)
    tgt, job = case.target, case.job()
    ref = greedy_decode(tgt, case.state(), job).tokens
    prefix = torch.tensor([list(job.prompt) + ref[:start]])
    g = torch.Generator().manual_seed(start)
    main = _path(len(PARENTS) - 1)
    tokens = [ref[start + len(_path(i)) - 1] if i in main else int(torch.randint(6, 36, (1,), generator=g))
              for i in range(len(PARENTS))]
    mask = torch.tensor([[j in _path(i) for j in range(len(PARENTS))] for i in range(len(PARENTS))])
    depth = torch.tensor([len(_path(i)) - 1 for i in range(len(PARENTS))])
    state = case.state()
    tgt.score(state, prefix)
    base = prefix.shape[1]
    tree = tgt.score(state, torch.tensor([tokens]), positions=(base + depth)[None], tree_mask=mask[None]).logits[0]
    for node in range(len(PARENTS)):
        state = case.state()
        tgt.score(state, prefix)
        for j in _path(node):
            step = tgt.score(state, torch.tensor([[tokens[j]]])).logits[0, 0]
        assert torch.equal(tree[node], step), node


@pytest.mark.parametrize(("target", "dtype"), MATRIX, ids=IDS)
def test_tree_after_a_pending_token_equals_its_paths_one_token_steps(cases, target, dtype):
    """A verify step scores the pending token as the tree's root and a forest under it (`tree_inputs`): the root's
    and every node's logits are one-token steps' along the path."""
    case = cases(target, dtype)
    tgt, prompt = case.target, list(case.job().prompt)
    parents, toks, pending = [-1, 0, -1, 2, 0, 1], [5, 7, 9, 11, 13, 15], 21
    state = case.state()
    tgt.score(state, torch.tensor([prompt]))
    mask, pos = tree_inputs(parents, state.length)
    tree = tgt.score(state, torch.tensor([[pending, *toks]]), positions=pos, tree_mask=mask).logits[0]
    for node in range(len(toks)):
        path = [toks[i] for i in _path(node, parents)]
        s = case.state()
        tgt.score(s, torch.tensor([prompt]))
        steps = [tgt.score(s, torch.tensor([[t]])).logits[0, 0] for t in [pending, *path]]
        assert torch.equal(tree[0], steps[0]) and torch.equal(tree[node + 1], steps[-1]), node


WHISPER = [(t, d) for t, d in MATRIX if t == "whisper"]
QWEN = [(t, d) for t, d in MATRIX if t != "whisper"]


@pytest.mark.parametrize(("target", "dtype"), WHISPER, ids=[f"{t}-{d}" for t, d in WHISPER])
def test_whisper_ragged_batches_equal_batch_one_greedy(cases, target, dtype):
    """Rows at their own lengths (continuous batching) attend query by query over their own keys, as batch-1
    one-token steps do: batched AR (and batched speculative) rows give each window's batch-1 greedy tokens of the
    same dtype exactly."""
    from specli.core.batched import RowJob, decode_all
    from specli.core.drafters.batched import PerRowDrafters

    case = cases(target, dtype)
    tgt = case.target

    @examples(10)
    @given(seeds=st.lists(st.integers(0, 40), min_size=2, max_size=6), capacity=st.integers(2, 4),
           drafting=st.booleans())
    def check(seeds, capacity, drafting):
        jobs = []
        for key, seed in enumerate(seeds):
            w = window(tgt, seed)
            prompt = [SOT] + [NO_TS] * (key % 2)  # timestamps on every other row: rows drift apart in length
            jobs.append(RowJob(key, (w.audio_features, w.features),
                               DecodeJob(prompt, tiny_rules(key % 2 == 0), EOT, 10 + 5 * key)))
        ref = {j.key: greedy_decode(tgt, window(tgt, seeds[j.key]), j.job) for j in jobs}
        drafter = PerRowDrafters(AlwaysWrongDrafter) if drafting else None
        got = dict(decode_all(tgt, jobs, capacity, drafter=drafter, options=SpecOptions(max_draft=3)))
        for key, res in ref.items():
            assert got[key].tokens == res.tokens and got[key].finished == res.finished, key

    check()


@pytest.mark.parametrize("drafting", [False, True])
@pytest.mark.parametrize(("target", "dtype"), QWEN, ids=[f"{t}-{d}" for t, d in QWEN])
def test_qwen_ragged_batches_equal_batch_one_greedy(cases, target, dtype, drafting):
    """Rows at different lengths (continuous batching) score query by query over their own keys: AR and
    n-gram-drafted speculative rows give each job's batch-1 greedy tokens of the same dtype exactly."""
    from specli.core.batched import RowJob, decode_all
    from specli.core.drafters.batched import batch_drafter
    from specli.core.drafters.ngram import NgramDrafter, NgramPool

    tgt = cases(target, dtype).target
    rng = random.Random(7)
    jobs = [DecodeJob(tuple(rng.randrange(4, QWEN_VOCAB) for _ in range(rng.randrange(3, 15))), None, QWEN_EOS,
                      rng.randrange(8, 40)) for _ in range(6)]
    ref = [greedy_decode(tgt, tgt.start(256), job) for job in jobs]
    drafter = batch_drafter(NgramDrafter(NgramPool(), QWEN_EOS), 3) if drafting else None
    got = dict(decode_all(tgt, [RowJob(i, None, job) for i, job in enumerate(jobs)], 3, 256, drafter=drafter,
                          options=SpecOptions(max_draft=5)))
    for i, res in enumerate(ref):
        assert got[i].tokens == res.tokens and got[i].finished == res.finished, i


@pytest.mark.parametrize("plen", [300, 688, 1000])
@pytest.mark.parametrize(("target", "dtype"), QWEN, ids=[f"{t}-{d}" for t, d in QWEN])
def test_long_prompts_are_cached_alike_by_ar_and_speculation(target, dtype, plen):
    """AR prefills all but the last prompt token and then scores that token alone, as speculation does: a prefill
    of plen rows tiles attention and matmuls differently from one of plen - 1, and in bf16 the prompt's cached K/V
    then differ in the last bits (a tiny Qwen2-Audio's greedy transcript of a 22-s clip left AR at token 26)."""
    tgt = qwen_target(target, getattr(torch, dtype), positions=2048)
    rng = random.Random(plen)
    job = DecodeJob(tuple(rng.randrange(4, QWEN_VOCAB) for _ in range(plen)), None, QWEN_EOS, 12)
    ar_state, spec_state = tgt.start(plen + 32), tgt.start(plen + 32)
    ref = greedy_decode(tgt, ar_state, job)
    out = speculative_decode(tgt, spec_state, job, ListDrafter("wrong", ref.tokens, 0, QWEN_EOS, 0, QWEN_VOCAB),
                             SpecOptions(max_draft=3))
    assert out.tokens == ref.tokens
    n = plen + len(ref.tokens) - 1  # positions both caches hold
    assert torch.equal(ar_state.cache.keys[..., :n, :], spec_state.cache.keys[..., :n, :])
    assert torch.equal(ar_state.cache.values[..., :n, :], spec_state.cache.values[..., :n, :])
