"""Temperature fallback: the decision rules against openai-whisper's, the fallback loop on tiny targets,
and speculative sampling through the fallback path keeping the target's distribution."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specli.core import speculative
from specli.asr.fallback import (DecodeMethod, avg_logprob, decode_attempt, decode_with_fallback,
                                     fallback_steps, is_silent, needs_fallback, rank_score, should_skip)
from specli.asr.drafters.model import ModelDrafter
from specli.models.speech import DecodingOptions
from specli.core.job import DecodeJob, Probe
from specli.core.logits import SamplingParams, filter_logits
from specli.core.speculative import SpecOptions
from specli.core.types import DecodeResult, DecodeStats
from tiny_models import EOT, NO_TS, SOT, VOCAB, tiny_rules, tiny_target, window

# ------------------------------------------------------------- openai-whisper's rules, as they are written


def whisper_needs_fallback(compression_ratio, avg_logprob, no_speech_prob,
                           compression_ratio_threshold, logprob_threshold, no_speech_threshold) -> bool:
    """The body of openai-whisper's ``decode_with_fallback`` (whisper/transcribe.py, since the Nov 2024
    fix that made the silence override need a low log-probability too, as faster-whisper), transcribed."""
    needs = False
    if compression_ratio_threshold is not None and compression_ratio > compression_ratio_threshold:
        needs = True  # too repetitive
    if logprob_threshold is not None and avg_logprob < logprob_threshold:
        needs = True  # average log probability is too low
    if (
        no_speech_threshold is not None
        and no_speech_prob > no_speech_threshold
        and logprob_threshold is not None
        and avg_logprob < logprob_threshold
    ):
        needs = False  # silence
    return needs


def whisper_should_skip(avg_logprob, no_speech_prob, logprob_threshold, no_speech_threshold) -> bool:
    """openai-whisper's no-voice-activity check in ``transcribe``, transcribed."""
    if no_speech_threshold is None:
        return False
    skip = no_speech_prob > no_speech_threshold
    if logprob_threshold is not None and avg_logprob > logprob_threshold:
        skip = False  # don't skip if the logprob is high enough, despite the no_speech_prob
    return skip


CASES = [  # (compression ratio, avg logprob, no-speech prob) -> (fallback?, skipped?) at the defaults
    ((1.2, -0.3, 0.01), (False, False)),  # confident speech
    ((2.9, -0.2, 0.01), (True, False)),  # a loop: too repetitive
    ((1.3, -1.4, 0.10), (True, False)),  # unsure text
    ((1.3, -1.4, 0.90), (False, True)),  # silence: no fallback, skipped
    ((2.9, -0.2, 0.90), (True, False)),  # a confident loop over likely silence (music): retried
    ((2.9, -1.5, 0.90), (False, True)),  # an unsure loop over likely silence: silence, skipped
    ((2.4, -1.0, 0.60), (False, False)),  # every threshold is strict
]


@pytest.mark.parametrize("values,expected", CASES)
def test_constructed_cases_match_whisper(values, expected):
    ratio, lp, nsp = values
    opts = DecodingOptions()
    assert (needs_fallback(ratio, lp, nsp, opts), is_silent(nsp, lp, opts)) == expected
    assert whisper_needs_fallback(ratio, lp, nsp, 2.4, -1.0, 0.6) == expected[0]
    assert whisper_should_skip(lp, nsp, -1.0, 0.6) == expected[1]


thresholds = st.one_of(st.none(), st.floats(-5, 5))


@settings(max_examples=400, deadline=None)
@given(ratio=st.floats(0, 6), lp=st.floats(-5, 0), nsp=st.floats(0, 1), crt=thresholds, lpt=thresholds,
       nst=st.one_of(st.none(), st.floats(0, 1)))
def test_rules_equal_whisper_on_any_input(ratio, lp, nsp, crt, lpt, nst):
    opts = DecodingOptions(compression_ratio_threshold=crt, logprob_threshold=lpt, no_speech_threshold=nst)
    assert needs_fallback(ratio, lp, nsp, opts) == whisper_needs_fallback(ratio, lp, nsp, crt, lpt, nst)
    assert is_silent(nsp, lp, opts) == whisper_should_skip(lp, nsp, lpt, nst)


def test_likely_silence_whose_greedy_decode_failed_is_skipped():
    opts = DecodingOptions()
    assert should_skip(0.78, -0.71, True, opts)  # music: t=0 looped, a sample at 0.6 looks confident
    assert not should_skip(0.78, -0.71, False, opts)  # no fallback: Whisper's rule alone (kept)
    assert not should_skip(0.30, -0.71, True, opts)  # speech the model believes in: kept
    assert should_skip(0.78, -1.5, False, opts)  # Whisper's own skip
    assert not should_skip(0.78, -0.71, True, DecodingOptions(fallback_silence=False))
    assert not should_skip(0.78, -0.71, True, DecodingOptions(no_speech_threshold=None))


def test_average_logprob_and_ranking_follow_whisper():
    a = DecodeResult([1, 2, 3], -1.2, 0.0, True, DecodeStats())
    b = DecodeResult([1, 2, 3, 4, 5, 6], -1.8, 0.0, True, DecodeStats())
    assert avg_logprob(a) == pytest.approx(-0.3)  # eot counts in the length
    assert rank_score(b, None) > rank_score(a, None)  # -0.3 / token beats -0.4 / token
    assert rank_score(a, 1.0) == pytest.approx(-1.2 / (8 / 6))  # Google NMT penalty ((5 + n) / 6) ** alpha


# ------------------------------------------------------------------------- the fallback loop, tiny target


def _tiny_fallback(options: DecodingOptions, method: DecodeMethod = DecodeMethod(), seed: int = 0):
    target = tiny_target(0, init_std=0.15)
    job = DecodeJob((SOT, NO_TS), tiny_rules(False), EOT, 6, generator=torch.Generator().manual_seed(seed))
    return decode_with_fallback(target, window(target, 11),
                                fallback_steps(job, options, lambda toks: " ".join(map(str, toks)), method))


def test_a_decode_that_passes_is_kept_at_temperature_zero():
    out = _tiny_fallback(DecodingOptions(compression_ratio_threshold=None, logprob_threshold=None))
    assert (out.attempts, out.temperature) == (1, 0.0)


def test_every_temperature_is_tried_while_the_decode_fails():
    opts = DecodingOptions(temperatures=(0.0, 0.5, 1.0), best_of=2, logprob_threshold=0.0, no_speech_threshold=None)
    out = _tiny_fallback(opts)
    assert (out.attempts, out.temperature) == (3, 1.0)  # log-probabilities are < 0: always "too unsure"
    assert out.avg_logprob == pytest.approx(avg_logprob(out.result))
    greedy = _tiny_fallback(DecodingOptions(temperatures=(0.0,)))
    assert out.stats.target_forwards > greedy.stats.target_forwards  # 1 greedy + 2 x 2 sampled decodes counted


def test_likely_silence_stops_the_fallback_at_once():
    """A failing decode (every ratio is > -1) over likely silence (threshold 0): no sample is drawn for it."""
    target = tiny_target(0, init_std=0.15)
    opts = DecodingOptions(temperatures=(0.0, 0.5, 1.0), best_of=2, compression_ratio_threshold=-1.0,
                           logprob_threshold=None, no_speech_threshold=0.0)

    def run(o: DecodingOptions):
        job = DecodeJob((SOT, NO_TS), tiny_rules(False), EOT, 6, generator=torch.Generator().manual_seed(0),
                        probe=Probe(0, NO_TS))
        return decode_with_fallback(target, window(target, 11), fallback_steps(job, o, str))

    stopped = run(opts)
    assert (stopped.attempts, stopped.first_failed) == (1, True)
    assert should_skip(stopped.result.probed, stopped.avg_logprob, stopped.first_failed, opts)
    whisper = run(DecodingOptions(**{**opts.__dict__, "fallback_silence": False}))
    assert (whisper.attempts, whisper.temperature) == (3, 1.0)  # Whisper retries every temperature


def test_best_of_keeps_the_highest_ranked_sample():
    target, rules = tiny_target(0, init_std=0.15), tiny_rules(False)
    opts = DecodingOptions(temperatures=(1.0,), best_of=4)
    kept, _ = decode_attempt(target, window(target, 11),
                             DecodeJob((SOT, NO_TS), rules, EOT, 6, generator=torch.Generator().manual_seed(3)), opts)
    job = DecodeJob((SOT, NO_TS), rules, EOT, 6, generator=torch.Generator().manual_seed(3))  # the same four samples
    singles = [decode_attempt(target, window(target, 11), job, DecodingOptions(temperatures=(1.0,), best_of=1))[0]
               for _ in range(4)]
    assert len({tuple(s.tokens) for s in singles}) > 1, "samples must differ for the test to mean anything"
    best = max(singles, key=lambda r: rank_score(r, None))
    assert kept.tokens == best.tokens


def test_sampled_logprobs_are_at_temperature_one():
    """Whisper judges a sample by the log-probabilities of the untempered (rule-filtered) distribution."""
    target, rules = tiny_target(0, init_std=0.15), tiny_rules(False)
    res, _ = decode_attempt(target, window(target, 11),
                            DecodeJob((SOT, NO_TS), rules, EOT, 4, generator=torch.Generator().manual_seed(5)),
                            DecodingOptions(temperatures=(0.7,), best_of=1))
    state = window(target, 11)
    toks = [SOT, NO_TS, *res.tokens] + ([EOT] if res.finished else [])
    logits = target.score(state, torch.tensor([toks[:-1]])).logits[0, 1:]
    n = len(toks) - 2
    logp = torch.log_softmax(filter_logits(logits, [toks[2:2 + i] for i in range(n)], rules), -1)
    assert res.sum_logprob == pytest.approx(sum(float(logp[i, toks[2 + i]]) for i in range(n)), abs=1e-4)


# ------------------------------------------- speculative sampling through the fallback path stays exact


def _first_token_probs(target, rules, temperature: float) -> torch.Tensor:
    out = target.score(window(target, 11), torch.tensor([[SOT, NO_TS]]))
    return filter_logits(out.logits[0, -1:], [[]], rules, SamplingParams(temperature=temperature)).softmax(-1)[0]


def tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())


def _first_tokens(method: DecodeMethod, runs: int) -> torch.Tensor:
    """First tokens of ``runs`` windows that fail at t=0 and fall back to t=0.6 (one generator for all)."""
    target, rules = tiny_target(0, init_std=0.15), tiny_rules(False)
    opts = DecodingOptions(temperatures=(0.0, 0.6), best_of=1, logprob_threshold=0.0, no_speech_threshold=None,
                           compression_ratio_threshold=None)
    gen = torch.Generator().manual_seed(1234)
    counts = torch.zeros(VOCAB)
    for _ in range(runs):
        job = DecodeJob((SOT, NO_TS), rules, EOT, 3, generator=gen)
        out = decode_with_fallback(target, window(target, 11), fallback_steps(job, opts, str, method))
        assert out.temperature == 0.6
        counts[out.result.tokens[0] if out.result.tokens else EOT] += 1
    return counts


def _speculative() -> DecodeMethod:
    return DecodeMethod(ModelDrafter(tiny_target(1, layers=1, init_std=0.15), share_encoder=True),
                        SpecOptions(max_draft=3))


def test_fallback_sampling_ar_and_speculative_follow_the_target(monkeypatch):
    target, rules = tiny_target(0, init_std=0.15), tiny_rules(False)
    p = _first_token_probs(target, rules, 0.6)
    runs = 300
    # E[TV(empirical, p)] <= 0.5 * sum sqrt(p (1 - p) / runs) (Jensen, per token), and one run moves the TV
    # by at most 1 / runs, so it exceeds its mean by 0.1 with probability <= exp(-2 runs 0.1^2) = 2.5e-3 (McDiarmid)
    bound = 0.5 * float((p * (1 - p) / runs).sqrt().sum()) + 0.1
    ar, spec = _first_tokens(DecodeMethod(), runs), _first_tokens(_speculative(), runs)
    assert tv(ar, p) < bound
    assert tv(spec, p) < bound

    # power: a verifier that accepts every draft token samples the drafter, and the same check fails
    def accept_all(filtered, proposal, greedy, u_accept, u_sample, **_kw):
        n = len(proposal)
        path = torch.arange(n).unsqueeze(0)
        return torch.tensor([n]), path, filtered[:, n].softmax(-1).multinomial(1)[:, 0]

    monkeypatch.setattr(speculative, "verify", accept_all)
    broken = _first_tokens(_speculative(), runs)
    assert tv(broken, p) > 2 * bound  # (measured 0.71: it follows the drafter)
