"""Ragged batched decoding on decoder-only targets (Qwen2, the CosyVoice speech-token LM).

Rows have prompts of different lengths (a ragged prefill into each slot, per-row RoPE positions),
their own rules (CosyVoice: the min-length mask of each request's text length) and limits; batched
greedy equals batch-1 greedy decoding row for row, and batched speculative greedy equals batched AR.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import examples
from transformers import Qwen2ForCausalLM

from cosyvoice_fixtures import qwen_config, write_checkpoint
from specli.core.batched import RowJob, decode_all
from specli.core.drafters.base import Drafter, DraftProposal
from specli.core.drafters.batched import PerRowDrafters
from specli.core.drafters.ngram import NgramDrafter, NgramPool
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob
from specli.core.sampling import SamplerOptions, build_sampler
from specli.core.speculative import SpecOptions
from specli.tts.synthesis import SynthesisOptions, SynthesisRequest, Synthesizer, prepare
from specli.models.cosyvoice.lm import load_cosyvoice
from specli.models.qwen2 import Qwen2Dims, Qwen2Target

EOS = 3
MAX_LEN = 64


def _qwen() -> Qwen2Target:
    torch.manual_seed(0)
    cfg = qwen_config()
    ref = Qwen2ForCausalLM(cfg)
    weights = {k: (v.normal_(0, 0.3) if v.dim() == 2 else v.clone()) for k, v in ref.state_dict().items()}
    return Qwen2Target(Qwen2Dims.from_hf_config(cfg.to_dict()), weights)


QWEN = _qwen()


@dataclass(frozen=True)
class EosAfter:
    """Eos is masked before ``length`` sampled tokens and the most likely token from then on."""

    length: int

    def __call__(self, logits: torch.Tensor, prefixes) -> torch.Tensor:
        out = logits.clone()
        for i, prefix in enumerate(prefixes):
            out[i, EOS] = out[i].max() + 3.0 if len(prefix) >= self.length else float("-inf")
        return out


class RandomChainDrafter(Drafter):
    """Random chains over a few ids (some right by chance, most wrong); seeded."""

    def __init__(self, seed: int) -> None:
        self.g = torch.Generator().manual_seed(seed)

    def start(self, state, prompt: list[int]) -> None:
        pass

    def propose(self, request) -> DraftProposal:
        n = int(torch.randint(0, request.budget + 1, (1,), generator=self.g))
        tokens = torch.randint(0, 8, (n,), generator=self.g).tolist()
        return DraftProposal(tokens, list(range(-1, n - 1)), [1.0] * n)

    def commit(self, tokens: list[int]) -> None:
        pass


ROW = st.tuples(st.lists(st.integers(0, 500), min_size=1, max_size=9), st.integers(1, 24), st.integers(0, 24))


def _jobs(rows) -> list[RowJob]:
    return [RowJob(k, None, DecodeJob(prompt, EosAfter(after), EOS, max_new))
            for k, (prompt, max_new, after) in enumerate(rows)]


@examples(6)
@given(rows=st.lists(ROW, min_size=1, max_size=6), capacity=st.integers(1, 4), seed=st.integers(0, 1000),
       max_draft=st.sampled_from([1, 3, 6]))
def test_qwen2_batched_greedy_equals_batch1_and_speculative_equals_ar(rows, capacity, seed, max_draft):
    jobs = _jobs(rows)
    ar = dict(decode_all(QWEN, jobs, capacity, MAX_LEN))
    pool = NgramPool(3)
    drafters = {"ngram": PerRowDrafters(lambda: NgramDrafter(pool, EOS)),
                "random": PerRowDrafters(lambda: RandomChainDrafter(seed))}
    for job in jobs:
        ref = greedy_decode(QWEN, QWEN.start(MAX_LEN), job.job)
        assert ar[job.key].tokens == ref.tokens
        assert ar[job.key].finished == ref.finished
        assert ar[job.key].sum_logprob == pytest.approx(ref.sum_logprob, abs=1e-3)
    for drafter in drafters.values():
        spec = dict(decode_all(QWEN, jobs, capacity, MAX_LEN, drafter=drafter,
                               options=SpecOptions(max_draft=max_draft)))
        for job in jobs:
            assert spec[job.key].tokens == ar[job.key].tokens
            assert spec[job.key].finished == ar[job.key].finished


def test_decoder_only_batch_needs_a_row_length():
    with pytest.raises(ValueError, match="max_len"):
        list(decode_all(QWEN, _jobs([([1, 2], 3, 0)]), 2))
    with pytest.raises(ValueError, match="no context"):
        list(decode_all(QWEN, [RowJob(0, "ctx", DecodeJob([1], None, EOS, 2))], 1, MAX_LEN))


@pytest.mark.parametrize("kind", ["cosyvoice2", "cosyvoice3"])
def test_cosyvoice_batched_greedy_with_per_row_min_length_equals_synthesizer(tmp_path, kind):
    # CosyVoice2: eos boosted, so each row stops as soon as its own min-length mask lifts. (CosyVoice3's
    # min-length rule masks sos, not eos, as upstream does: its rows run to their own length limits.)
    boost = 6561 if kind == "cosyvoice2" else None
    model = load_cosyvoice(str(write_checkpoint(tmp_path / kind, kind, seed=3, boost=boost)))
    spec = model.spec
    requests = [SynthesisRequest(f"r{i}", text) for i, text in enumerate(
        ["Hi.", "A much longer sentence to speak here.", "Two words", "Hello there, how are you today?"])]
    ref = {r.id: Synthesizer(model, SynthesisOptions(sampler=SamplerOptions("greedy"))).synthesize(r) for r in requests}
    jobs, longest = [], 0
    for r in requests:
        prep = prepare(model, r)
        rules, params = build_sampler(SamplerOptions("greedy"), stop_ids=list(spec.stop_ids),
                                      min_len_mask_id=spec.min_length_mask_id, min_len=prep.min_len,
                                      stop_into=spec.eos)
        jobs.append(RowJob(r.id, None, DecodeJob(prep.prompt, rules, spec.eos, prep.max_len, sampling=params)))
        longest = max(longest, len(prep.prompt) + prep.max_len + 2)
    assert len({j.job.rules.min_len for j in jobs}) > 1  # rows carry different min-length masks
    got = dict(decode_all(model.lm, jobs, 3, longest))
    pool = NgramPool(4)
    spec_got = dict(decode_all(model.lm, jobs, 3, longest, drafter=PerRowDrafters(lambda: NgramDrafter(pool, spec.eos)),
                               options=SpecOptions(max_draft=4)))
    assert len({len(ref[r.id].tokens) for r in requests}) > 1  # rows end at different steps
    assert boost is None or all(ref[r.id].finished and len(ref[r.id].tokens) == prepare(model, r).min_len
                                for r in requests)
    for r in requests:
        assert got[r.id].tokens == ref[r.id].tokens
        assert got[r.id].finished == ref[r.id].finished
        assert spec_got[r.id].tokens == ref[r.id].tokens


def _random_tree(g: torch.Generator, n: int) -> list[int]:
    return [int(torch.randint(-1, i, (1,), generator=g)) if i else -1 for i in range(n)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ragged_tree_scoring_equals_batch1_scoring(seed):
    """One ragged forward: rows at different lengths, each scoring its own tree padded to the widest;
    each real row's logits == that row scored alone, and the rows' caches keep only what they keep."""
    from specli.core.batched import _batch_inputs, _Row
    from specli.core.tree import tree_inputs

    g = torch.Generator().manual_seed(seed)
    lengths, sizes = [5, 1, 9], [int(torch.randint(0, 5, (1,), generator=g)) for _ in range(3)]
    contexts = [torch.randint(0, 500, (n + 1,), generator=g).tolist() for n in lengths]
    proposals = [DraftProposal(torch.randint(0, 500, (n,), generator=g).tolist(), _random_tree(g, n)) for n in sizes]
    state = QWEN.start_batch(3, 32, spare=8)
    rows = []
    for b, ctx in enumerate(contexts):
        view = QWEN.row_state(state, b)
        QWEN.score(view, torch.tensor([ctx[:-1]]))
        state.cache.set_length(b, view.cache.length)
        rows.append(_Row(RowJob(b, None, DecodeJob(ctx, None, EOS, 4)), ctx, None, None))
    out = QWEN.score(state, *_batch_inputs(rows, proposals, state.cache.lengths, state.cache.device))
    for b, (ctx, proposal) in enumerate(zip(contexts, proposals)):
        alone = QWEN.start(32)
        QWEN.score(alone, torch.tensor([ctx[:-1]]))
        mask, pos = tree_inputs(proposal.parents, alone.cache.length)
        ref = QWEN.score(alone, torch.tensor([[ctx[-1], *proposal.tokens]]), pos, mask)
        n = len(proposal) + 1
        assert torch.allclose(out.logits[b, :n], ref.logits[0], atol=1e-4, rtol=0)
    assert state.cache.lengths == [n for n in lengths]  # a score never moves the lengths
