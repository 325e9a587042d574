"""Decode without waste (issue 45): one log_softmax a step shared by Whisper's timestamp rule and the emitted
token's log-probability, the greedy rows of a batch chosen ``[B, vocab]`` with one readback, and the prompt prefill
attending in one call a layer. Each equals the computation it replaces bit for bit."""

from __future__ import annotations

import pytest
import torch

from specli.core.batched import RowJob, decode_all, greedy_rows
from specli.core.drafters.base import EMPTY
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob, Probe, prefill
from specli.core.logits import LogitFilter, SamplingParams, filter_logits, filter_with_logprobs
from specli.core.speculative import SpecOptions, accept_draft, speculative_decode
from specli.models.whisper.rules import WhisperLogitRules
from tiny_models import EOT, NO_TS, SOT, AlwaysWrongDrafter, tiny_rules, tiny_target, window

# a multilingual Whisper vocabulary: rows as wide as the real ones (reductions over > 32k columns split by thread)
V, EOT_W, NO_TS_W, TB_W = 51865, 50257, 50363, 50364
PREFIXES = [[], [TB_W], [TB_W, 400], [TB_W, 400, TB_W + 20], [TB_W, 400, TB_W + 20, TB_W + 20], [500, 600],
            [TB_W + 3, 7, 9]]


def _rules(timestamps: bool) -> WhisperLogitRules:
    return WhisperLogitRules(EOT_W, NO_TS_W, TB_W, suppress_tokens=(1, 2, 50358), begin_suppress_tokens=(220, EOT_W),
                             timestamps=timestamps, max_initial_timestamp_index=50)


def _logits(seed: int, rows: int) -> torch.Tensor:
    """Random logits ``[rows, V]``: some rows with timestamps heavy enough to be forced, some quantized to halves
    (ties at the top), one whose two best tokens tie exactly."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, V, generator=g) * 3
    x[::2, TB_W:] += 4.0  # timestamp mass: the rule forces a timestamp on these rows
    x[1::3] = (x[1::3] * 2).round() / 2
    x[-1, 300] = x[-1, 301] = x[-1].max() + 1.0
    return x


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("timestamps", [True, False])
def test_shared_log_softmax_equals_filter_then_log_softmax_bit_for_bit(timestamps, threads):
    """The log-probabilities read from the rule's own log_softmax equal the old path's second log_softmax over the
    filtered rows (batched [n, V] and the greedy loop's 1-D row alike), the rows the forcing changed included."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for seed in range(3):
            x, rules = _logits(seed, len(PREFIXES)), _rules(timestamps)
            got = filter_with_logprobs(x, PREFIXES, rules)
            want = filter_logits(x, PREFIXES, rules)
            assert torch.equal(got.logits, want)
            ref = torch.log_softmax(want, -1)  # the old second log_softmax, [n, V]
            if timestamps:
                assert got.stale is not None and 0 < int(got.stale.sum()) < len(PREFIXES), "forced rows and others"
                for r in range(len(PREFIXES)):
                    if not got.stale[r]:
                        assert torch.equal(got.logprobs[r], ref[r]), r
            else:
                assert got.stale is None
            g = torch.Generator().manual_seed(seed)
            rows = [r for r in range(len(PREFIXES)) for _ in range(3)]
            toks = [int(want[r].argmax()) if k == 0 else int(torch.randint(0, V, (1,), generator=g))
                    for r, k in zip(rows, [0, 1, 2] * len(PREFIXES))]
            host = got.pick(torch.tensor(rows), torch.tensor(toks)).tolist()
            values = got.read(host, rows, toks)
            assert values == [ref[r, t].item() for r, t in zip(rows, toks)]
            assert torch.equal(got.exact(), ref)  # whole rows (beam search), stale ones recomputed
            assert values == [torch.log_softmax(want[r], -1)[t].item() for r, t in zip(rows, toks)]  # 1-D rows
    finally:
        torch.set_num_threads(before)


def _readbacks(monkeypatch) -> list[str]:
    """Counts device-to-host reads of tensors (the real methods still run)."""
    calls: list[str] = []
    for name in ("tolist", "item", "__int__", "__float__", "__bool__"):
        real = getattr(torch.Tensor, name)

        def spy(self, *a, _real=real, _name=name, **k):
            calls.append(_name)
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, spy)
    return calls


@pytest.mark.parametrize("threads", [1, 2])
def test_greedy_rows_equal_each_rows_batch_one_accept(monkeypatch, threads):
    """``[B, vocab]`` greedy choice over rows of mixed rules (timestamps on / off, a repetition penalty), ties and
    forced timestamps: each row's token, log-probability and probe equal batch 1's (``accept_draft`` without a draft,
    ``Probe.read``) exactly, from one readback (two when a forced row's log-probability is read)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        penalty = SamplingParams(repetition_penalty=1.3)
        filters = [LogitFilter(_rules(True)), LogitFilter(_rules(False)), LogitFilter(_rules(True), penalty)]
        for seed in range(3):
            x = _logits(10 + seed, len(PREFIXES))
            row_filters = [filters[(r + seed) % 3] for r in range(len(PREFIXES))]
            probes = [(0, Probe(0, NO_TS_W)), (3, Probe(2, 7))]
            calls = _readbacks(monkeypatch)
            tokens, logprobs, probed = greedy_rows(x, row_filters, PREFIXES, probes)
            assert 1 <= len(calls) <= 2, calls
            monkeypatch.undo()
            for r, (filt, prefix) in enumerate(zip(row_filters, PREFIXES)):
                _kept, emitted, lps = accept_draft(x[r : r + 1], prefix, EMPTY, filt, filt.params, None)
                assert (tokens[r], logprobs[r]) == (emitted[0], lps[0]), r
                filtered = filter_logits(x[r : r + 1], [prefix], filt.rules, filt.params)[0]  # the old batch-1 step
                tok = int(filtered.argmax())
                assert (tokens[r], logprobs[r]) == (tok, torch.log_softmax(filtered, -1)[tok].item()), r
            assert probed == [p.read(x[r]) for r, p in probes]
        x = _logits(20, 4)
        x[:, TB_W:] = -30.0  # no forced row: the one readback
        calls = _readbacks(monkeypatch)
        greedy_rows(x, [filters[0]] * 4, [[5], [6], [TB_W, 7], [8, 9]])
        assert len(calls) == 1, calls
    finally:
        torch.set_num_threads(before)


def _long_prompt(k: int) -> tuple[int, ...]:
    """Previous-text tokens (as a long-form window's prompt carries them), then sot."""
    return tuple(6 + (7 * i + k) % 28 for i in range(12 + 9 * k)) + (SOT,)


@pytest.fixture(scope="module")
def bf16_target():
    return tiny_target(0, dtype=torch.bfloat16)


def test_bf16_prefill_attends_in_one_call_a_layer(monkeypatch, bf16_target):
    """A 30-row bf16 prompt prefill: one self- and one cross-attention call per decoder layer (it took one per
    prompt row and layer, 0.9 s of a 158-s file's wall)."""
    calls, state, prompt = [], window(bf16_target, 1), _long_prompt(2)
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    prefill(bf16_target, state, DecodeJob(prompt, tiny_rules(True), EOT, 8), len(prompt) - 1)
    assert len(calls) == 2 * bf16_target.dims.decoder_layers


def test_bf16_long_prompts_give_ar_speculative_and_batched_the_same_tokens_and_logprobs(bf16_target):
    """bf16 rows after long prompts: speculative and batched (ragged, with probes) decoding give AR's tokens,
    log-probabilities and probes exactly, and AR and speculation cache the same prompt K/V."""
    tgt = bf16_target
    jobs = [DecodeJob(_long_prompt(k), tiny_rules(k % 2 == 0), EOT, 12 + 3 * k,
                      probe=Probe(len(_long_prompt(k)) - 1 - (k % 2) * 3, NO_TS)) for k in range(4)]
    ref = []
    for k, job in enumerate(jobs):
        ar_state, spec_state = window(tgt, k), window(tgt, k)
        want = greedy_decode(tgt, ar_state, job)
        got = speculative_decode(tgt, spec_state, job, AlwaysWrongDrafter(), SpecOptions(max_draft=3))
        assert (got.tokens, got.sum_logprob, got.probed) == (want.tokens, want.sum_logprob, want.probed), k
        assert want.sum_logprob == _teacher_forced_logprob(tgt, k, job, want.tokens, want.finished)
        n = len(job.prompt) - 1
        assert torch.equal(ar_state.cache.keys[..., :n, :], spec_state.cache.keys[..., :n, :])
        ref.append(want)
    rows = [RowJob(k, (window(tgt, k).audio_features, None), job) for k, job in enumerate(jobs)]
    got = dict(decode_all(tgt, rows, 3))
    for k, want in enumerate(ref):
        assert (got[k].tokens, got[k].sum_logprob, got[k].probed) == (want.tokens, want.sum_logprob, want.probed), k


def _teacher_forced_logprob(tgt, seed: int, job: DecodeJob, tokens: list[int], finished: bool) -> float:
    """The sum of the emitted tokens' log-probabilities as the old loop took them (filter, then a second
    log_softmax), over one-token steps along ``tokens``."""
    state = window(tgt, seed)
    prefill(tgt, state, job, len(job.prompt) - 1)
    total, feed = 0.0, [job.prompt[-1], *tokens]
    emitted = tokens + ([EOT] if finished else [])
    for i, tok in enumerate(emitted):
        logits = tgt.score(state, torch.tensor([[feed[i]]])).logits[0]
        filtered = filter_logits(logits, [tokens[:i]], job.rules)
        total += torch.log_softmax(filtered[0], -1)[tok].item()
    return total


def test_a_ragged_chains_row_plan_from_the_cache_lengths_equals_the_masks_without_a_readback(monkeypatch):
    """Batched bf16 rows at their own lengths attend query by query: the keys each query sees come from the cache's
    host lengths, equal to those read from the mask (which took two readbacks a row a step)."""
    from specli.core.kv_cache import RaggedKVCache, row_plan

    for lengths, n in (([3, 7, 5], 1), ([0, 2, 9, 4], 3), ([6, 1], 2)):
        cache = RaggedKVCache(1, len(lengths), 1, 32, 2)
        for b, length in enumerate(lengths):
            cache.set_length(b, length)
        mask = cache.begin(len(lengths), n, None, "cpu")
        want = row_plan(mask, False)
        calls = _readbacks(monkeypatch)
        got = row_plan(mask, False, cache.lengths[: len(lengths)])
        assert calls == []
        monkeypatch.undo()
        assert got == want
