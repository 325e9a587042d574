"""The logit filter inside a draft vocabulary equals the full filter restricted to those columns."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specli.core.logits import GREEDY, DraftVocab, SamplingParams, filter_logits
from specli.core.sampling import GreedyRules
from specli.models.whisper.rules import WhisperLogitRules


@st.composite
def whisper_case(draw):
    """A Whisper-like vocabulary (text, eot, specials, <|notimestamps|>, timestamps), rules, a draft
    vocabulary, prefixes (timestamps included) and logits with ties."""
    vocab = draw(st.integers(10, 90))
    tb = draw(st.integers(5, vocab - 2))  # timestamp_begin; [tb, vocab) are timestamps
    eot, no_ts = tb - 3, tb - 1
    ids = st.integers(0, vocab - 1)
    rules = WhisperLogitRules(
        eot, no_ts, tb,
        suppress_tokens=tuple(sorted(draw(st.sets(ids, max_size=6)))),
        begin_suppress_tokens=tuple(sorted(draw(st.sets(ids, max_size=3)))),
        timestamps=draw(st.booleans()),
        max_initial_timestamp_index=draw(st.one_of(st.none(), st.integers(0, 8))),
    )
    subset = sorted(draw(st.sets(ids, min_size=1)))
    token = st.one_of(st.integers(0, tb - 1), st.integers(tb, vocab - 1))
    prefixes = draw(st.lists(st.lists(token, max_size=6), min_size=1, max_size=4))
    return vocab, rules, subset, prefixes


params_st = st.one_of(
    st.just(GREEDY),
    st.builds(SamplingParams, temperature=st.floats(0.2, 2.0), top_k=st.integers(0, 100),
              top_p=st.floats(0.05, 1.0), repetition_penalty=st.sampled_from([1.0, 0.7, 1.5])),
    st.builds(SamplingParams, repetition_penalty=st.sampled_from([0.7, 1.5])),  # greedy with a penalty
)


def _logits(n: int, vocab: int, seed: int, ties: bool) -> torch.Tensor:
    x = torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    return (x * 2).round() / 2 if ties else x  # rounded: many tied logits (top-k / top-p tie order)


def _full_then_restrict(small: torch.Tensor, ids: list[int], vocab: int, prefixes, rules, params) -> torch.Tensor:
    full = torch.full((small.shape[0], vocab), float("-inf"))
    full[:, ids] = small
    return filter_logits(full, prefixes, rules, params)[:, ids]


def _assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert torch.equal(torch.isneginf(got), torch.isneginf(want))  # the same tokens filtered out
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # the same logits elsewhere
    live = torch.isfinite(want).any(-1)
    torch.testing.assert_close(got[live].softmax(-1), want[live].softmax(-1), rtol=1e-5, atol=1e-7)


@settings(max_examples=300, deadline=None)
@given(case=whisper_case(), params=params_st, seed=st.integers(0, 2**31), ties=st.booleans(),
       as_tensor=st.booleans())
def test_draft_vocabulary_filter_equals_the_full_filter_restricted(case, params, seed, ties, as_tensor):
    vocab, rules, ids, prefixes = case
    small = _logits(len(prefixes), vocab, seed, ties)[:, ids]
    dv = torch.tensor(ids) if as_tensor else DraftVocab(torch.tensor(ids), vocab)
    got = filter_logits(small, prefixes, rules, params, vocab=dv)
    _assert_same(got, _full_then_restrict(small, ids, vocab, prefixes, rules, params))
    assert got.shape == small.shape


@settings(max_examples=60, deadline=None)
@given(case=whisper_case(), params=params_st, seed=st.integers(0, 2**31), min_len=st.integers(0, 3))
def test_rules_without_a_vocab_keyword_see_the_scattered_row(case, params, seed, min_len):
    vocab, _, ids, prefixes = case
    rules = GreedyRules(min_len, mask_ids=(ids[0], vocab - 1))  # CosyVoice's rule: no draft-vocabulary path
    small = _logits(len(prefixes), vocab, seed, False)[:, ids]
    got = filter_logits(small, prefixes, rules, params, vocab=DraftVocab(torch.tensor(ids), vocab))
    _assert_same(got, _full_then_restrict(small, ids, vocab, prefixes, rules, params))

    def plain(x, p):  # a plain function as the rules
        return x.index_fill(1, torch.tensor([0, vocab - 1]), float("-inf"))

    got = filter_logits(small, prefixes, plain, params, vocab=DraftVocab(torch.tensor(ids), vocab))
    _assert_same(got, _full_then_restrict(small, ids, vocab, prefixes, plain, params))


def test_draft_vocab_lookups():
    dv = DraftVocab(torch.tensor([1, 4, 5, 9]), 12)
    assert dv.span(4, 9) == slice(1, 3) and dv.span(5) == slice(2, 4) and dv.span(0, 1) == slice(0, 0)
    assert dv.column(9) == 3 and dv.column(3) is None and dv.columns([9, 0, 1, 11]) == [3, 0]
    assert dv.column_index((9, 1)).tolist() == [3, 0] and dv.column_index((9, 1)) is dv.column_index((9, 1))
    full = dv.to_full(torch.tensor([[1.0, 2.0, 3.0, 4.0]]), 0.0)
    assert full.tolist() == [[0, 1, 0, 0, 2, 3, 0, 0, 0, 4, 0, 0]]
    with pytest.raises(ValueError, match="sorted"):
        DraftVocab(torch.tensor([3, 1]))
    with pytest.raises(ValueError, match="outside"):
        DraftVocab(torch.tensor([1, 12]), 12)
