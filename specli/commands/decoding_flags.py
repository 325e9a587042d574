"""The decoding flags of ``transcribe`` / ``translate`` (openai-whisper / faster-whisper names) and
the :class:`~specli.asr.fallback.DecodingOptions` they build."""

from __future__ import annotations

import click

from specli.models.speech import DecodingOptions
from specli.errors import UsageError


def _floats(_ctx, param, value: str) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a number or a comma-separated list of numbers") from None
    if not out:
        raise click.BadParameter("give at least one temperature")
    return out


def _ids(_ctx, param, value: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of token ids") from None


DECODING_FLAGS = [
    click.option("--temperature", default="0", show_default=True, callback=_floats,
                 help="Sampling temperature, or a comma-separated list tried in order on failure "
                      "(a list ignores --temperature-increment-on-fallback)."),
    click.option("--temperature-increment-on-fallback", type=click.FloatRange(0.0), default=0.2, show_default=True,
                 help="Temperature added on each fallback up to 1.0 (0: no fallback)."),
    click.option("--best-of", type=click.IntRange(1), default=5, show_default=True,
                 help="Samples drawn at a temperature > 0; the most likely one is kept."),
    click.option("--beam-size", type=click.IntRange(1, 64),
                 help="Plain beam search with N beams at temperature 0 (not speculative: the preset's "
                      "drafter is not used for it). Default: greedy decoding, speculative with the preset's drafter."),
    click.option("--patience", type=click.FloatRange(0.0, min_open=True),
                 help="With --beam-size: stop after N * patience hypotheses finished (default 1.0)."),
    click.option("--length-penalty", type=click.FloatRange(0.0, 1.0),
                 help="Rank hypotheses by log-prob / ((5 + length) / 6) ** alpha (default: / length)."),
    click.option("--compression-ratio-threshold", type=float, default=2.4, show_default=True,
                 help="Fall back to the next temperature when the text's gzip ratio is above this."),
    click.option("--logprob-threshold", type=float, default=-1.0, show_default=True,
                 help="Fall back when the average log-probability is below this."),
    click.option("--no-speech-threshold", type=click.FloatRange(0.0, 1.0), default=0.6, show_default=True,
                 help="A window whose <|nospeech|> probability is above this is silence (no fallback; "
                      "skipped when its log-probability is also below --logprob-threshold)."),
    click.option("--fallback-silence/--no-fallback-silence", default=True, show_default=True,
                 help="Skip a window whose <|nospeech|> probability is above the threshold and whose greedy "
                      "decode failed (specli's guard against hallucinations on music; Whisper keeps the sample)."),
    click.option("--condition-on-previous-text/--no-condition-on-previous-text", default=True, show_default=True,
                 help="Prompt each window with the previous text (never after a window decoded above 0.5)."),
    click.option("--initial-prompt", help="Text to prompt the first window with (vocabulary, spelling, style)."),
    click.option("--hotwords", help="Text put in every window's prompt (faster-whisper's hotwords)."),
    click.option("--suppress-tokens", default="-1", show_default=True, callback=_ids,
                 help="Comma-separated token ids never emitted; -1 = the model's non-speech set."),
    click.option("--seed", type=int, help="Seed of the sampling random numbers (reproducible fallbacks)."),
]


def temperature_schedule(temperature: tuple[float, ...], increment: float) -> tuple[float, ...]:
    """openai-whisper's schedule: a single temperature grows by ``increment`` up to 1.0; a list stays."""
    if len(temperature) > 1 or increment == 0:
        return temperature
    t0, steps = temperature[0], []
    while t0 + len(steps) * increment <= 1.0 + 1e-6:
        steps.append(round(t0 + len(steps) * increment, 6))
    return tuple(steps) or temperature


def decoding_options(kw: dict) -> DecodingOptions:
    """:class:`DecodingOptions` from the parsed flags; an invalid combination is a usage error."""
    if kw["patience"] is not None and kw["beam_size"] is None:
        raise click.UsageError("--patience needs --beam-size")
    try:
        return DecodingOptions(
            temperatures=temperature_schedule(kw["temperature"], kw["temperature_increment_on_fallback"]),
            best_of=kw["best_of"], beam_size=kw["beam_size"], patience=kw["patience"],
            length_penalty=kw["length_penalty"], compression_ratio_threshold=kw["compression_ratio_threshold"],
            logprob_threshold=kw["logprob_threshold"], no_speech_threshold=kw["no_speech_threshold"],
            fallback_silence=kw["fallback_silence"],
            condition_on_previous_text=kw["condition_on_previous_text"], initial_prompt=kw["initial_prompt"],
            hotwords=kw["hotwords"], suppress_tokens=kw["suppress_tokens"], seed=kw["seed"],
        )
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
