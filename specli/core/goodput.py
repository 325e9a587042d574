"""Goodput-driven draft length: draft as many tokens as maximises expected committed tokens per second.

A speculative step that drafts ``k`` tokens commits ``1 + A(k)`` tokens on average (``A(k)``: the expected number
of accepted draft tokens) and costs ``k`` draft steps plus one target forward over ``k + 1`` tokens per row. Its
goodput is ``(1 + A(k)) / (k * c_draft + c_verify(rows, k + 1))``; plain decoding is ``k = 0``. With the drafter's
confidences ``p_1 .. p_k`` (the probability it gave each of its tokens), ``A(k) = sum_i prod_{j <= i} a_j`` with
``a_j`` the chance that token ``j`` is accepted given the earlier ones: ``p_j`` calibrated by what this decode has
accepted so far (SmartSpec's goodput-based length, SpecASR's confidence-adaptive length).

The costs are measured where specli runs (:class:`OnlineCosts`: moving averages of the decode loop's own timings,
per batch rows and scored tokens, starting from a prior) or given (:class:`FixedCosts`, tests and cached tables).
Drafting stops when one more token lowers the goodput, and does not start when even a likely first token
does not pay: on a CPU where verifying 2 tokens costs twice one, or batched rows that make every forward
expensive, speculation switches itself off. Draft lengths never change the output: only how fast it comes.

Sparse-MoE targets (:class:`MoECosts`): a forward over ``n`` tokens reads the weights of every distinct expert its
tokens route to, up to ``top_k x n`` a layer instead of ``top_k``; the expert share of a forward's cost grows with
the distinct experts touched (observed by the target's tally, else expected under uniform routing), so longer
drafts are dearer than on a dense target and the rule sizes them by it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

PRIOR_ACCEPT = 0.7  # first-position acceptance assumed before a decode has verified anything
WARMUP_STEPS = 4  # verified steps before the decode's own acceptance replaces the prior


class Costs(Protocol):
    """Seconds of one draft token, and of one target forward over ``rows`` rows of ``n`` tokens each; the decode
    loop reports what it measured (a fixed table ignores it)."""

    def draft(self) -> float: ...

    def verify(self, rows: int, n: int) -> float: ...

    def record_draft(self, seconds: float, tokens: int) -> None: ...

    def record_verify(self, rows: int, n: int, seconds: float) -> None: ...


@dataclass(frozen=True)
class FixedCosts:
    """A cost table: ``draft`` seconds a draft token; a forward costs ``base * (1 + slope * (n - 1)) * rows ** row_exp``."""

    draft_s: float  # seconds per draft token
    base: float  # seconds of a one-row, one-token target forward
    slope: float = 0.1  # extra cost per extra scored token, relative to one
    row_exp: float = 0.5  # how a forward's cost grows with batch rows

    def draft(self) -> float:
        return self.draft_s

    def verify(self, rows: int, n: int) -> float:
        return self.base * (1 + self.slope * (n - 1)) * rows ** self.row_exp

    def record_draft(self, seconds: float, tokens: int) -> None:
        """A fixed table learns nothing."""

    def record_verify(self, rows: int, n: int, seconds: float) -> None:
        """A fixed table learns nothing."""


@dataclass(frozen=True)
class MoEProfile:
    """A sparse-MoE target's routing and the experts' share of a one-token forward (models derive it from their
    sizes: the weights a forward reads)."""

    experts: int  # routed experts of an MoE layer
    top_k: int  # experts per token
    layers: int  # MoE layers
    share: float  # experts' fraction of the weights a one-token forward reads (0..1)

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.experts or self.layers < 1 or not 0.0 <= self.share <= 1.0:
            raise ValueError(f"invalid MoE profile {self}")

    def touched(self, tokens: int) -> float:
        """Expected distinct experts a layer that ``tokens`` tokens route to, under uniform independent routing."""
        return self.experts * (1 - (1 - self.top_k / self.experts) ** tokens)


@dataclass(frozen=True)
class MoECosts:
    """A sparse-MoE target's cost prior: ``dense`` (in one-token forwards) for the share outside the experts; the
    experts' share scaled by the distinct experts a forward of ``rows x n`` tokens touches over the ``top_k`` of
    one token: what ``observed`` reports (mean distinct experts a layer in this process's forwards of that many
    tokens; None: not seen), else :meth:`MoEProfile.touched`."""

    dense: FixedCosts  # draft cost and the non-expert part's growth with tokens and rows
    profile: MoEProfile  # routing and the experts' share
    observed: Callable[[int], float | None] | None = None  # tokens of a forward -> mean experts a layer, or None

    def experts(self, tokens: int) -> float:
        """Distinct experts a layer a forward of ``tokens`` tokens touches (observed, else expected)."""
        seen = None if self.observed is None else self.observed(tokens)
        return self.profile.touched(tokens) if seen is None else seen

    def draft(self) -> float:
        return self.dense.draft()

    def verify(self, rows: int, n: int) -> float:
        p = self.profile
        return (1 - p.share) * self.dense.verify(rows, n) + p.share * self.dense.base * self.experts(rows * n) / p.top_k

    def record_draft(self, seconds: float, tokens: int) -> None:
        """A prior learns nothing (wrap it in :class:`OnlineCosts`)."""

    def record_verify(self, rows: int, n: int, seconds: float) -> None:
        """A prior learns nothing (wrap it in :class:`OnlineCosts`)."""


@dataclass
class OnlineCosts:
    """Costs learnt from the decode loop's own timings (exponential moving averages per (rows, n)), ``prior`` until a
    shape has been seen; unseen shapes (and the draft step, until one is timed) scale a seen forward by the
    prior's ratios, so the prior may be in any unit (e.g. one-token forwards)."""

    prior: FixedCosts | MoECosts  # the first guess (and the shape of unseen costs)
    decay: float = 0.8  # weight of the old average
    _draft: float | None = None
    _verify: dict[tuple[int, int], float] = field(default_factory=dict)

    def record_draft(self, seconds: float, tokens: int) -> None:
        if tokens > 0:
            per = seconds / tokens
            self._draft = per if self._draft is None else self.decay * self._draft + (1 - self.decay) * per

    def record_verify(self, rows: int, n: int, seconds: float) -> None:
        old = self._verify.get((rows, n))
        self._verify[(rows, n)] = seconds if old is None else self.decay * old + (1 - self.decay) * seconds

    def draft(self) -> float:
        if self._draft is not None:
            return self._draft
        if not self._verify:
            return self.prior.draft()
        shape, seconds = next(iter(self._verify.items()))  # the prior's draft, in the measured forwards' units
        return self.prior.draft() * seconds / self.prior.verify(*shape)

    def verify(self, rows: int, n: int) -> float:
        if (rows, n) in self._verify:
            return self._verify[(rows, n)]
        seen = [key for key in self._verify if key[0] == rows] or list(self._verify)
        if not seen:
            return self.prior.verify(rows, n)
        near = min(seen, key=lambda key: (abs(key[0] - rows), abs(key[1] - n)))
        return self._verify[near] * self.prior.verify(rows, n) / self.prior.verify(*near)


def expected_accepted(accept: Sequence[float]) -> float:
    """``A(k)``: expected accepted tokens of a chain whose ``j``-th token is accepted with chance ``accept[j]`` given
    the earlier ones (acceptance stops at the first rejection)."""
    total, running = 0.0, 1.0
    for a in accept:
        running *= a
        total += running
    return total


def goodput(accept: Sequence[float], costs: Costs, rows: int = 1) -> float:
    """Expected committed tokens per second of a step drafting ``len(accept)`` tokens."""
    k = len(accept)
    return (1 + expected_accepted(accept)) / (k * costs.draft() + costs.verify(rows, k + 1))


@dataclass
class Calibration:
    """How this decode's drafter confidences translate into acceptance: accepted tokens / summed confidences."""

    confidence: float = 0.0  # summed confidences of verified draft tokens (up to each chain's first rejection)
    accepted: float = 0.0  # accepted draft tokens
    steps: int = 0  # verified steps
    first_accepted: int = 0  # steps whose first draft token was accepted

    def record(self, confidences: Sequence[float], accepted: int) -> None:
        seen = min(len(confidences), accepted + 1)  # the first rejection is seen, later tokens are not
        self.confidence += sum(confidences[:seen])
        self.accepted += accepted
        self.steps += int(bool(confidences))
        self.first_accepted += int(accepted > 0)

    def accept(self, confidence: float) -> float:
        """The chance a draft token of this confidence is accepted."""
        if self.steps < WARMUP_STEPS or self.confidence <= 0:
            return confidence
        return min(1.0, confidence * self.accepted / self.confidence)

    def first(self) -> float:
        """The chance the next step's first draft token is accepted."""
        if self.steps < WARMUP_STEPS:
            return PRIOR_ACCEPT
        return (self.first_accepted + PRIOR_ACCEPT) / (self.steps + 1)


@dataclass
class GoodputController:
    """The per-decode (or per-row) draft-length rule: :meth:`should_draft` before a step, :meth:`keep_drafting`
    after each drafted token, :meth:`record` after verification."""

    costs: Costs  # measured or given
    rows: int = 1  # batch rows a forward scores
    calibration: Calibration = field(default_factory=Calibration)  # this decode's confidence -> acceptance

    def should_draft(self) -> bool:
        """Whether drafting one token (with the decode's first-position acceptance) beats plain decoding."""
        return goodput([self.calibration.first()], self.costs, self.rows) > goodput([], self.costs, self.rows)

    def keep_drafting(self, confidences: Sequence[float]) -> bool:
        """After drafting tokens of these confidences: does one more (assumed as likely as the last) pay?"""
        accept = [self.calibration.accept(c) for c in confidences]
        more = [*accept, accept[-1]] if accept else [self.calibration.first()]
        return goodput(more, self.costs, self.rows) > goodput(accept, self.costs, self.rows)

    def record(self, confidences: Sequence[float], accepted: int) -> None:
        """A verified step: the chain's confidences and how many of its tokens were accepted."""
        self.calibration.record(confidences, accepted)
