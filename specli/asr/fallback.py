"""Whisper's decoding options and temperature fallback, for plain and speculative decoding alike.

One window is decoded at the first temperature of :attr:`DecodingOptions.temperatures`; when the
result looks like a failure (too repetitive: compression ratio above the threshold; too unsure:
average log-probability below the threshold) and the window is not silence, it is decoded again
at the next temperature, as openai-whisper's ``decode_with_fallback`` does. At temperature 0 a
window is decoded greedily (speculatively when the preset has a drafter: identical tokens) or by
plain beam search; above 0, ``best_of`` samples are drawn (speculatively with rejection sampling,
which keeps the target's distribution) and the best by length-normalised log-probability is kept.
specli adds one rule (``fallback_silence``, on by default): a window the model thinks silent whose
first decode failed is skipped at once, instead of keeping a sample drawn over silence (music).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, replace

from specli.core.beam import BeamOptions, beam_decode
from specli.core.drafters.base import Drafter
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob
from specli.core.logits import GREEDY, SamplingParams
from specli.asr.segments import compression_ratio
from specli.core.speculative import SpecOptions, speculative_decode
from specli.core.types import DecodeResult, DecodeStats, Target, TargetState, accumulate
from specli.models.speech import DecodingOptions


@dataclass(frozen=True)
class DecodeMethod:
    """How a window is decoded at each temperature: plain autoregressive, or speculative."""

    drafter: Drafter | None = None  # None: plain autoregressive decoding
    spec: SpecOptions = SpecOptions()  # speculation settings (how tokens are chosen is set per attempt)


AR = DecodeMethod()


@dataclass(frozen=True)
class WindowDecode:
    """The decode kept for one window, with the quantities the fallback rule judged."""

    result: DecodeResult
    temperature: float  # temperature of the kept decode
    avg_logprob: float  # sum_logprob / (tokens + 1), eot counted
    compression_ratio: float  # of the kept text
    attempts: int  # temperatures tried (1 = no fallback)
    stats: DecodeStats  # work of every decode run for this window
    first_failed: bool = False  # the first decode failed the fallback test (retried, or skipped as silence)


def avg_logprob(result: DecodeResult) -> float:
    """openai-whisper's average log-probability: the eot token counts in the length."""
    return result.sum_logprob / (len(result.tokens) + 1)


def needs_fallback(ratio: float, avg_lp: float, no_speech_prob: float, options: DecodingOptions) -> bool:
    """openai-whisper's ``decode_with_fallback`` test (since Nov 2024, as faster-whisper): decode again at
    the next temperature? A window is silence (no fallback) only when it is also unsure: a confident
    loop over likely silence (music) is retried."""
    fallback = False
    if options.compression_ratio_threshold is not None and ratio > options.compression_ratio_threshold:
        fallback = True  # too repetitive
    if options.logprob_threshold is not None and avg_lp < options.logprob_threshold:
        fallback = True  # average log-probability too low
    if (likely_silent(no_speech_prob, options)
            and options.logprob_threshold is not None and avg_lp < options.logprob_threshold):
        fallback = False  # silence
    return fallback


def is_silent(no_speech_prob: float, avg_lp: float, options: DecodingOptions) -> bool:
    """openai-whisper's no-speech skip: a likely-silent window is skipped unless its text is confident."""
    if options.no_speech_threshold is None or no_speech_prob <= options.no_speech_threshold:
        return False
    return options.logprob_threshold is None or avg_lp <= options.logprob_threshold


def should_skip(no_speech_prob: float, avg_lp: float, fell_back: bool, options: DecodingOptions) -> bool:
    """Drop the window as silence? Whisper's no-speech skip (:func:`is_silent`) and, with
    ``fallback_silence``, a window the model thinks silent (no-speech prob above the threshold) whose
    first decode failed the fallback test: what is left is a sample drawn over likely silence, the
    source of repeated hallucinations on music (Whisper would keep it)."""
    if is_silent(no_speech_prob, avg_lp, options):
        return True
    return options.fallback_silence and fell_back and likely_silent(no_speech_prob, options)


def likely_silent(no_speech_prob: float, options: DecodingOptions) -> bool:
    """The model's <|nospeech|> probability is above the threshold."""
    return options.no_speech_threshold is not None and no_speech_prob > options.no_speech_threshold


def rank_score(result: DecodeResult, length_penalty: float | None) -> float:
    """openai-whisper's ``MaximumLikelihoodRanker`` score: sum log-prob over a length penalty."""
    n = len(result.tokens)
    penalty = n if length_penalty is None else ((5 + n) / 6) ** length_penalty
    return result.sum_logprob / penalty if penalty else result.sum_logprob


def decode_attempt(target: Target, state: TargetState, job: DecodeJob, options: DecodingOptions,
                   method: DecodeMethod = AR) -> tuple[DecodeResult, DecodeStats]:
    """Decode one window's ``job`` at ``options.temperature``: greedy / speculative / beam at 0, the best of
    ``best_of`` samples above 0. Returns the kept result and the work of every decode run."""
    t = options.temperature
    stats = DecodeStats()
    if t == 0.0 and options.beam_size is not None and options.beam_size > 1:
        state.cache.crop(0)
        res = beam_decode(target, state, job, BeamOptions(options.beam_size, options.patience, options.length_penalty))
        accumulate(stats, res.stats)
        return res, stats
    job = replace(job, sampling=GREEDY if t == 0.0 else SamplingParams(temperature=t))
    best: DecodeResult | None = None
    for _ in range(1 if t == 0.0 else options.best_of):
        state.cache.crop(0)
        if method.drafter is None:
            res = greedy_decode(target, state, job)
        else:
            res = speculative_decode(target, state, job, method.drafter, method.spec)
        accumulate(stats, res.stats)
        if best is None or rank_score(res, options.length_penalty) > rank_score(best, options.length_penalty):
            best = res
    return best, stats


@dataclass(frozen=True)
class Attempt:
    """One decode of a window at one temperature, asked for by :func:`fallback_steps`; the driver
    answers with ``(DecodeResult, DecodeStats)`` (:func:`decode_attempt` on the window's state, or a
    batched decoder for a plain greedy attempt)."""

    job: DecodeJob  # the window's prompt, rules, eot, length limit, generator and no-speech probe (greedy)
    options: DecodingOptions  # one temperature (``options.temperature``)
    method: DecodeMethod  # plain or speculative

    @property
    def greedy(self) -> bool:
        """A single greedy (or speculative greedy) decode: no beam, no sampling."""
        beam = self.options.beam_size is not None and self.options.beam_size > 1
        return self.options.temperature == 0.0 and not beam


def run_attempt(target: Target, state: TargetState, attempt: Attempt) -> tuple[DecodeResult, DecodeStats]:
    """:func:`decode_attempt` of ``attempt`` on ``state``."""
    return decode_attempt(target, state, attempt.job, attempt.options, attempt.method)


FallbackSteps = Generator[Attempt, tuple[DecodeResult, DecodeStats], WindowDecode]


def fallback_steps(job: DecodeJob, options: DecodingOptions, text_of: Callable[[list[int]], str],
                   method: DecodeMethod = AR) -> FallbackSteps:
    """openai-whisper's ``decode_with_fallback`` for one window as a step machine: yields one
    :class:`Attempt` per temperature tried, receives its ``(result, stats)``, returns the kept decode.
    ``job`` carries the window's prompt, rules and no-speech probe; its sampling is set per temperature.

    With ``fallback_silence``, a likely-silent window whose first decode failed stops there: it is
    skipped whatever a sample would say (:func:`should_skip`), so no sample is drawn for it.
    """
    total = DecodeStats()
    kept: WindowDecode | None = None
    for i, t in enumerate(options.temperatures):
        res, stats = yield Attempt(job, options.at(t), method)
        accumulate(total, stats)
        ratio, avg_lp = compression_ratio(text_of(res.tokens).strip()), avg_logprob(res)
        failed = needs_fallback(ratio, avg_lp, res.probed, options)
        kept = WindowDecode(res, t, avg_lp, ratio, i + 1, total, first_failed=i > 0 or failed)
        if not failed or (options.fallback_silence and likely_silent(res.probed, options)):
            break
    return kept


def decode_with_fallback(target: Target, state: TargetState, steps: FallbackSteps) -> WindowDecode:
    """openai-whisper's ``decode_with_fallback`` for one window: its :func:`fallback_steps` run to the
    kept decode, each attempt decoded on ``state`` (:func:`run_attempt`)."""
    return drive(steps, lambda attempt: run_attempt(target, state, attempt))


def drive(steps: Generator, serve: Callable) -> object:
    """Run a step machine to its end, answering each request it yields with ``serve(request)``."""
    reply = None
    try:
        while True:
            reply = serve(steps.send(reply))
    except StopIteration as stop:
        return stop.value
