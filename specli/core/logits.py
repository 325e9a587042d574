"""The one logit filter: model rules, repetition penalty, temperature, top-k, top-p.

Target (plain decoding), verifier and drafters all call :func:`filter_logits` with the same
parameters and each row's own sampled prefix, so every scored position sees exactly the
distribution plain decoding would have sampled from.

A drafter with a draft vocabulary (EAGLE-3 style: its LM head keeps only some rows) filters its
logits in that vocabulary (``vocab=``): the result equals filtering the row scattered into the full
vocabulary (``-inf`` elsewhere) and keeping the draft columns, without the 51,865-column detour.
"""

from __future__ import annotations

import functools
import inspect
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from specli.core.device import host_to_device
from specli.core.types import LogitRules

NEG_INF = float("-inf")


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen from the filtered logits; validated at construction."""

    temperature: float = 0.0  # 0 picks the argmax (greedy); > 0 samples
    top_k: int = 0  # keep the k most likely tokens; 0 turns it off
    top_p: float = 1.0  # keep the smallest set whose probability reaches p; 1 turns it off
    repetition_penalty: float = 1.0  # divide (multiply, if negative) logits of tokens already sampled

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingParams()


class DraftVocab:
    """The token ids that the columns of a draft-vocabulary logit row stand for (column ``c`` is
    token ``ids[c]``), with host-side lookups so a rule maps id ranges and id lists to columns."""

    def __init__(self, ids: torch.Tensor, size: int | None = None) -> None:
        host = ids.tolist()
        if any(a >= b for a, b in zip(host, host[1:])) or (host and host[0] < 0):
            raise ValueError("draft vocabulary ids must be sorted, unique and >= 0")
        self.ids = ids.long()  # [Vd] token id of each column, sorted ascending
        self.size = int(size) if size is not None else (host[-1] + 1 if host else 0)  # full vocabulary size
        if host and host[-1] >= self.size:
            raise ValueError(f"draft vocabulary id {host[-1]} outside a vocabulary of {self.size}")
        self.host = host  # the ids as a Python list (bisect lookups, column -> token id)
        self._columns: dict[tuple[int, ...], torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.host)

    def span(self, lo: int, hi: int | None = None) -> slice:
        """The columns of token ids in ``[lo, hi)`` (``hi=None``: to the end), as a slice."""
        stop = len(self.host) if hi is None else bisect_left(self.host, hi)
        return slice(bisect_left(self.host, lo), stop)

    def column(self, token: int) -> int | None:
        """The column of ``token``, or None when it is not in the draft vocabulary."""
        c = bisect_left(self.host, token)
        return c if c < len(self.host) and self.host[c] == token else None

    def columns(self, tokens: Iterable[int]) -> list[int]:
        """The columns of those ``tokens`` that are in the draft vocabulary (others dropped)."""
        return [c for c in map(self.column, tokens) if c is not None]

    def column_index(self, tokens: tuple[int, ...]) -> torch.Tensor:
        """``columns(tokens)`` as a LongTensor on the ids' device, cached per ``tokens`` tuple."""
        idx = self._columns.get(tokens)
        if idx is None:
            idx = self._columns[tokens] = host_to_device(self.columns(tokens), torch.long, self.ids.device)
        return idx

    def to_full(self, x: torch.Tensor, fill: float = NEG_INF) -> torch.Tensor:
        """``x [..., Vd]`` scattered into the full vocabulary ``[..., V]``, ``fill`` elsewhere."""
        full = x.new_full((*x.shape[:-1], self.size), fill)
        return full.index_copy_(-1, self.ids.to(x.device), x)


def as_vocab(vocab: DraftVocab | torch.Tensor | None) -> DraftVocab | None:
    """``vocab`` as a :class:`DraftVocab` (a bare sorted id tensor: vocabulary size ``ids[-1] + 1``,
    its lookups rebuilt on every call: hot paths pass a :class:`DraftVocab` built once)."""
    return vocab if vocab is None or isinstance(vocab, DraftVocab) else DraftVocab(vocab)


def vocab_span(vocab: DraftVocab | None, lo: int, hi: int | None = None) -> slice:
    """Columns of token ids ``[lo, hi)`` in a full row (``vocab=None``) or a draft-vocabulary row."""
    return slice(lo, hi) if vocab is None else vocab.span(lo, hi)


def vocab_columns(vocab: DraftVocab | None, tokens: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Column index ``[k]`` of ``tokens`` in a full row, or of those present in a draft-vocabulary row."""
    return host_to_device(list(tokens), torch.long, device) if vocab is None else vocab.column_index(tokens)


def filter_logits(
    logits: torch.Tensor,  # [n, vocab] raw logits of n scored rows ([n, Vd] with a draft vocabulary)
    prefixes: Sequence[Sequence[int]],  # sampled tokens before each row
    rules: LogitRules | None,
    params: SamplingParams = GREEDY,
    vocab: DraftVocab | torch.Tensor | None = None,  # token ids of the columns; None: the full vocabulary
) -> torch.Tensor:
    """Filtered logits ``[n, vocab]`` (float32); ``softmax`` of them is the sampling distribution.

    With ``vocab`` the columns stand for those token ids only and the result equals
    ``filter_logits(scattered, ...)[:, ids]`` with ``scattered`` the row in the full vocabulary,
    ``-inf`` outside ``ids``. Rules whose ``__call__`` takes ``vocab`` work on the columns directly;
    others see the scattered row.
    """
    vocab = as_vocab(vocab)
    x = logits.float()
    if rules is None:
        x = x.clone()
    elif vocab is None:
        x = rules(x, prefixes)
    elif takes_vocab(rules):
        x = rules(x, prefixes, vocab=vocab)
    else:
        x = rules(vocab.to_full(x), prefixes).index_select(-1, vocab.ids.to(x.device))
    if params.repetition_penalty != 1.0:
        for i, prefix in enumerate(prefixes):
            if prefix:
                ids = sorted(set(prefix))
                idx = host_to_device(ids if vocab is None else vocab.columns(ids), torch.long, x.device)
                seen = x[i, idx]
                x[i, idx] = torch.where(seen > 0, seen / params.repetition_penalty, seen * params.repetition_penalty)
    if params.greedy:
        return x
    x = x / params.temperature
    if params.top_k and params.top_k < x.shape[-1]:
        kth = x.topk(params.top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, NEG_INF)
    if params.top_p < 1.0:
        x = _top_p(x, params.top_p)
    return x


@dataclass(frozen=True)
class Filtered:
    """Filtered logits and their log-probabilities at temperature 1 (Whisper's ``avg_logprob`` and the fallback rule
    read those), from ONE log_softmax where the rules computed it already (:func:`filter_with_logprobs`)."""

    logits: torch.Tensor  # [n, vocab] filtered logits, as filter_logits returns them
    logprobs: torch.Tensor  # [n, vocab] log_softmax(unit_temperature(logits)) bit for bit on every row not ``stale``
    stale: torch.Tensor | None  # [n] bool: rows the rules changed after their log_softmax; None: no such row
    params: SamplingParams  # the sampling parameters the logits were filtered with

    @classmethod
    def of(cls, filtered: torch.Tensor, params: SamplingParams) -> Filtered:
        """``filtered [n, vocab]`` with its own log_softmax (no shared one)."""
        return cls(filtered, torch.log_softmax(unit_temperature(filtered, params), -1), None, params)

    def exact(self) -> torch.Tensor:
        """``logprobs [n, vocab]`` exact on every row: the stale rows recomputed from the filtered logits (one host
        check of the stale flags; beam search reads whole rows, not picked tokens)."""
        if self.stale is None:
            return self.logprobs
        rows = self.stale.nonzero().squeeze(1)  # [s]
        if rows.numel() == 0:
            return self.logprobs
        out = self.logprobs.clone()
        out[rows] = self._recomputed(rows)
        return out

    def _recomputed(self, rows: torch.Tensor) -> torch.Tensor:
        """``log_softmax`` at temperature 1 of the filtered logits of ``rows [s]`` -> ``[s, vocab]``."""
        return torch.log_softmax(unit_temperature(self.logits.index_select(0, rows), self.params), -1)

    def pick(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``logprobs[rows, tokens]`` ``[k]`` then (with stale rows possible) each row's stale flag ``[k]``, float64
        on the device: the caller packs it into its one readback and hands the host values to :meth:`read`."""
        picked = self.logprobs[rows, tokens].double()
        return picked if self.stale is None else torch.cat([picked, self.stale[rows].double()])

    def read(self, host: Sequence[float], rows: Sequence[int], tokens: Sequence[int]) -> list[float]:
        """The ``k`` log-probabilities of :meth:`pick`'s readback ``host``; those on stale rows recomputed from the
        filtered logits (a second readback, only on a step where a rule changed a row after its log_softmax)."""
        k = len(rows)
        values = [float(v) for v in host[:k]]
        redo = [] if self.stale is None else [i for i in range(k) if host[k + i]]
        if redo:
            fix = sorted({rows[i] for i in redo})
            at = host_to_device(fix, torch.long, self.logits.device)
            exact = self._recomputed(at)
            got = exact[[fix.index(rows[i]) for i in redo], [tokens[i] for i in redo]].tolist()
            for i, v in zip(redo, got):
                values[i] = v
        return values


def filter_with_logprobs(
    logits: torch.Tensor,  # [n, vocab] raw logits of n scored rows (full vocabulary)
    prefixes: Sequence[Sequence[int]],  # sampled tokens before each row
    rules: LogitRules | None,
    params: SamplingParams = GREEDY,
) -> Filtered:
    """:func:`filter_logits` and the log-probabilities of the result at temperature 1 (``log_softmax`` of
    :func:`unit_temperature` of it). Greedy rows without a repetition penalty share the rules' own log_softmax when the
    rules offer it (``rules.with_logprobs(logits, prefixes) -> (masked, logprobs or None, stale or None)``: Whisper's
    timestamp rule takes one to decide its forcing), so a step computes one log_softmax instead of two."""
    shared = getattr(rules, "with_logprobs", None) if params.greedy and params.repetition_penalty == 1.0 else None
    if shared is not None:
        masked, logprobs, stale = shared(logits.float(), prefixes)
        if logprobs is not None:
            return Filtered(masked, logprobs, stale, params)
        return Filtered.of(masked, params)  # filter_logits' result: greedy without a penalty changes nothing more
    return Filtered.of(filter_logits(logits, prefixes, rules, params), params)


def unit_temperature(filtered: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Filtered logits ``[..., vocab]`` undivided by the temperature: Whisper's log-probabilities
    (and so ``avg_logprob`` and the fallback rule) are those of the distribution at temperature 1."""
    return filtered if params.greedy else filtered * params.temperature


@dataclass(frozen=True)
class LogitFilter:
    """:func:`filter_logits` with one sequence's rules and sampling parameters: what drafters call (as a function of
    logits and prefixes, ``vocab=`` included) and what verification calls with log-probabilities
    (:meth:`with_logprobs`)."""

    rules: LogitRules | None  # the sequence's logit rules
    params: SamplingParams = GREEDY  # how its tokens are chosen

    def __call__(self, logits: torch.Tensor, prefixes: Sequence[Sequence[int]],
                 vocab: DraftVocab | torch.Tensor | None = None) -> torch.Tensor:
        return filter_logits(logits, prefixes, self.rules, self.params, vocab)

    def with_logprobs(self, logits: torch.Tensor, prefixes: Sequence[Sequence[int]]) -> Filtered:
        return filter_with_logprobs(logits, prefixes, self.rules, self.params)


def takes_vocab(rules: LogitRules) -> bool:
    """Whether ``rules`` filters a draft-vocabulary row itself (its call takes a ``vocab`` keyword)."""
    if inspect.ismethod(rules):
        call = rules.__func__
    else:
        call = rules if inspect.isfunction(rules) else type(rules).__call__
    return _has_vocab_parameter(call)  # cached per function: hashable whatever the rules object is


@functools.lru_cache(maxsize=256)
def _has_vocab_parameter(call) -> bool:
    try:
        return "vocab" in inspect.signature(call).parameters
    except (TypeError, ValueError):  # no signature (builtins): the scattered row
        return False


def _top_p(x: torch.Tensor, top_p: float) -> torch.Tensor:
    # stable: tied tokens keep id order, so a draft-vocabulary row drops exactly what the full row drops
    sorted_x, order = x.sort(dim=-1, descending=True, stable=True)
    probs = sorted_x.softmax(-1)
    before = probs.cumsum(-1) - probs  # mass of strictly more likely tokens
    drop_sorted = before >= top_p  # the most likely token is always kept
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return x.masked_fill(drop, NEG_INF)


def choose(filtered: torch.Tensor, params: SamplingParams, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """Tokens ``[n]`` from filtered rows: argmax, or inverse-CDF sampling with the given uniforms."""
    if params.greedy:
        return filtered.argmax(-1)
    if uniform is None:
        raise ValueError("sampling needs uniforms")
    return sample_inverse_cdf(filtered.softmax(-1), uniform)


def sample_inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Index ``[n]`` of ``probs [n, vocab]`` (unnormalised is fine) at CDF position ``uniform [n]``."""
    cdf = probs.cumsum(-1)
    point = (uniform.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, point, right=True).squeeze(-1)
    return idx.clamp(max=probs.shape[-1] - 1)
