"""Goodput for sparse-MoE targets (core/goodput.py MoECosts): a verification of n tokens reads every distinct
expert they route to, so the cost prior grows with the experts touched (expected under uniform routing, or what
the target's tally observed), longer drafts stop paying sooner than on a dense target, and the goodput presets of
an MoE audio LLM build that prior from the target itself (its sizes and its live tally) and stay lossless."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from transformers import Qwen3OmniMoeForConditionalGeneration

from qwen3_omni_fixtures import tiny_config, write_tiny_qwen3_omni
from specli.asr.strategies import DRAFT_COST_PRIOR, build_decoder, goodput_prior
from specli.core.drafters.llm.eagle3 import new_eagle3
from specli.core.drafters.llm.speculators import save_speculators
from specli.core.goodput import FixedCosts, GoodputController, MoECosts, MoEProfile, OnlineCosts
from specli.core.greedy import greedy_decode
from specli.core.speculative import speculative_decode
from specli.models.moe import ExpertTally
from specli.models.qwen3_omni.loader import load_qwen3_omni
from specli.presets import load_preset
from test_audio_llm_distill import _window
from toy_asr import load_toy_asr

DENSE = FixedCosts(draft_s=0.05, base=1.0, slope=0.08)
OMNI = MoEProfile(experts=128, top_k=8, layers=48, share=0.6)  # roughly the 30B-A3B thinker


@pytest.mark.parametrize("experts,top_k", [(8, 2), (128, 8), (64, 1)])
def test_touched_experts_match_uniform_routing(experts: int, top_k: int) -> None:
    p = MoEProfile(experts, top_k, 1, 0.5)
    rng = random.Random(0)
    for tokens in (1, 2, 5, 9):
        trials = [len({e for _ in range(tokens) for e in rng.sample(range(experts), top_k)}) for _ in range(4000)]
        assert p.touched(tokens) == pytest.approx(sum(trials) / len(trials), rel=0.02)
    assert p.touched(1) == pytest.approx(top_k) and p.touched(10_000) == pytest.approx(experts)


def test_profile_is_validated() -> None:
    with pytest.raises(ValueError):
        MoEProfile(8, 9, 1, 0.5)
    with pytest.raises(ValueError):
        MoEProfile(8, 2, 1, 1.5)


def test_moe_verification_costs_grow_with_the_experts_touched() -> None:
    costs = MoECosts(DENSE, OMNI)
    assert costs.verify(1, 1) == pytest.approx(DENSE.verify(1, 1))  # one token reads top_k experts: no change
    assert costs.draft() == DENSE.draft()
    for n in (2, 4, 8):
        want = 0.4 * DENSE.verify(1, n) + 0.6 * OMNI.touched(n) / 8
        assert costs.verify(1, n) == pytest.approx(want)
        assert costs.verify(1, n) > DENSE.verify(1, n)
    assert costs.verify(1, 8) > 4 * costs.verify(1, 1)  # 8 tokens touch ~52 of 128 experts a layer


def test_observed_experts_replace_the_uniform_guess() -> None:
    tally = ExpertTally()
    tally.add(1, 5, 2 * 48 * 12)  # two forwards of 5 tokens, 12 experts a layer each (correlated routing)
    tally.add(1, 5, 0)
    costs = MoECosts(DENSE, OMNI, observed=lambda n: tally.layer_mean(n, OMNI.layers))
    assert tally.layer_mean(5, 48) == 12 and tally.layer_mean(3, 48) is None
    assert costs.experts(5) == 12 and costs.experts(3) == pytest.approx(OMNI.touched(3))
    assert costs.verify(1, 5) == pytest.approx(0.4 * DENSE.verify(1, 5) + 0.6 * 12 / 8)


def _chosen_length(costs, confidence: float, cap: int = 12) -> int:
    ctrl = GoodputController(costs)
    drafted: list[float] = []
    while len(drafted) < cap and ctrl.keep_drafting(drafted):
        drafted.append(confidence)
    return len(drafted)


@pytest.mark.parametrize("confidence", [0.6, 0.8, 0.9, 0.97])
def test_moe_drafts_are_shorter_than_dense_ones(confidence: float) -> None:
    dense, moe = _chosen_length(DENSE, confidence), _chosen_length(MoECosts(DENSE, OMNI), confidence)
    assert moe <= dense
    if confidence <= 0.9:
        assert moe < dense


def test_online_costs_scale_unseen_moe_shapes_by_the_prior() -> None:
    costs = OnlineCosts(MoECosts(DENSE, OMNI))
    costs.record_verify(1, 1, 0.2)
    assert costs.verify(1, 5) == pytest.approx(0.2 * MoECosts(DENSE, OMNI).verify(1, 5))


def test_tiny_omni_profile_counts_its_weights(tmp_path) -> None:

    model = load_qwen3_omni(str(write_tiny_qwen3_omni(tmp_path / "omni")), "float32")
    profile = model.target.moe_profile()
    text = tiny_config().thinker_config.text_config
    assert (profile.experts, profile.top_k, profile.layers) == (8, 2, 2)  # layer 1 is dense (mlp_only_layers)
    # the weights one token reads: counted from transformers' own module, not from specli's sizes
    hf = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(tmp_path / "omni")).thinker
    experts = sum(p.numel() for n, p in hf.model.language_model.named_parameters() if ".experts." in n)
    active = experts // text.num_experts * text.num_experts_per_tok
    other = sum(p.numel() for n, p in hf.model.language_model.named_parameters()
                if n.startswith("layers.") and ".experts." not in n and "norm" not in n) + hf.lm_head.weight.numel()
    assert profile.share == pytest.approx(active / (active + other))
    # the goodput presets' prior is built from it and reads the target's live tally
    prior = goodput_prior(model.target)
    assert isinstance(prior, MoECosts) and prior.profile == profile
    model.target.experts.reset()
    model.target.experts.add(1, 3, 2 * 5)
    assert prior.experts(3) == 5
    assert goodput_prior(load_toy_asr("toy-0").target) is DRAFT_COST_PRIOR  # a dense target: the plain prior


def test_goodput_preset_on_the_tiny_moe_is_lossless(tmp_path) -> None:

    model = load_qwen3_omni(str(write_tiny_qwen3_omni(tmp_path / "omni")), "float32")
    ids, convention = model.target.draft_recipe.aux_layers("eagle3", model.target.dims.layers)
    torch.manual_seed(0)
    save_speculators(new_eagle3(model.target.draft_parts(), 5, aux_layers=ids, convention=convention),
                     tmp_path / "qwen3-omni-eagle3")
    preset = replace(load_preset("qwen3-omni-eagle3"), dtype="float32").with_draft(
        draft_dir=str(tmp_path / "qwen3-omni-eagle3"), draft_length="goodput")
    method = build_decoder(preset, model)
    assert isinstance(method.spec.costs, OnlineCosts) and isinstance(method.spec.costs.prior, MoECosts)
    for i, seconds, max_new in ((0, None, 40), (1, 2.0, 12), (2, 0.5, 30)):
        job, state = _window(model, i, seconds, max_new)
        ref = greedy_decode(model.target, state, job)
        state.cache.crop(0)
        out = speculative_decode(model.target, state, job, method.drafter, method.spec)
        assert out.tokens == ref.tokens and out.finished == ref.finished
