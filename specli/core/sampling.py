"""Samplers for speech-token targets (CosyVoice RAS, vLLM-style, greedy) as pure logit rules.

:func:`build_sampler` turns :class:`SamplerOptions` and one request's facts (prompt tokens, stop ids,
minimum length) into what the decode loops already take: a :class:`~specli.core.types.LogitRules`
(``rules(logits [n, V], prefixes) -> [n, V]``) and a :class:`~specli.core.logits.SamplingParams`.
The rules are a pure function of the raw logits and each row's sampled prefix, so plain decoding,
verification and every drafter (through ``DraftRequest.filter``) see the same distribution at every
position; a draft row's prefix is the accepted tokens plus the earlier drafts of its own path.

For the sampling samplers the rules return the *final* log-probabilities and the params are
``SamplingParams(temperature=1.0)`` (``filter_logits`` changes nothing after them); ``softmax`` of a
row is exactly the distribution the upstream procedure samples from, so speculative verification
with ``min(1, p/q)`` and the residual ``(p - q)+`` keeps that procedure's output distribution.

* ``ras`` -- CosyVoice2/3's repetition-aware sampling (``cosyvoice/utils/common.py``): draw ``x`` from
  the nucleus ``N`` (stable descending sort of the softmax; keep tokens while the mass before them
  is ``< top_p`` and fewer than ``top_k`` are kept, so the crossing token is included); when ``x``
  occurs at least ``win_size * tau_r`` times in the last ``win_size`` *generated* tokens, set its
  score to ``-inf`` and draw from the full softmax ``p``. Its distribution in closed form, with ``R``
  the set of such repeated tokens::

      p_RAS(x) = N(x) [x not in R] + sum_{y in R} N(y) p(x) [x != y] / (1 - p(y))

  Minimum length (``Qwen2LM.sampling_ids``): while fewer than ``min_len`` tokens were generated,
  upstream sets ``score[speech_token_size] = -inf`` *before* RAS, so the nucleus and the fallback
  softmax both see the id masked (``min_len_rule="mask"``, the pinned upstream). That id is eos for
  CosyVoice2 but sos for CosyVoice3, whose eos stays allowed: pass ``min_len_mask_id`` accordingly.
  Earlier CosyVoice2 code (``Qwen2LM.sampling_ids`` as still found in copies of it) instead looped
  ``while True: x = sampling(...); if not ignore_eos or x < speech_token_size: break`` (raising after
  100 retries), i.e. it rejected every stop id: pass them all as ``min_len_mask_id``. Its trials are
  independent, so its output is RAS *conditioned* on ``x not in M``: ``p_RAS(x) [x not in M] /
  (1 - p_RAS(M))`` -- nucleus and fallback computed with the ids present, then the row renormalised
  (``min_len_rule="retry"``). Where upstream would raise (all mass on ``M``) the row is left unmasked
  here. That code's RAS fallback also drew from the full softmax, the repeated token included
  (``ras_fallback="full"``: ``N(x) [x not in R] + p(x) sum_{y in R} N(y)``), so
  ``SamplerOptions("ras", min_len_rule="retry", ras_fallback="full")`` reproduces it. (The current
  fallback writes ``-inf`` into the scores in place; it is never combined with the retry loop
  upstream, whose trials would then not be independent, and specli does not model that mix.)
* ``vllm`` -- vLLM's sampler as SpeechSpec runs it: min-tokens masking of the stop ids, repetition
  penalty on raw logits over prompt ∪ output tokens (``logit > 0`` divided, else multiplied),
  temperature, top-k, top-p (``filter_logits`` does the last three; equal to vLLM's up to float
  rounding and tie order at the top-p boundary). Temperature 0 is argmax.
* ``greedy`` -- argmax of the logits, with the same minimum-length masking as ``ras``.

Stop ids: the decode loops stop on one ``eot`` id. ``build_sampler(..., stop_into=e)`` merges every
stop id into ``e`` (probability mass summed; for argmax the largest stop logit), which leaves the
distribution of the generated speech tokens and of the stopping step unchanged.

Randomness: one ``torch.Generator`` per request, seeded by :func:`request_seed` from the run's seed
and the request's id, on the device of the request's cache (``generator=request_generator(seed, key,
device)`` for ``greedy_decode`` and ``speculative_decode``, which also hands it to the drafter), so a
run is reproducible whatever the batch order.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

from specli.core.logits import GREEDY, SamplingParams, filter_logits
from specli.core.types import LogitRules

SamplerName = Literal["ras", "vllm", "greedy"]
MinLenRule = Literal["mask", "retry"]
RasFallback = Literal["exclude", "full"]
NEG_INF = float("-inf")

_DEFAULTS = {  # name -> (temperature, top_p, top_k, repetition_penalty)
    "ras": (1.0, 0.8, 25, 1.0),
    "vllm": (1.0, 1.0, 0, 1.0),
    "greedy": (0.0, 1.0, 0, 1.0),
}


@dataclass(frozen=True)
class SamplerOptions:
    """How speech tokens are chosen; ``None`` fields take the sampler's default at construction."""

    name: SamplerName = "ras"  # ras: CosyVoice's repetition-aware sampling; vllm: vLLM's sampler; greedy: argmax
    temperature: float | None = None  # vllm only (0 = argmax); default 1.0 (ras has none, greedy is 0)
    top_p: float | None = None  # nucleus mass; default ras 0.8, vllm 1.0 (off)
    top_k: int | None = None  # nucleus size cap; default ras 25, vllm 0 (off)
    repetition_penalty: float | None = None  # vllm only, over prompt ∪ output tokens; default 1.0 (off)
    win_size: int = 10  # ras: how many of the last generated tokens the repetition check reads
    tau_r: float = 0.1  # ras: resample when the token occurs >= win_size * tau_r times in that window
    min_len_rule: MinLenRule = "mask"  # ras below min length: mask first (upstream), or retry (earlier CV2 code)
    ras_fallback: RasFallback = "exclude"  # ras resample: without the repeated token (upstream), or full softmax

    def __post_init__(self) -> None:
        if self.name not in _DEFAULTS:
            raise ValueError(f"unknown sampler {self.name!r}: choose ras, vllm or greedy")
        given = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                 "repetition_penalty": self.repetition_penalty}
        for (field, value), default in zip(given.items(), _DEFAULTS[self.name]):
            if value is None:
                object.__setattr__(self, field, default)
        self._check_ranges()
        if self.name == "ras" and (self.temperature != 1.0 or self.repetition_penalty != 1.0):
            raise ValueError("ras has no temperature or repetition penalty (use --sampler vllm)")
        if self.name == "greedy" and (self.temperature != 0.0 or self.top_p != 1.0 or self.top_k != 0
                                      or self.repetition_penalty != 1.0):
            raise ValueError("greedy takes no temperature, top-p, top-k or repetition penalty")
        if self.win_size < 1 or self.tau_r < 0:
            raise ValueError("win_size must be >= 1 and tau_r >= 0")
        if self.min_len_rule not in ("mask", "retry") or self.ras_fallback not in ("exclude", "full"):
            raise ValueError("min_len_rule must be 'mask' or 'retry', ras_fallback 'exclude' or 'full'")

    @property
    def greedy(self) -> bool:
        """Argmax decoding: the greedy sampler, or vllm at temperature 0."""
        return self.name == "greedy" or self.temperature == 0.0

    def _check_ranges(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 = off)")
        if self.name == "ras" and self.top_k < 1:
            raise ValueError("ras needs top_k >= 1")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")


RAS_COSYVOICE = SamplerOptions("ras")  # CosyVoice2/3 yaml: top_p 0.8, top_k 25, win_size 10, tau_r 0.1
VLLM_SPEECHSPEC_CV2 = SamplerOptions("vllm", temperature=0.8, top_p=0.95, top_k=50)  # SpeechSpec, CosyVoice2
VLLM_SPEECHSPEC_CV3 = SamplerOptions("vllm", top_k=15, repetition_penalty=1.1)  # SpeechSpec, CosyVoice3


def default_options(name: SamplerName, model: Literal["cosyvoice2", "cosyvoice3"] = "cosyvoice2") -> SamplerOptions:
    """The published settings of ``name`` for ``model`` (vllm: SpeechSpec's, which differ per model)."""
    if name == "vllm":
        return VLLM_SPEECHSPEC_CV3 if model == "cosyvoice3" else VLLM_SPEECHSPEC_CV2
    return SamplerOptions(name)


class Sampler(NamedTuple):
    """What ``greedy_decode`` / ``speculative_decode`` take: the rules and the sampling parameters."""

    rules: LogitRules
    params: SamplingParams


def build_sampler(
    options: SamplerOptions,
    *,
    prompt_tokens: Sequence[int] = (),
    stop_ids: Sequence[int] = (),
    min_len_mask_id: int | Sequence[int] | None = None,
    min_len: int = 0,
    stop_into: int | None = None,
) -> Sampler:
    """Rules and params for one request.

    ``prompt_tokens``: output-vocabulary ids in the prompt (vllm's repetition penalty counts them);
    ``stop_ids``: ids that end generation (vllm masks them while fewer than ``min_len`` tokens were
    generated); ``min_len_mask_id``: the id(s) ras/greedy mask below ``min_len`` (CosyVoice:
    ``speech_token_size``); ``stop_into``: merge every stop id into this one (see the module doc).
    """
    if min_len < 0:
        raise ValueError("min_len must be >= 0")
    if stop_into is not None and stop_into not in stop_ids:
        raise ValueError("stop_into must be one of stop_ids")
    mask_ids = (min_len_mask_id,) if isinstance(min_len_mask_id, int) else tuple(min_len_mask_id or ())
    greedy = options.greedy
    merge = _StopMerge(tuple(stop_ids), stop_into, greedy) if stop_into is not None else None
    if options.name == "ras":
        rules: LogitRules = RasRules(options, min_len, mask_ids, merge)
    elif options.name == "vllm":
        rules = VllmRules(options, min_len, tuple(stop_ids), tuple(sorted(set(prompt_tokens))), merge)
    else:
        rules = GreedyRules(min_len, mask_ids, merge)
    return Sampler(rules, GREEDY if greedy else SamplingParams(temperature=1.0))


@dataclass(frozen=True)
class _StopMerge:
    """Merge the stop ids into one: summed probability (sampling) or the largest logit (argmax)."""

    ids: tuple[int, ...]  # every stop id
    into: int  # the id that stands for all of them
    greedy: bool  # argmax rows: take the max logit instead of the summed mass

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x [n, V] logits or log-probs
        span = _as_span(self.ids)
        if span is not None:  # consecutive ids (CosyVoice: every id past the speech codes): slices, no index copies
            stops = x[:, span]  # [n, k]
            merged = stops.max(-1).values if self.greedy else stops.logsumexp(-1)
            out = x.clone()
            out[:, span] = NEG_INF
        else:
            idx = torch.tensor(self.ids, dtype=torch.long, device=x.device)
            stops = x.index_select(1, idx)  # [n, k]
            merged = stops.max(-1).values if self.greedy else stops.logsumexp(-1)
            out = x.index_fill(1, idx, NEG_INF)
        out[:, self.into] = merged
        return out


@functools.lru_cache(maxsize=64)
def _as_span(ids: tuple[int, ...]) -> slice | None:
    """``ids`` as a slice when they are consecutive and ascending (None otherwise)."""
    if ids and ids == tuple(range(ids[0], ids[0] + len(ids))):
        return slice(ids[0], ids[0] + len(ids))
    return None


@dataclass(frozen=True)
class RasRules:
    """CosyVoice's RAS (with its minimum-length masking) as log-probabilities ``[n, V]``."""

    options: SamplerOptions  # top_p, top_k, win_size, tau_r, min_len_rule
    min_len: int  # rows with fewer generated tokens mask ``mask_ids``
    mask_ids: tuple[int, ...]  # CosyVoice: (speech_token_size,), eos for CV2 and sos for CV3
    merge: _StopMerge | None = None  # merge the stop ids into one (or None)

    def __call__(self, logits: torch.Tensor, prefixes: Sequence[Sequence[int]]) -> torch.Tensor:
        o = self.options
        short = [len(p) < self.min_len for p in prefixes]
        scores = logits.double()
        if o.min_len_rule == "mask":
            scores = mask_rows(scores, short, self.mask_ids)
        probs = ras_probs(scores, prefixes, o.top_p, o.top_k, o.win_size, o.tau_r, o.ras_fallback == "exclude")
        if o.min_len_rule == "retry":
            probs = mask_rows(probs, short, self.mask_ids, fill=0.0)
            probs = probs / probs.sum(-1, keepdim=True)
        out = probs.log().float()  # float32 log-probabilities, -inf where a token cannot be drawn
        return self.merge(out) if self.merge is not None else out


@dataclass(frozen=True)
class VllmRules:
    """vLLM's sampler: min-tokens stop masking, repetition penalty over prompt ∪ output, T, top-k, top-p."""

    options: SamplerOptions  # temperature, top_k, top_p, repetition_penalty
    min_len: int  # vLLM's min_tokens: stop ids are masked while fewer tokens were generated
    stop_ids: tuple[int, ...]  # ids that end generation
    prompt_tokens: tuple[int, ...]  # prompt ids the repetition penalty counts (sorted, unique)
    merge: _StopMerge | None = None  # merge the stop ids into one (or None)

    def __call__(self, logits: torch.Tensor, prefixes: Sequence[Sequence[int]]) -> torch.Tensor:
        o = self.options
        x = mask_rows(logits.float(), [len(p) < self.min_len for p in prefixes], self.stop_ids)
        if o.repetition_penalty != 1.0:
            seen = token_mask(prefixes, x, extra=self.prompt_tokens)
            x = torch.where(seen, torch.where(x > 0, x / o.repetition_penalty, x * o.repetition_penalty), x)
        if o.temperature > 0.0:  # temperature, top-k, top-p: the shared filter's implementation
            x = filter_logits(x, prefixes, None, SamplingParams(o.temperature, o.top_k, o.top_p))
            x = x.log_softmax(-1)
        return self.merge(x) if self.merge is not None else x


@dataclass(frozen=True)
class GreedyRules:
    """Argmax logits with CosyVoice's minimum-length masking."""

    min_len: int  # rows with fewer generated tokens mask ``mask_ids``
    mask_ids: tuple[int, ...]  # CosyVoice: (speech_token_size,)
    merge: _StopMerge | None = None  # merge the stop ids into one (or None)

    def __call__(self, logits: torch.Tensor, prefixes: Sequence[Sequence[int]]) -> torch.Tensor:
        x = mask_rows(logits.float(), [len(p) < self.min_len for p in prefixes], self.mask_ids)
        return self.merge(x) if self.merge is not None else x


def mask_rows(x: torch.Tensor, rows: Sequence[bool], ids: Sequence[int], fill: float = NEG_INF) -> torch.Tensor:
    """``x [n, V]`` with ``ids`` set to ``fill`` in the flagged rows; a row that would lose every
    token (all its mass / finite logits on ``ids``) is left as it is."""
    flagged = [i for i, flag in enumerate(rows) if flag]
    if not ids or not flagged:
        return x
    out = x.clone()
    cols = list(ids) if len(ids) > 1 else ids[0]  # one id (CosyVoice's mask): a column, no index tensors
    if len(flagged) == x.shape[0]:
        out[:, cols] = fill
    else:
        out[torch.tensor(flagged, dtype=torch.long, device=x.device)[:, None], cols] = fill
    alive = (out > 0).any(-1) if fill == 0.0 else (out > NEG_INF).any(-1)
    return out if bool(alive.all()) else torch.where(alive[:, None], out, x)


def token_mask(prefixes: Sequence[Sequence[int]], like: torch.Tensor, extra: Sequence[int] = ()) -> torch.Tensor:
    """Bool ``[n, V]``: True where the token occurs in the row's prefix or in ``extra``."""
    seen = torch.zeros(like.shape, dtype=torch.bool, device=like.device)
    rows = [i for i in range(len(prefixes)) for _ in extra] + [i for i, p in enumerate(prefixes) for _ in p]
    if rows:
        toks = [t for _ in prefixes for t in extra] + [t for p in prefixes for t in p]
        index = torch.tensor([rows, toks], dtype=torch.long, device=like.device)
        seen[index[0], index[1]] = True
    return seen


def window_counts(prefixes: Sequence[Sequence[int]], like: torch.Tensor, win_size: int) -> torch.Tensor:
    """``[n, V]`` (dtype of ``like``): how often each token occurs in the row's last ``win_size`` tokens."""
    counts = torch.zeros(like.shape, dtype=like.dtype, device=like.device)
    rows = [i for i, prefix in enumerate(prefixes) for _ in list(prefix)[-win_size:]]
    if rows:
        toks = [t for prefix in prefixes for t in list(prefix)[-win_size:]]
        index = torch.tensor([rows, toks], dtype=torch.long, device=like.device)
        counts.index_put_((index[0], index[1]), torch.ones_like(index[0], dtype=like.dtype), accumulate=True)
    return counts


def nucleus_probs(scores: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """CosyVoice's nucleus distribution ``N [n, V]`` (float64) of ``scores [n, V]``.

    Upstream sorts the float32 softmax descending (stable), and walks it keeping a token while the
    running mass before it is ``< top_p`` and fewer than ``top_k`` were kept; the selection is
    monotone, so it is a prefix of the sorted order, computed here at once (float32 sums: equal to
    upstream's up to rounding when the running mass lands within ~1e-7 of ``top_p``).
    """
    p32 = scores.float().softmax(-1)
    sorted_p, order = p32.sort(dim=-1, descending=True, stable=True)
    before = torch.cumsum(sorted_p, -1).roll(1, -1)  # running mass before each token ...
    before[:, 0] = 0.0  # ... (exclusive prefix sum)
    rank = torch.arange(scores.shape[-1], device=scores.device)
    keep_sorted = (before < torch.tensor(top_p, dtype=torch.float32, device=scores.device)) & (rank < top_k)
    keep_sorted[:, 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    p = scores.double().softmax(-1)
    nucleus = torch.where(keep, p, torch.zeros_like(p))
    return nucleus / nucleus.sum(-1, keepdim=True)


def ras_probs(
    scores: torch.Tensor,  # [n, V] logits (or log-probs), -inf where masked
    prefixes: Sequence[Sequence[int]],  # generated tokens before each row
    top_p: float,
    top_k: int,
    win_size: int,
    tau_r: float,
    exclude: bool = True,  # the fallback masks the repeated token (upstream now); False: full softmax (older)
) -> torch.Tensor:
    """``p_RAS [n, V]`` (float64): the exact output distribution of CosyVoice's ``ras_sampling``."""
    p = scores.double().softmax(-1)
    nucleus = nucleus_probs(scores, top_p, top_k)
    repeated = window_counts(prefixes, p, win_size) >= win_size * tau_r  # upstream: rep_num >= win_size * tau_r
    if not exclude:  # N(x) [x not in R] + p(x) sum_{y in R} N(y)
        moved = torch.where(repeated, nucleus, torch.zeros_like(p))
        return nucleus - moved + p * moved.sum(-1, keepdim=True)
    rest = 1.0 - p  # mass left for the fallback draw once the repeated token is masked
    # a repeated token holding all the mass has no fallback (upstream would fail): it is kept
    resampled = repeated & (nucleus > 0) & (rest > 0)
    weight = torch.where(resampled, nucleus / rest.clamp(min=math.ulp(1.0)), torch.zeros_like(p))
    kept = torch.where(resampled, torch.zeros_like(p), nucleus)
    return kept + p * (weight.sum(-1, keepdim=True) - weight)


def request_seed(seed: int, key: str | int) -> int:
    """A 63-bit seed for one request from the run's ``seed`` and the request's id ``key``.

    Depends on nothing else (not the batch order or position), so ``--seed`` reproduces a run.
    """
    digest = hashlib.blake2b(f"{seed}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def request_generator(seed: int, key: str | int, device: torch.device | str = "cpu") -> torch.Generator:
    """The one seeded generator of a request (see :func:`request_seed`)."""
    return torch.Generator(device=device).manual_seed(request_seed(seed, key))
