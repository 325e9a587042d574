"""Speculative synthesis on the shipped voice specli-en (real weights, held-out sentences): greedy speculative
decoding gives AR's speech tokens, token for token, whatever the drafter proposes. Drafters: the DFlash drafter shipped
beside the voice (preset specli-en-dflash: dynamic trees; also as a chain and adaptive, and batched), one that replays
AR's own tokens (always right: every step accepts the whole chain and takes the bonus token), one that proposes a wrong
token at every position (always wrong: every step is the target's own token), freshly initialised DSpark (chain,
adaptive, dynamic tree), DFlash and EAGLE-3 (chain, dynamic tree) modules on the voice's LM (mostly wrong, through the real
draft-model code), and the n-gram pool."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

import test_synthesis_exactness as tse

from specli.core.drafters.base import EMPTY, Drafter, DraftProposal, DraftRequest
from specli.core.logits import filter_logits
from specli.core.speculative import SpecOptions, speculative_decode
from specli.core.verify import reference as verify_reference
from specli.core.drafters.llm.speculators import save_speculators
from specli.core.tree import chain_parents
from specli.models.cosyvoice.lm import CosyVoiceModel, load_cosyvoice
from specli.presets.synthesis import load_synthesis_preset, synthesis_preset_from_dict
from specli.tts.synthesis import PresetOverrides, SynthesisRequest, build_synthesizer, prepare
from test_speech_drafters import make_module
from test_voice_roundtrip import corpus_split

# Ten short held-out sentences (never trained on: test_they_are_held_out; the rule that picked them: the
# first held-out sentences in sha1 order of 5-7 words made only of letters, spaces, commas and full stops).
SENTENCES = ("Political speeches are like steer horns.", "Well begun is half done.", "So she moved to Atlanta.",
             "Driver does not carry cash.", "You have taken yourself too seriously.",
             "God is real, unless declared integer.", "Children should be seen and not heard.",
             "Every living thing wants to survive.", "Mouse clicks numb the fingers.",
             "It was never like this for Mencken.")
REQUESTS = [SynthesisRequest(f"s{i}", text) for i, text in enumerate(SENTENCES)]
# The sampled-distribution check on the real voice: the number of decodes comes from the distortion it must
# detect (TV DISTANCE from the exact first-token distribution, with probability POWER: tse.runs_for; 305 (ras) and
# 352 (vllm) on this voice's first sentence, whose first-token distributions have 10 and 15 tokens, the largest
# 0.22 and 0.20; 303 and 349 with the LM before); the broken-verifier power check keeps its POWER_RUNS.
DISTANCE, POWER, POWER_RUNS = 0.4, 0.99, 200


class ReplayDrafter(Drafter):
    """Proposes AR's next tokens (``wrong``: each shifted by one, never AR's token) for the decode whose prompt
    it knows; the reference is keyed by prompt."""

    def __init__(self, reference: dict[tuple[int, ...], list[int]], vocab: int, wrong: bool) -> None:
        self.reference, self.vocab, self.wrong = reference, vocab, wrong
        self.proposed = 0  # draft tokens proposed (the test checks the path ran)

    def start(self, state, prompt: list[int]) -> None:
        pass

    def propose(self, request: DraftRequest) -> DraftProposal:
        ref = self.reference[tuple(request.tokens[: request.prompt_len])]
        done = len(request.tokens) - request.prompt_len  # sampled tokens, the pending one included
        chain = ref[done: done + request.budget]
        if self.wrong:
            chain = [(t + 1) % self.vocab for t in chain]
        self.proposed += len(chain)
        return DraftProposal(chain, chain_parents(len(chain)), [1.0] * len(chain)) if chain else EMPTY

    def commit(self, tokens: list[int]) -> None:
        pass


def test_they_are_held_out() -> None:
    for text in SENTENCES:
        assert corpus_split(text) == "heldout", text


@pytest.fixture(scope="module")
def voice() -> CosyVoiceModel:
    return load_cosyvoice("specli-en")


@pytest.fixture(scope="module")
def reference(voice: CosyVoiceModel) -> dict[str, list[int]]:
    synth = build_synthesizer(load_synthesis_preset("specli-en-ar"), voice)
    return {r.id: list(synth.synthesize(r).tokens) for r in REQUESTS}


@pytest.mark.parametrize("wrong", [False, True], ids=["always-right", "always-wrong"])
def test_replayed_drafts_give_the_ar_tokens(voice: CosyVoiceModel, reference: dict[str, list[int]],
                                            wrong: bool) -> None:
    prompts = {tuple(prepare(voice, r).prompt): reference[r.id] for r in REQUESTS}
    synth = build_synthesizer(load_synthesis_preset("specli-en-ar"), voice)
    synth.drafter = ReplayDrafter(prompts, voice.lm.vocab, wrong)
    for r in REQUESTS:
        res = synth.synthesize(r)
        assert list(res.tokens) == reference[r.id], r.text
        stats = res.stats
        if wrong:
            assert stats.accepted == 0 and stats.drafted > 0
        else:  # whole chains accepted: far fewer target forwards than tokens
            assert stats.accepted == stats.drafted > 0
            assert stats.target_forwards * 3 < len(res.tokens) + 3
    assert synth.drafter.proposed > 0


TREE = {"model": "specli-en", "sampler": "greedy", "strategy": "dynamic-tree", "drafter": "dspark", "draft_dir": "x",
        "tree_topk": 4, "tree_depth": 4, "max_draft": 16}


@pytest.mark.parametrize("preset,kind", [("cosyvoice3-dspark", "dspark"), ("cosyvoice3-dspark-adaptive", "dspark"),
                                         ("cosyvoice3-eagle3", "eagle3"), ("dynamic-tree", "dspark"),
                                         ("dynamic-tree", "dflash"), ("dynamic-tree", "eagle3")])
def test_fresh_draft_models_give_the_ar_tokens(voice: CosyVoiceModel, reference: dict[str, list[int]],
                                               tmp_path: Path, preset: str, kind: str) -> None:
    draft = save_speculators(make_module(kind, voice.lm.draft_parts(), seed=2, layers=1), tmp_path / kind)
    loaded = (synthesis_preset_from_dict("tree", {**TREE, "drafter": kind}) if preset == "dynamic-tree"
              else load_synthesis_preset(preset))
    synth = build_synthesizer(loaded, voice, PresetOverrides(draft=str(draft), sampler="greedy"))
    for r in REQUESTS:
        res = synth.synthesize(r)
        assert list(res.tokens) == reference[r.id], (preset, r.text)
        assert res.stats.drafted > 0


def test_the_shipped_drafter_gives_the_ar_tokens(voice: CosyVoiceModel, reference: dict[str, list[int]]) -> None:
    """specli-en-dflash: the DFlash drafter shipped beside the voice, in dynamic trees (and as a chain, adaptive)."""
    preset = load_synthesis_preset("specli-en-dflash")
    for strategy in ("dynamic-tree", "chain", "adaptive"):
        synth = build_synthesizer(preset.with_draft(strategy=strategy), voice)
        accepted = 0
        for r in REQUESTS:
            res = synth.synthesize(r)
            assert list(res.tokens) == reference[r.id], (strategy, r.text)
            accepted += res.stats.accepted
        assert accepted > 0, strategy  # a trained drafter: drafts are accepted
    batched = build_synthesizer(preset.with_draft(max_draft_rows=0), voice)  # every row drafts
    for i, res in batched.synthesize_batch(REQUESTS, 3):
        assert list(res.tokens) == reference[REQUESTS[i].id]


def test_the_pool_gives_the_ar_tokens(voice: CosyVoiceModel, reference: dict[str, list[int]]) -> None:
    synth = build_synthesizer(load_synthesis_preset("cosyvoice3-pool"), voice, PresetOverrides(sampler="greedy"))
    for r in REQUESTS * 2:  # the second pass drafts from the first's tokens
        assert list(synth.synthesize(r).tokens) == reference[r.id], r.text


def _first_tokens(voice: CosyVoiceModel, synth, request: SynthesisRequest, runs: int) -> torch.Tensor:
    """Counts ``[V]`` of the first speech token over ``runs`` speculative decodes of ``request`` (4 tokens each: the
    first step verifies a 3-node draft tree), each with its own generator."""
    prep = prepare(voice, request)
    counts = torch.zeros(voice.lm.vocab, dtype=torch.float64)
    for i in range(runs):
        job = replace(synth._job(request, prep, voice.lm.qwen.device), max_new_tokens=4,
                      generator=torch.Generator().manual_seed(1000 + i))
        res = speculative_decode(voice.lm, voice.lm.start(len(prep.prompt) + 6), job, synth.drafter,
                                 SpecOptions(max_draft=synth.options.draft.max_draft))
        counts[res.tokens[0] if res.tokens else job.eot] += 1
    return counts


def _first_token_p(voice: CosyVoiceModel, synth, request: SynthesisRequest) -> torch.Tensor:
    """The exact distribution ``[V]`` plain sampling draws the first speech token from."""
    prep = prepare(voice, request)
    job = synth._job(request, prep, voice.lm.qwen.device)
    logits = voice.lm.score(voice.lm.start(len(prep.prompt) + 1), torch.tensor([list(prep.prompt)])).logits[0, -1:]
    return filter_logits(logits, [[]], job.rules, job.sampling).double().softmax(-1)[0]


@pytest.mark.parametrize("sampler", ["ras", "vllm"])
def test_the_shipped_drafter_keeps_the_sampled_distribution(voice: CosyVoiceModel, monkeypatch,
                                                            sampler: str) -> None:
    """Sampling through the shipped drafter's trees (sibling-wise rejection of point-mass nodes): the first speech
    token stays within the TV bound of the target's exact distribution (delta 1e-6). The decodes are as many as
    detect a distortion of TV 0.4 with power 0.99 (tse.runs_for: 305 / 352, bound 0.23; the 600 before detected
    0.28 / 0.31). This test is the integration of the shipped drafter, the voice and its samplers, whose faults
    move the distribution grossly: a verifier that accepts every draft fails the bound at 200 decodes (power, as
    before). The verifier's subtler faults are the toy targets' (test_synthesis_exactness, test_speech_drafters:
    0.26-0.31 there, detected at 1000 decodes); resampling from p instead of the residual moves this voice's
    first token by ~0.18, which even 600 decodes did not detect."""
    synth = build_synthesizer(load_synthesis_preset("specli-en-dflash"), voice, PresetOverrides(sampler=sampler))
    request = REQUESTS[0]
    p = _first_token_p(voice, synth, request)
    assert int((p > 0).sum()) > 3  # a real choice: the check has something to get wrong
    runs = tse.runs_for(p, DISTANCE, POWER)
    counts = _first_tokens(voice, synth, request, runs)
    assert tse.tv(counts, p) < tse.bound(p, runs), (sampler, runs, tse.tv(counts, p), tse.bound(p, runs))
    monkeypatch.setattr(verify_reference, "_accepts", lambda p_row, q_row, token, u: True)
    few = POWER_RUNS
    assert tse.tv(_first_tokens(voice, synth, request, few), p) > tse.bound(p, few), sampler
