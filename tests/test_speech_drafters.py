"""DSpark, DFlash and EAGLE-3 drafters: lossless in every strategy and sampler, and trainable as specified.

* Greedy: on tiny random CosyVoice2/3 targets, every drafter in every strategy (chain, adaptive,
  sparse tree, recycling) gives the AR tokens; drafters restricted to a small draft vocabulary (the
  tokens of the AR output) get drafts accepted, so acceptance and tree paths run.
* Sampling: on F2's toy trigram target (``speech_toy.TableTarget``, wrapped to return its one-hot
  state as three auxiliary layers), the first three tokens of 600 speculative decodes stay within
  ``test_synthesis_exactness.bound`` (TV, delta 1e-6) of the enumerated joint distribution, for the
  ``ras`` and ``vllm`` samplers, chains, sparse trees and adaptive truncation; the same bound catches
  a verifier that resamples from p instead of the residual with these drafters (power). 600 runs detect a
  distortion of TV 0.34 (ras) / 0.42 (vllm) with power 0.99 (``tse.detectable``); the subtler verifier bugs
  (0.26-0.31 from P) are test_synthesis_exactness's, whose 1000 runs are sized for them.
* The training forward (what ``distill train`` optimises) gives exactly the distributions the
  inference path drafts from (teacher-forced on the drafts themselves).
"""

from __future__ import annotations

import pytest
import torch

import test_synthesis_exactness as tse
from cosyvoice_fixtures import write_checkpoint
from speech_toy import EOS, NEVER, V, TableTarget
from specli.core.drafters.base import Drafter, DraftRequest
from specli.core.drafters.llm.dflash import BlockDrafter, new_dflash
from specli.core.drafters.llm.dspark import new_dspark
from specli.core.drafters.llm.eagle3 import Eagle3Drafter, new_eagle3
from specli.core.drafters.llm.base import TargetParts, attach_aux_layers
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob
from specli.core.sampling import SamplerOptions, build_sampler
from specli.core.speculative import SpecOptions, speculative_decode
from specli.core.drafters.llm.loading import SpeechDraftOptions, wrap
from specli.models.cosyvoice.lm import load_cosyvoice
from specli.core.types import HiddenStates, ScoreOutput
from specli.core.verify import reference

KINDS = ("dspark", "dflash", "eagle3")
STRATEGIES = ("chain", "adaptive", "sparse-tree", "dynamic-tree", "recycling")


def make_module(kind: str, parts: TargetParts, vocab_ids=None, seed: int = 0, aux=None, convention=None, layers=2):
    kw = {"draft_vocab_ids": vocab_ids, "seed": seed}
    if aux is not None:
        kw.update(aux_layers=aux, convention=convention)
    if kind == "dspark":
        return new_dspark(parts, layers=layers, block_size=4, markov_rank=8, **kw)
    if kind == "dflash":
        return new_dflash(parts, layers=layers, block_size=4, **kw)
    return new_eagle3(parts, unroll=3, **kw)


# -- tiny CosyVoice targets: greedy exactness ---------------------------------------------------------

@pytest.fixture(scope="module", params=["cosyvoice2", "cosyvoice3"])
def cv(request, tmp_path_factory):
    model = load_cosyvoice(str(write_checkpoint(tmp_path_factory.mktemp(request.param) / "ckpt", request.param,
                                                seed=5)))
    spec = model.spec
    rules, params = build_sampler(SamplerOptions("greedy"), stop_ids=list(spec.stop_ids),
                                  min_len_mask_id=spec.min_length_mask_id, min_len=4, stop_into=spec.eos)
    prompts = [model.lm.layout.prompt([5 + i, 9, 30 + i], [], [1 + i, 2, 3]) for i in range(2)]
    return model, rules, params, prompts


def _decode(model, rules, params, prompt, drafter=None, max_draft=6, n=40):
    lm, spec = model.lm, model.spec
    state = lm.start(len(prompt) + n + 2)
    if drafter is None:
        return greedy_decode(lm, state, DecodeJob(prompt, rules, spec.eos, n, sampling=params))
    return speculative_decode(lm, state, DecodeJob(prompt, rules, spec.eos, n, sampling=params), drafter,
                              SpecOptions(max_draft=max_draft))


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_is_token_identical_in_every_strategy(cv, kind):
    model, rules, params, prompts = cv
    lm = model.lm
    lm.qwen.aux_layers = ()
    parts = lm.draft_parts()
    plain = [_decode(model, rules, params, p) for p in prompts]
    vocab = torch.tensor(sorted({t for r in plain for t in r.tokens} | {model.spec.eos}))
    accepted = 0
    for full_vocab in (True, False):
        module = make_module(kind, parts, None if full_vocab else vocab, seed=1)
        attach_aux_layers(lm, module.config)
        for strategy in STRATEGIES:
            opts = SpeechDraftOptions(strategy, confidence_threshold=0.5, tree_topk=2, tree_threshold=0.9,
                                      tree_depth=3)
            for p, ref in zip(prompts, plain):
                res = _decode(model, rules, params, p, wrap(module, opts))
                assert res.tokens == ref.tokens and res.finished == ref.finished, (kind, strategy, full_vocab)
                accepted += res.stats.accepted
        lm.qwen.aux_layers = ()
    assert accepted > 0  # the small draft vocabulary gets drafts accepted: acceptance paths ran


class Recording(Drafter):
    """A drafter that records the tokens (and parents) of every proposal of the drafter it wraps."""

    def __init__(self, inner) -> None:
        self.inner, self.proposals, self.parents = inner, [], []

    def start(self, state, prompt) -> None:
        self.inner.start(state, prompt)

    def propose(self, request):
        proposal = self.inner.propose(request)
        self.proposals.append(list(proposal.tokens))
        self.parents.append(list(proposal.parents))
        return proposal

    def commit(self, tokens) -> None:
        self.inner.commit(tokens)


@pytest.mark.parametrize("kind", KINDS)
def test_a_one_wide_dynamic_tree_is_the_chain(cv, kind):
    """A dynamic tree expanding one node a level proposes exactly the chain (its levels read the slots the chain
    drafts from: DSpark's Markov table rows equal the per-token Markov bias; EAGLE-3's rows see their ancestors
    under the tree mask as the chain's steps see the cache); a wider tree branches."""
    model, rules, params, prompts = cv
    lm = model.lm
    lm.qwen.aux_layers = ()
    plain = [_decode(model, rules, params, p) for p in prompts]
    vocab = torch.tensor(sorted({t for r in plain for t in r.tokens} | {model.spec.eos}))
    module = make_module(kind, lm.draft_parts(), vocab, seed=1)
    attach_aux_layers(lm, module.config)
    try:
        if kind == "dspark":
            prev = torch.tensor([0, 3, int(vocab[-1]), lm.vocab - 1, lm.vocab + 5])  # the last: past the vocabulary
            base = torch.randn(4, module.config.draft_vocab)
            direct = module.slot_rows(base, 2, prev)
            assert torch.allclose(module.slot_rows(base, 2, prev, module.slot_table()), direct, atol=1e-5)
            assert torch.allclose(direct[1], module.slot_logits(base, base, 2, 3), atol=1e-6)
        for p, ref in zip(prompts, plain):
            runs = {}
            for name, opts in (("chain", SpeechDraftOptions("chain")),
                               ("tree1", SpeechDraftOptions("dynamic-tree", tree_topk=1, tree_depth=8)),
                               ("tree3", SpeechDraftOptions("dynamic-tree", tree_topk=3, tree_depth=8)),
                               ("widest", SpeechDraftOptions("dynamic-tree", tree_topk=8, tree_depth=16))):
                runs[name] = Recording(wrap(module, opts))
                res = _decode(model, rules, params, p, runs[name])
                assert res.tokens == ref.tokens, (kind, name)
            assert runs["tree1"].proposals == runs["chain"].proposals
            assert all(ps == list(range(-1, len(ps) - 1)) for ps in runs["chain"].parents)
            assert any(ps != list(range(-1, len(ps) - 1)) for ps in runs["tree3"].parents)  # it branches
    finally:
        lm.qwen.aux_layers = ()


def test_aux_layer_conventions_read_the_same_states(cv):
    """Output convention id i is input convention id i + 1: both drafters see identical features."""
    model, rules, params, prompts = cv
    lm = model.lm
    parts = lm.draft_parts()
    outs = []
    for aux, conv in (((0, 1), "output"), ((1, 2), "input")):
        lm.qwen.aux_layers = ()
        module = new_dflash(parts, layers=1, block_size=4, aux_layers=aux, convention=conv, seed=3)
        attach_aux_layers(lm, module.config)
        assert lm.qwen.aux_layers == (1, 2)
        outs.append(_decode(model, rules, params, prompts[0], wrap(module), n=12).stats.accepted)
    # a target already serving another drafter returns the union; each drafter picks its own layers by id
    lm.qwen.aux_layers = (0, 2)
    module = new_dflash(parts, layers=1, block_size=4, aux_layers=(1, 2), convention="input", seed=3)
    attach_aux_layers(lm, module.config)
    assert lm.qwen.aux_layers == (0, 2, 1)
    outs.append(_decode(model, rules, params, prompts[0], wrap(module), n=12).stats.accepted)
    lm.qwen.aux_layers = ()
    assert outs[0] == outs[1] == outs[2]


# -- the training forward matches the inference path ---------------------------------------------------

def _identity_filter(logits, prefixes):
    return logits


@pytest.mark.parametrize("kind", KINDS)
def test_training_forward_gives_the_drafted_distributions(cv, kind):
    model, rules, params, prompts = cv
    lm = model.lm
    lm.qwen.aux_layers = ()
    parts = lm.draft_parts()
    module = make_module(kind, parts, seed=2)
    attach_aux_layers(lm, module.config)
    seq = prompts[0] + _decode(model, rules, params, prompts[0], n=12).tokens
    anchor = len(seq) - 4
    state = lm.start(len(seq) + 16)
    hidden = lm.score(state, torch.tensor([seq[:anchor]])).hidden
    drafter = Eagle3Drafter(module) if kind == "eagle3" else BlockDrafter(module)
    drafter.start(state, seq[: anchor + 1])
    req = DraftRequest(seq[: anchor + 1], len(prompts[0]), 3, state, hidden, _identity_filter, False,
                       torch.Generator().manual_seed(0))
    prop = drafter.propose(req)
    assert len(prop) == 3 and prop.q is not None
    ids = torch.tensor([seq[: anchor + 1] + prop.tokens])
    ctx = torch.cat(lm.score(lm.start(ids.shape[1] + 1), ids).hidden.aux, -1)
    out = module.forward_train(ctx, ids, torch.tensor([[anchor]]))
    first = 0 if kind != "dflash" else 1
    rows = out.logits[0, anchor if kind == "eagle3" else 0, first : first + 3]
    q = module.scatter_full(rows).softmax(-1)
    torch.testing.assert_close(q, prop.q, atol=2e-5, rtol=1e-4)
    expect = [anchor + 1 + k for k in range(3)]
    assert out.positions[0, anchor if kind == "eagle3" else 0, first : first + 3].tolist() == expect
    lm.qwen.aux_layers = ()


# -- sampling: within the TV bound of plain sampling (F2's machinery) --------------------------------

class AuxTableTarget(TableTarget):
    """The toy trigram target, returning its one-hot state as three auxiliary layers (ids 0, 1, 2)."""

    def score(self, state, tokens, positions=None, tree_mask=None, logit_rows=None) -> ScoreOutput:
        out = super().score(state, tokens, positions, tree_mask, logit_rows)
        h = out.hidden.last
        return ScoreOutput(out.logits, HiddenStates(h, h, h, (h, h, h), (0, 1, 2)))


def toy_parts(seed: int = 0, sharpness: float = 2.0) -> TargetParts:
    """Toy parts; ``sharpness`` 0: a state-blind head peaked on the target's average row."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(V, V, generator=g)
    bias = None if sharpness else tse.TARGET.table[:, :, :NEVER].mean((0, 1)) * 6.0
    bias = None if bias is None else torch.cat([bias, bias.new_full((V - NEVER,), -30.0)])
    return TargetParts(hidden=V, layers=4, vocab=V, embed=lambda ids: table[ids],
                       head_weight=torch.randn(V, V, generator=g) * sharpness, head_bias=bias, heads=2, kv_heads=1,
                       head_dim=4, intermediate=16, rms_eps=1e-6, rope_theta=10000.0, max_positions=64,
                       mask_token_id=NEVER, device=torch.device("cpu"))


def toy_drafter(kind: str, strategy: str, sharpness: float = 2.0):
    module = make_module(kind, toy_parts(sharpness=sharpness), seed=4, aux=(0, 1, 2), convention="input", layers=1)
    if kind == "dspark":  # a confidence head that stops some chains early (adaptive)
        with torch.no_grad():
            module.confidence_head.proj.bias.fill_(0.5)
    return wrap(module, SpeechDraftOptions(strategy, confidence_threshold=0.5, tree_topk=2, tree_threshold=0.8))


CASES = [(s, k, t) for s in ("ras", "vllm") for k in KINDS for t in ("chain", "sparse-tree")]
CASES += [("ras", "dspark", "adaptive"), ("vllm", "eagle3", "adaptive")]
CASES += [(s, k, "dynamic-tree") for s in ("ras", "vllm") for k in KINDS]
RUNS = 600  # per case: detects TV 0.34 (ras) / 0.42 (vllm) with power 0.99; the power check uses F2's 1000


@pytest.mark.parametrize("sampler,kind,strategy", CASES)
def test_sampling_stays_within_the_tv_bound(monkeypatch, sampler, kind, strategy):
    monkeypatch.setattr(tse, "TARGET", AuxTableTarget(tse.TARGET.table))
    sampling = tse.SAMPLERS[sampler]
    p = tse.exact_joint(tse.TARGET, sampling)
    counts = tse.spec_counts(sampling, toy_drafter(kind, strategy), runs=RUNS)
    assert tse.tv(counts, p) < tse.bound(p, RUNS), (sampler, kind, strategy)


@pytest.mark.parametrize("kind", ["dspark"])
def test_a_verifier_that_resamples_from_p_fails_the_bound(monkeypatch, kind):
    monkeypatch.setattr(tse, "TARGET", AuxTableTarget(tse.TARGET.table))
    monkeypatch.setattr(reference, "_residual", lambda p, q_row, token: p)
    sampling = tse.SAMPLERS["ras"]
    p = tse.exact_joint(tse.TARGET, sampling)
    counts = tse.spec_counts(sampling, toy_drafter(kind, "chain", sharpness=0.0))  # q peaked on a likely token
    assert tse.tv(counts, p) > tse.bound(p, tse.RUNS)


def test_toy_greedy_with_adaptive_truncation_equals_ar():
    sampling = tse.SAMPLERS["greedy"]
    for seed in range(4):
        target = AuxTableTarget(tse.random_table(20 + seed, scale=1.0, eos_bias=-1.0))
        prompt = [seed % 5, 2]
        plain = greedy_decode(target, target.start(), DecodeJob(prompt, sampling.rules, EOS, 12))
        for kind in KINDS:
            for strategy in STRATEGIES:
                spec = speculative_decode(target, target.start(),
                                          DecodeJob(prompt, sampling.rules, EOS, 12, sampling=sampling.params),
                                          toy_drafter(kind, strategy), SpecOptions(max_draft=4))
                assert spec.tokens == plain.tokens, (kind, strategy)


@pytest.mark.parametrize("kind", KINDS)
def test_training_updates_only_the_drafters_own_weights(kind):
    """The target's embedding and head rows are frozen buffers; a loss reaches every trainable tensor."""
    module = make_module(kind, toy_parts(), seed=4, aux=(0, 1, 2), convention="input", layers=1)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 5, (2, 9), generator=g)
    ctx = torch.randn(2, 9, 3 * V, generator=g)
    out = module.forward_train(ctx, ids, torch.tensor([[1, 4], [0, 3]]))
    valid = out.positions >= 0
    labels = module.to_draft_rows(ids.gather(1, out.positions.clamp(min=0).flatten(1)).view_as(out.positions))
    loss = torch.nn.functional.cross_entropy(out.logits[valid], labels[valid])
    if out.confidence is not None:
        loss = loss + out.confidence.sigmoid().mean()
    loss.backward()
    assert not module.head_w.requires_grad and "head_w" not in dict(module.named_parameters())
    missing = [n for n, p in module.named_parameters() if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    assert not missing


def test_drafter_presets():
    from specli.errors import PresetError
    from specli.presets.synthesis import load_synthesis_preset, synthesis_preset_from_dict

    for name in ("cosyvoice3-dspark", "cosyvoice3-dflash", "cosyvoice2-dspark", "cosyvoice2-eagle3",
                 "cosyvoice3-dspark-adaptive"):
        preset = load_synthesis_preset(name)
        assert preset.draft.drafter in KINDS and preset.draft.draft_dir and preset.draft.strategy != "ar"
    with pytest.raises(PresetError, match="needs a dspark"):
        synthesis_preset_from_dict("x", {"model": "cosyvoice3", "strategy": "adaptive",
                                         "drafter": "pool"})
    with pytest.raises(PresetError, match="needs draft_dir"):
        synthesis_preset_from_dict("x", {"model": "cosyvoice3", "strategy": "chain",
                                         "drafter": "dflash"})
    for bad in ({"tree_topk": 0}, {"tree_topk": 9}, {"tree_depth": 0}):
        with pytest.raises(PresetError, match="dynamic-tree"):
            synthesis_preset_from_dict("x", {"model": "cosyvoice3", "strategy": "dynamic-tree", "drafter": "dspark",
                                             "draft_dir": "d", **bad})
    with pytest.raises(PresetError, match="max_draft_rows"):
        synthesis_preset_from_dict("x", {"model": "cosyvoice3", "max_draft_rows": -1})


@pytest.mark.parametrize("kind", KINDS)
def test_a_plain_qwen2_target_works_too(kind):
    """Target-neutral: the same drafters over a plain Hugging Face-shaped Qwen2 decoder (token-id inputs)."""
    from specli.core.logits import GREEDY
    from test_qwen2_target import _tiny

    _, target = _tiny(seed=2)
    target.aux_layers = ()
    module = make_module(kind, target.draft_parts(), seed=5)
    attach_aux_layers(target, module.config)

    def rules(logits, prefixes):
        return logits

    prompt = [5, 17, 33, 2]
    plain = greedy_decode(target, target.start(40), DecodeJob(prompt, rules, 96, 24, sampling=GREEDY))
    for strategy in STRATEGIES:
        drafter = wrap(module, SpeechDraftOptions(strategy, confidence_threshold=0.4, tree_topk=2, tree_threshold=0.9))
        spec = speculative_decode(target, target.start(40), DecodeJob(prompt, rules, 96, 24, sampling=GREEDY), drafter,
                                  SpecOptions(max_draft=6))
        assert spec.tokens == plain.tokens, strategy
