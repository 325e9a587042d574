"""Text -> CosyVoice speech tokens, one utterance at a time (beside ``transcription.py``).

For each request: tokenize prompt text and text (CosyVoice3 needs ``<|endofprompt|>``; a request
with neither a prompt text nor the marker in its text gets upstream's ``"You are a helpful
assistant.<|endofprompt|>"`` as prompt text, not counted in the length limits), build the
LM input ``[sos] + text + [task] + prompt speech tokens`` as input-layout ids, derive
``min_len = 2 x`` / ``max_len = 20 x`` the text tokens, build the sampler's pure logit rules
(:func:`specli.core.sampling.build_sampler`, every stop id merged into eos) and decode with
``greedy_decode`` (AR) or ``speculative_decode`` (a drafter; lossless for the chosen sampler). Each
request draws from its own generator seeded from ``(seed, request id)``.

:meth:`Synthesizer.synthesize_batch` decodes several requests together (continuous batching,
``core/batched.py``) with the same per-request rules, generator and verification, so a request's
tokens do not depend on the batch size or on the other requests: a model drafter (DSpark / DFlash /
EAGLE-3) drafts each row from that row's own states; the n-gram pool drafter shares the run's pool only
with the greedy sampler (drafts never change greedy tokens); with a sampler each
request drafts from its own tokens only, because sampled speculative tokens depend on the drafts (the
random draws are the same, the accept tests differ). The one exception is a near-tie: batched matrix
products can move a logit by ~1e-7, which flips a greedy top-2 tie or a sample whose uniform lies that
close to a boundary of the sampler's CDF (tests/test_synthesis_batch.py checks every difference is one).

With ``SynthesisOptions.split`` (the CLI's), a request too long for the model's positions is spoken in pieces
(:mod:`specli.tts.split`: sentences, then clauses, then words, packed while they fit), and so is one of more words
than the voice's ``max_piece_words`` (sentences and clauses only), each decoded as a request
of its own (id ``<id>#<k>``, its own generator), their tokens joined into the request's one result
(:attr:`SynthesisResult.pieces` keeps where they meet, so the audio stages render each piece as upstream does).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import get_args

import torch

from specli.core.batched import RowJob, decode_all
from specli.core.drafters.base import Drafter
from specli.core.drafters.batched import batch_drafter
from specli.core.drafters.registry import DRAFTERS
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob
from specli.core.device import resolve_device
from specli.core.sampling import SamplerName, SamplerOptions, build_sampler, default_options, request_generator
from specli.core.speculative import SpecOptions, speculative_decode
from specli.models.cosyvoice.lm import CosyVoiceModel
from specli.models.registry import family
from specli.models.cosyvoice.text import CV3_DEFAULT_PROMPT, ENDOFPROMPT, TextTokenizerError
from specli.core.types import DecodeResult, DecodeStats, accumulate
from specli.errors import SpecliError
from specli.presets.draft import DraftSpec
from specli.presets.synthesis import SYNTHESIS_DRAFT, SynthesisPreset
from specli.tts import drafters  # registers the synthesis drafter kinds
from specli.tts.split import Unsplittable, short_pieces, split_to_fit


class SynthesisInputError(SpecliError):
    """One request cannot be synthesized (empty, too long, untokenizable, bad prompt); the batch goes on."""

    exit_code = 1


class TooLongError(SynthesisInputError):
    """A request's text allows more speech tokens than the model has positions for."""


@dataclass(frozen=True)
class SynthesisRequest:
    """One utterance to speak."""

    id: str  # output name and generator key
    text: str  # the text to speak
    prompt_text: str = ""  # transcript of the prompt speech (CosyVoice3: must contain <|endofprompt|>)
    prompt_tokens: tuple[int, ...] = ()  # speech tokens of the prompt audio (zero-shot voice)

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("a synthesis request needs an id")
        object.__setattr__(self, "prompt_tokens", tuple(int(t) for t in self.prompt_tokens))


@dataclass(frozen=True)
class PreparedRequest:
    """A request turned into LM input ids and length limits."""

    prompt: list[int]  # input-layout ids: [sos] + text + [task] + prompt speech tokens
    text_tokens: int  # tokens of the text to speak (prompt text not counted)
    min_len: int  # fewer generated tokens cannot stop (upstream's masking rule)
    max_len: int  # most generated tokens


@dataclass(frozen=True)
class SynthesisOptions:
    """How speech tokens are generated."""

    sampler: SamplerOptions = SamplerOptions("ras")  # ras / vllm / greedy and their settings
    seed: int = 0  # run seed; each request's generator is seeded from (seed, request id)
    # the drafter (a kind of specli.tts.drafters: none = plain AR, pool, dspark / dflash / eagle3 / model from
    # draft_dir) and its strategy, max_draft, ngram and max_draft_rows (batched synthesis drafts only while at
    # most that many requests are in flight; on the CPU a drafted batched step is dearer than a plain one:
    # docs/benchmarks/voice-speculative-tree)
    draft: DraftSpec = SYNTHESIS_DRAFT
    split: bool = False  # a request too long for the model is spoken in sentence / clause / word pieces (joined);
    # False: it fails as too long

    def __post_init__(self) -> None:
        drafters.check_draft(self.draft)

    def spec_options(self) -> SpecOptions:
        """The speculation settings of every decode (single or batched)."""
        return SpecOptions(max_draft=self.draft.max_draft, max_draft_rows=self.draft.max_draft_rows or None)


@dataclass(frozen=True)
class SynthesisResult:
    """The speech tokens of one request and how they were decoded."""

    id: str  # the request's id
    text: str  # the text spoken
    tokens: list[int]  # generated speech tokens (stop token excluded)
    text_tokens: int  # text tokens (prompt text not counted)
    min_len: int  # minimum generated tokens
    max_len: int  # maximum generated tokens
    finished: bool  # True when a stop token ended it, False when max_len did (a split request: every piece's)
    stats: DecodeStats = field(default_factory=DecodeStats)
    pieces: tuple[int, ...] = ()  # a request spoken in pieces: the tokens of each, in order (sum = len(tokens))

    def segments(self) -> list[tuple[str, list[int]]]:
        """``(piece id, its tokens)`` of each piece (one: ``(id, tokens)``); a piece id keys its own generators."""
        if not self.pieces:
            return [(self.id, self.tokens)]
        out, start = [], 0
        for k, n in enumerate(self.pieces, 1):
            out.append((piece_id(self.id, k), self.tokens[start:start + n]))
            start += n
        return out


def piece_id(request_id: str, k: int) -> str:
    """The id of the ``k``-th piece (from 1) of a request spoken in pieces."""
    return f"{request_id}#{k}"


def prepare(model: CosyVoiceModel, request: SynthesisRequest) -> PreparedRequest:
    """Tokenize and lay out one request; :class:`SynthesisInputError` says what is wrong with it."""
    spec, tok = model.spec, model.tokenizer
    if not request.text.strip():
        raise SynthesisInputError("empty text")
    try:
        text = tok.encode(request.text)
        prompt_text = request.prompt_text
        if spec.kind == "cosyvoice3" and not prompt_text and tok.endofprompt not in text:
            prompt_text = CV3_DEFAULT_PROMPT  # as prompt text: not counted in the length limits
        ptext = tok.encode(prompt_text) if prompt_text else []
    except TextTokenizerError as exc:
        raise SynthesisInputError(str(exc)) from exc
    if not text:
        raise SynthesisInputError("the text has no tokens")
    if spec.kind == "cosyvoice3" and tok.endofprompt not in (*ptext, *text):
        raise SynthesisInputError(f"CosyVoice3 needs {ENDOFPROMPT} in the prompt text "
                                  f"(e.g. '{CV3_DEFAULT_PROMPT}<transcript>')")
    try:
        prompt = model.lm.layout.prompt(text, ptext, request.prompt_tokens)
    except ValueError as exc:
        raise SynthesisInputError(str(exc)) from exc
    min_len, max_len = spec.lengths(len(text))
    limit = model.lm.qwen.dims.max_positions
    if len(prompt) + max_len + 2 > limit:
        raise TooLongError(f"too long: {len(text)} text tokens allow {max_len} speech tokens, and with "
                                  f"the {len(prompt)}-token prompt that exceeds the model's {limit} positions")
    return PreparedRequest(prompt, len(text), min_len, max_len)


class Synthesizer:
    """A loaded CosyVoice LM, its sampler and (optionally) a drafter, reused across requests."""

    def __init__(self, model: CosyVoiceModel, options: SynthesisOptions = SynthesisOptions()) -> None:
        self.model, self.options = model, options
        spec = options.draft  # a sampled pool drafts from each request's own tokens (see the module doc)
        self.drafter: Drafter | None = None if spec.drafter == "none" else DRAFTERS.build(
            drafters.TASK, spec.drafter, model, spec, greedy=options.sampler.greedy)

    def _job(self, request: SynthesisRequest, prep: PreparedRequest, device: torch.device) -> DecodeJob:
        """The decode of one prepared request: its sampler's rules and parameters, its own generator."""
        spec, opts = self.model.spec, self.options
        rules, params = build_sampler(opts.sampler, prompt_tokens=request.prompt_tokens,
                                      stop_ids=list(spec.stop_ids), min_len_mask_id=spec.min_length_mask_id,
                                      min_len=prep.min_len, stop_into=spec.eos)
        return DecodeJob(tuple(prep.prompt), rules, spec.eos, prep.max_len, sampling=params,
                         generator=request_generator(opts.seed, request.id, device))

    def pieces(self, request: SynthesisRequest) -> list[tuple[SynthesisRequest, PreparedRequest]]:
        """``request`` prepared; with ``split``, in pieces (requests of their own, ids ``<id>#<k>``), each prepared:
        a line longer than the voice's ``max_piece_words`` (:func:`short_pieces`), and a piece too long for the
        model (:meth:`_fitting`). :class:`SynthesisInputError` says what is wrong (a piece that cannot be cut
        further: too long)."""
        split = self.options.split and ENDOFPROMPT not in request.text  # a prompt inside the text is not cut
        texts = short_pieces(request.text, self.model.spec.max_piece_words) if split else [request.text]
        tried: dict[str, PreparedRequest | None] = {}  # piece text -> prepared (None: too long): tokenized once
        if len(texts) == 1:
            try:
                return [(request, prepare(self.model, request))]
            except TooLongError:
                if not split:
                    raise
                tried[request.text] = None
        texts = [piece for text in texts for piece in self._fitting(request, text, tried)]
        parts = [replace(request, id=piece_id(request.id, k), text=t) for k, t in enumerate(texts, 1)]
        return [(r, tried.get(r.text) or prepare(self.model, r)) for r in parts]

    def _fitting(self, request: SynthesisRequest, text: str, tried: dict[str, PreparedRequest | None]) -> list[str]:
        """``text`` (of ``request``) in pieces that each fit the model (:func:`split_to_fit`); each piece tried is
        recorded in ``tried``."""

        def fits(piece: str) -> bool:
            if piece in tried:
                return tried[piece] is not None
            try:
                tried[piece] = prepare(self.model, replace(request, text=piece))
            except TooLongError:
                tried[piece] = None
                return False
            except SynthesisInputError:
                return True  # its own error is reported when the piece is prepared
            return True

        try:
            return split_to_fit(text, fits)
        except Unsplittable as exc:
            try:
                prepare(self.model, replace(request, text=exc.part))
            except TooLongError as too_long:
                raise TooLongError(f"{too_long} (a part of {len(exc.part)} characters with no sentence, clause or "
                                   "word boundary to split it at)") from None
            raise

    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        """Speech tokens for ``request`` (raises :class:`SynthesisInputError` for a bad request); in pieces when
        ``split`` and too long (:meth:`pieces`)."""
        return joined(request, [self._decode(r, prep) for r, prep in self.pieces(request)])

    def _decode(self, request: SynthesisRequest, prep: PreparedRequest) -> SynthesisResult:
        """Decode one prepared request (or piece)."""
        lm, opts = self.model.lm, self.options
        state = lm.start(len(prep.prompt) + prep.max_len + 2)
        job = self._job(request, prep, state.cache.device)
        if self.drafter is None:
            res = greedy_decode(lm, state, job)
        else:
            res = speculative_decode(lm, state, job, self.drafter, opts.spec_options())
        return _result(request, prep, res)

    def synthesize_batch(self, requests: Sequence[SynthesisRequest], batch_size: int
                         ) -> Iterator[tuple[int, SynthesisResult | SynthesisInputError]]:
        """Every request, up to ``batch_size`` decoding together (rows join as others finish): ``(index,
        error)`` for a bad request first, then ``(index, result)`` as rows finish. A request's tokens are
        :meth:`synthesize`'s (see the module doc for near-ties)."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        device = self.model.lm.qwen.device
        jobs, rows, counts = [], [], {}  # rows[j]: (request index, piece request, prepared) of job j
        for i, request in enumerate(requests):
            try:
                pieces = self.pieces(request)
            except SynthesisInputError as exc:
                yield i, exc
                continue
            counts[i] = len(pieces)
            for piece, prep in pieces:
                jobs.append(RowJob(len(rows), None, self._job(piece, prep, device)))
                rows.append((i, piece, prep))
        if not jobs:
            return
        longest = max(len(j.job.prompt) + j.job.max_new_tokens + 2 for j in jobs)
        if self.drafter is not None:  # a request decoded before by synthesize() joins a shared pool
            self.drafter.finish_window()
        drafter = None if self.drafter is None else batch_drafter(self.drafter, batch_size)  # one fork a row
        done: dict[int, dict[int, SynthesisResult]] = {}  # request index -> its finished pieces by job
        for j, res in decode_all(self.model.lm, jobs, batch_size, longest, drafter=drafter,
                                 options=self.options.spec_options()):
            i, piece, prep = rows[j]
            done.setdefault(i, {})[j] = _result(piece, prep, res)
            if len(done[i]) == counts[i]:
                finished = done.pop(i)
                yield i, joined(requests[i], [finished[k] for k in sorted(finished)])

    def finish(self) -> None:
        """Add the last request's output to the drafter's pool (end of a run)."""
        if self.drafter is not None:
            self.drafter.finish_window()


def _result(request: SynthesisRequest, prep: PreparedRequest, res: DecodeResult) -> SynthesisResult:
    return SynthesisResult(request.id, request.text, list(res.tokens), prep.text_tokens, prep.min_len, prep.max_len,
                           res.finished, res.stats)


def joined(request: SynthesisRequest, parts: Sequence[SynthesisResult]) -> SynthesisResult:
    """The result of ``request`` from its pieces' (in order): tokens, lengths and counters added up."""
    if len(parts) == 1:
        return parts[0]
    stats = DecodeStats()
    for part in parts:
        accumulate(stats, part.stats)
    return SynthesisResult(request.id, request.text, [t for p in parts for t in p.tokens],
                           sum(p.text_tokens for p in parts), sum(p.min_len for p in parts),
                           sum(p.max_len for p in parts), all(p.finished for p in parts), stats,
                           tuple(len(p.tokens) for p in parts))


def synthesize(model: CosyVoiceModel, requests: Sequence[SynthesisRequest],
               options: SynthesisOptions = SynthesisOptions()) -> list[SynthesisResult]:
    """Speech tokens for every request, in order (a bad request raises)."""
    synth = Synthesizer(model, options)
    return [synth.synthesize(r) for r in requests]


def sampler_options(name: str, model: CosyVoiceModel, temperature: float | None = None, top_p: float | None = None,
                    top_k: int | None = None, repetition_penalty: float | None = None) -> SamplerOptions:
    """The sampler's settings: given values, else the model yaml's RAS settings (ras) or the published
    SpeechSpec settings for this model (vllm), else the sampler's defaults."""
    given = (temperature, top_p, top_k, repetition_penalty)
    if name == "vllm" and all(v is None for v in given):
        return default_options("vllm", model.spec.kind)
    if name == "ras":
        ras = model.spec.ras
        return SamplerOptions("ras", temperature, ras.top_p if top_p is None else top_p,
                              ras.top_k if top_k is None else top_k, repetition_penalty,
                              win_size=ras.win_size, tau_r=ras.tau_r)
    return SamplerOptions(name, *given)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PresetOverrides:
    """What a run sets over its synthesis preset when building a synthesizer (None: the preset's own).

    Sampler settings are not mixed across samplers: the preset's temperature / top-p / top-k / penalty apply
    only when the sampler is the preset's own; the sampler checks the settings' ranges once they are merged.
    """

    draft: str | None = None  # drafter name or draft directory ("none": no speculation)
    sampler: str | None = None  # sampler name (greedy, ras or vllm)
    temperature: float | None = None  # sampling temperature
    top_p: float | None = None  # nucleus cut-off
    top_k: int | None = None  # top-k cut-off
    repetition_penalty: float | None = None  # penalty on repeated speech tokens
    seed: int = 0  # seed of every request's generator

    def __post_init__(self) -> None:
        if self.sampler is not None and self.sampler not in get_args(SamplerName):
            raise ValueError(f"unknown sampler {self.sampler!r}: choose {', '.join(get_args(SamplerName))}")


@dataclass(frozen=True)
class LoadOptions:
    """What a run sets over its synthesis preset when loading (None: the preset's own)."""

    model: str | None = None  # model directory or hub id (None: the preset's model)
    device: str | None = None  # torch device ("cpu", "cuda", ...; None: the preset's)
    overrides: PresetOverrides = PresetOverrides()  # drafter, sampler and its settings, seed


def load_synthesizer(preset: SynthesisPreset, options: LoadOptions = LoadOptions()) -> Synthesizer:
    """Load the preset's CosyVoice LM (or ``options.model``) on ``options.device`` (default: the preset's) and
    build its synthesizer; set options override the preset."""
    o = options
    loaded = family(preset.family).load(o.model or preset.model, preset.dtype,
                                        device=resolve_device(o.device or preset.device))
    return build_synthesizer(preset, loaded, o.overrides)


def build_synthesizer(preset: SynthesisPreset, loaded: CosyVoiceModel,
                      overrides: PresetOverrides = PresetOverrides()) -> Synthesizer:
    """A synthesizer for ``preset`` over an already loaded model (a new drafter pool each call), with
    ``overrides`` over the preset's settings."""
    o = overrides
    name = o.sampler or preset.sampler
    own = name == preset.sampler
    pick = lambda cli, pre: cli if cli is not None else (pre if own else None)  # noqa: E731
    opts = sampler_options(name, loaded, pick(o.temperature, preset.temperature), pick(o.top_p, preset.top_p),
                           pick(o.top_k, preset.top_k), pick(o.repetition_penalty, preset.repetition_penalty))
    return Synthesizer(loaded, SynthesisOptions(opts, o.seed, drafters.run_draft(preset.draft, o.draft), split=True))
