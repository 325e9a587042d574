"""EAGLE-2 dynamic draft tree and SpecASR's two-pass sparse tree: lossless, and the shapes they promise.

Property tests on tiny random Whisper targets and tiny random EAGLE heads: greedy speculative
output equals plain greedy decoding token for token, with the head's own drafts (random), an oracle
that always proposes the target's continuation (always right) and one that never does (always
wrong); a statistical test for sampling; and a real-weight test (whisper-base + the shipped head).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import EN_CLIPS, examples
from specli.core.drafters.base import DraftRequest, ModelDraftOptions
from specli.asr.drafters.dynamic_tree import DynamicTreeDrafter, DynamicTreeOptions
from specli.asr.drafters.eagle_head import EagleConfig, SpeechDraftHead
from specli.asr.drafters.eagle import EagleDrafter
from specli.asr.drafters.model import ModelDrafter
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob, Probe
from specli.core.logits import filter_logits
from specli.core.speculative import SpecOptions, speculative_decode
from specli.core.tree import depths, path_to
from specli.errors import PresetError
from specli.presets import load_preset, preset_from_dict
from test_sampling import assert_two_token_marginals, tv
from tiny_models import EOT, NO_TS, SOT, VOCAB, tiny_rules, tiny_target, window

TARGET = tiny_target(0)


def _head(seed: int, draft_vocab: int = 0) -> SpeechDraftHead:
    torch.manual_seed(seed)
    if not draft_vocab:
        return SpeechDraftHead(EagleConfig.for_target(TARGET, "tiny"), TARGET)
    ids = torch.randperm(VOCAB)[:draft_vocab].sort().values
    return SpeechDraftHead(EagleConfig.for_target(TARGET, "tiny", draft_vocab), TARGET, ids)


class OracleTree(DynamicTreeDrafter):
    """The dynamic tree with draft logits from an oracle: along the reference continuation ``ref``
    (prompt excluded) it puts the reference's next token first (``right``) or rules it out (wrong);
    every other token gets random logits."""

    def __init__(self, head, options, ref: list[int], right: bool, seed: int) -> None:
        super().__init__(head, options)
        self.ref, self.right = ref + [EOT], right
        self.g = torch.Generator().manual_seed(seed)

    def _draft_logits(self, out, prefixes):
        rows = torch.randn(len(prefixes), VOCAB, generator=self.g)
        for i, prefix in enumerate(prefixes):
            n = len(prefix)
            if n < len(self.ref) and prefix == self.ref[:n]:
                rows[i, self.ref[n]] = 50.0 if self.right else float("-inf")
        return rows


def _decode(drafter, audio_seed: int, timestamps: bool, max_draft: int, max_new: int):
    rules = tiny_rules(timestamps)
    prompt = [SOT] + ([] if timestamps else [NO_TS])
    ref = greedy_decode(TARGET, window(TARGET, audio_seed), DecodeJob(prompt, rules, EOT, max_new, probe=Probe(0, 1)))
    out = speculative_decode(TARGET, window(TARGET, audio_seed),
                             DecodeJob(prompt, rules, EOT, max_new, probe=Probe(0, 1)), drafter(ref.tokens),
                             SpecOptions(max_draft=max_draft))
    assert out.tokens == ref.tokens
    assert out.finished == ref.finished
    assert out.sum_logprob == pytest.approx(ref.sum_logprob, abs=1e-3)
    assert out.probed == pytest.approx(ref.probed, abs=1e-5)
    return ref, out


TREES = st.builds(DynamicTreeOptions, depth=st.integers(1, 5), topk=st.integers(1, 4), total=st.integers(1, 16),
                  min_path=st.sampled_from([0.0, 0.05, 0.5]))


@examples(8)
@given(audio_seed=st.integers(0, 1000), head_seed=st.integers(0, 1000), timestamps=st.booleans(),
       max_draft=st.sampled_from([1, 3, 6, 10]), max_new=st.integers(1, 30), tree=TREES,
       draft_vocab=st.sampled_from([0, 12, 30]), oracle=st.sampled_from(["head", "right", "wrong"]))
def test_dynamic_tree_greedy_equals_greedy(audio_seed, head_seed, timestamps, max_draft, max_new, tree,
                                           draft_vocab, oracle):
    head = _head(head_seed, draft_vocab)

    def drafter(ref):
        if oracle == "head":
            return DynamicTreeDrafter(head, tree)
        return OracleTree(_head(head_seed), tree, ref, oracle == "right", head_seed)

    ref, out = _decode(drafter, audio_seed, timestamps, max_draft, max_new)
    steps = out.stats.verify_steps
    if oracle == "wrong":  # nothing is ever accepted: one target forward per token
        assert steps == ref.stats.verify_steps and out.stats.target_forwards == ref.stats.target_forwards
    if oracle == "right":  # every step accepts min(depth, nodes, tokens left) drafts, then one target token
        per_step = min(tree.depth, tree.total, max_draft) + 1
        assert steps <= math.ceil((out.stats.tokens) / per_step) + 1


def test_tree_mask_expands_siblings_and_chains_as_sequential_steps():
    """A masked forward of several tree nodes gives each node what stepping its own path alone gives."""
    head = _head(3).eval()
    d = head.cfg.d_model
    x0, a, b = torch.randn(1, 1, d), torch.randn(1, 1, d), torch.randn(1, 1, d)
    with torch.no_grad():
        cross = head.cross_kv(window(TARGET, 5).audio_features.clone())
        r0, k0, v0 = head.block(x0, None, cross)  # the root, unmasked single step
        ra, _, _ = head.block(a, (k0, v0), cross)  # path root -> a
        rb, kb, vb = head.block(b, (k0, v0), cross)  # path root -> b
        rc, _, _ = head.block(a, (torch.cat([k0, kb], 2), torch.cat([v0, vb], 2)), cross)  # root -> b -> a
        root, kr, vr = head.block(x0, None, cross, torch.ones(1, 1, 1, dtype=torch.bool))
        torch.testing.assert_close(root, r0)
        sib_mask = torch.tensor([[[True, True, False], [True, False, True]]])  # a and b, siblings
        sib, ks, vs = head.block(torch.cat([a, b], 1), (kr, vr), cross, sib_mask)
        deep_mask = torch.tensor([[[True, False, True, True]]])  # under b (slot 2) only, then itself
        deep, _, _ = head.block(a, (torch.cat([kr, ks], 2), torch.cat([vr, vs], 2)), cross, deep_mask)
    torch.testing.assert_close(sib[:, :1], ra, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sib[:, 1:], rb, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(deep, rc, atol=1e-5, rtol=1e-5)


def _request(state, tokens, plen, budget, hidden):
    def filt(logits, prefixes, vocab=None):
        return filter_logits(logits, prefixes, tiny_rules(False), vocab=vocab)

    return DraftRequest(tokens, plen, budget, state, hidden, filt, True)


def _first_request(audio_seed: int, budget: int):
    state = window(TARGET, audio_seed)
    prompt = [SOT, NO_TS]
    out = TARGET.score(state, torch.tensor([prompt[:-1]]))
    return state, _request(state, prompt, len(prompt), budget, out.hidden)


@pytest.mark.parametrize("draft_vocab", [0, 30])
def test_topk_one_is_the_greedy_chain_and_shapes_hold(draft_vocab):
    head = _head(7, draft_vocab)
    state, req = _first_request(9, 5)
    chain = EagleDrafter(head)
    chain.start(state, req.tokens)
    tree1 = DynamicTreeDrafter(head, DynamicTreeOptions(depth=5, topk=1, total=5))
    tree1.start(state, req.tokens)
    assert tree1.propose(req).tokens == chain.propose(req).tokens  # one node per level: the argmax chain
    opts = DynamicTreeOptions(depth=4, topk=3, total=9)
    wide = DynamicTreeDrafter(head, opts)
    wide.start(state, req.tokens)
    calls = []
    real = wide.head.block
    wide.head.block = lambda *a: calls.append(a[0].shape[1]) or real(*a)
    prop = wide.propose(_request(state, req.tokens, req.prompt_len, 20, req.hidden))
    assert calls == [1, 3, 3, 3]  # one head forward per level, topk nodes expanded together
    assert len(prop) == 9 and max(depths(prop.parents)) <= 4
    children = [prop.parents.count(i) for i in range(-1, len(prop))]
    assert max(children) <= 3
    # path probabilities: a child's never exceeds its parent's, and the first level holds the best tokens
    path = [c for c in prop.confidence]
    assert all(path[i] <= path[p] + 1e-9 for i, p in enumerate(prop.parents) if p >= 0)
    assert prop.tokens[0] == chain.propose(req).tokens[0]
    assert prop.q is None  # point masses: deterministic given the drafter's state
    assert len(wide.propose(_request(state, req.tokens, req.prompt_len, 4, req.hidden))) == 4  # budget caps total
    sure = DynamicTreeDrafter(head, DynamicTreeOptions(depth=4, topk=3, total=9, min_path=0.2))
    sure.start(state, req.tokens)
    pruned = sure.propose(_request(state, req.tokens, req.prompt_len, 20, req.hidden))
    assert 1 <= len(pruned) and all(c >= 0.2 for c in pruned.confidence[1:])  # the root's best child always stays
    assert pruned.tokens[0] == prop.tokens[0] and set(pruned.tokens) <= set(prop.tokens) | set(pruned.tokens[:1])


def test_dynamic_tree_needs_the_heads_cache_room():
    with pytest.raises(ValueError, match="cache slots"):
        DynamicTreeDrafter(_head(1), DynamicTreeOptions(depth=16, topk=8))
    with pytest.raises(ValueError):
        DynamicTreeOptions(topk=0)


def _path(prop, node: int) -> list[int]:
    return [prop.tokens[i] for i in path_to(prop.parents, node)]


def test_second_pass_drafts_on_from_each_alternative():
    """SpecASR's second pass: each alternative at a low-confidence position gets the drafter's own
    greedy continuation (the drafter's cache rolled back to the branch point), as a branch."""
    other = tiny_target(1, layers=1)
    opts = ModelDraftOptions(confidence_threshold=0.3, tree_topk=2, tree_threshold=0.999, branch_steps=2)
    rules, grown = tiny_rules(False), 0
    for audio_seed in range(4):
        drafter = ModelDrafter(other, opts)
        state, req = _first_request(audio_seed, 12)
        drafter.start(state, req.tokens)
        prop = drafter.propose(req)
        chain = next((i for i, p in enumerate(prop.parents) if p != i - 1), len(prop))
        assert chain < len(prop)  # alternatives were added
        for i in range(chain, len(prop)):
            if prop.parents[i] < chain:  # an alternative: a sibling of the chain's token there
                assert prop.tokens[i] != prop.tokens[prop.parents[i] + 1]
                continue
            grown += 1  # a continuation: the drafter's greedy token after its own path
            path = _path(prop, i)
            fresh = window(other, audio_seed)
            logits = other.score(fresh, torch.tensor([req.tokens + path[:-1]])).logits[0, -1]
            assert path[-1] == int(filter_logits(logits[None], [path[:-1]], rules).argmax())
        assert drafter.propose(req).tokens == prop.tokens  # rolled back and forth: the next proposal is the same
    assert grown > 0


def test_sampling_with_a_dynamic_tree_keeps_the_target_distribution():
    target = tiny_target(0, init_std=0.15)
    torch.manual_seed(2)
    head = SpeechDraftHead(EagleConfig.for_target(target, "tiny"), target)
    drafter = DynamicTreeDrafter(head, DynamicTreeOptions(depth=2, topk=3, total=6))
    _, p1, bound1 = assert_two_token_marginals(target, drafter, runs=600, max_draft=6)
    point = torch.zeros(VOCAB)
    point[int(p1.argmax())] = 1.0
    # every proposal is a point mass: a verifier that kept the draft would be this far away at least
    assert tv(p1, point) > 2 * bound1, "the target must not be near-deterministic for this test to have power"


def test_presets_validate_the_tree_keys():
    tree = load_preset("whisper-eagle-asr-tree")
    assert tree.draft.strategy == "dynamic-tree" and tree.draft.drafter == "eagle" and tree.draft.tree_depth >= 1
    assert load_preset("whisper-base-tinyen-sparse-tree").draft.branch_steps >= 1
    base = {"model": "whisper-base", "strategy": "dynamic-tree", "drafter": "eagle", "head": "whisper-base-eagle"}
    with pytest.raises(PresetError, match="unknown key"):
        preset_from_dict("x", {**base, "tree_width": 3})
    with pytest.raises(PresetError, match="dynamic-tree"):
        preset_from_dict("x", {**base, "tree_depth": 0})
    with pytest.raises(PresetError, match="draft-step cache"):
        preset_from_dict("x", {**base, "tree_depth": 12, "tree_topk": 4})
    with pytest.raises(PresetError, match="dynamic-tree"):
        preset_from_dict("x", {**base, "drafter": "cross-tokenizer", "head": "", "draft_model": "whisper-tiny.en"})
    with pytest.raises(PresetError, match="branch_steps"):
        preset_from_dict("x", {**base, "strategy": "sparse-tree", "branch_steps": -1})


@pytest.mark.slow
def test_real_weights_dynamic_tree_identical_to_ar(whisper_models):
    from specli.asr.strategies import build_decoder
    from test_real_speculative import _tokens

    # unpruned (the shipped preset drops nodes below path probability 0.2, and on this clip proposes chains;
    # test_real_speculative checks the shipped preset itself): every proposal is a full tree of max_draft nodes
    preset = load_preset("whisper-eagle-asr-tree").with_draft(confidence_threshold=0.0)
    model = whisper_models(preset.model)
    decode = build_decoder(preset, model, "en")
    trees = []
    real = decode.drafter.propose
    decode.drafter.propose = lambda req: (lambda p: trees.append(p) or p)(real(req))
    clip = EN_CLIPS[2]
    ref, _ = _tokens(model, clip)
    got, stats = _tokens(model, clip, decode)
    assert got == ref
    assert stats.target_forwards < stats.tokens  # drafts were accepted
    assert any(max(p.parents.count(i) for i in range(-1, len(p))) > 1 for p in trees if len(p))  # real trees
