"""The drafter protocol and the proposal it returns."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from specli.core.logits import DraftVocab, sample_inverse_cdf
from specli.core.types import HiddenStates, TargetState
from specli.core.tree import depths

# [n, V] -> [n, V]; also takes filter_logits' vocab= keyword ([n, Vd] -> [n, Vd] over a draft vocabulary)
FilterFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class DraftRequest:
    """Everything a drafter may read to propose a continuation."""

    tokens: list[int]  # committed sequence: prompt + sampled tokens (the pending token last)
    prompt_len: int  # tokens[prompt_len:] are the sampled tokens the logit filter sees
    budget: int  # most draft tokens (tree nodes) to propose
    state: TargetState  # the target's state (cache; Whisper: encoder output, features)
    hidden: HiddenStates | None  # target hidden states of the last verified rows [1, m, d]
    filter: FilterFn  # the one logit filter, with this decode's rules and sampling parameters
    greedy: bool  # True: propose argmax tokens; False: sample from the filtered distribution
    generator: torch.Generator | None = None  # random source for sampling drafters
    # after each drafted chain token: given the chain's confidences so far, draft one more? (the goodput rule,
    # specli.core.goodput; None: draft up to the budget and the drafter's own stopping rules)
    keep: Callable[[Sequence[float]], bool] | None = None

    def more(self, confidences: Sequence[float]) -> bool:
        """Whether a chain that has these confidences may grow (budget aside)."""
        return self.keep is None or self.keep(confidences)


@dataclass(frozen=True)
class DraftProposal:
    """A chain or tree of draft tokens.

    ``q`` holds the distribution each node was drawn from (needed by rejection sampling); ``None``
    means each node is a point mass on its token (deterministic proposals such as n-gram matches).
    """

    tokens: list[int]  # token of each node
    parents: list[int]  # parent node of each node, -1 for the root (the pending token)
    confidence: list[float] = field(default_factory=list)  # drafter probability of each node's token
    q: torch.Tensor | None = None  # [n, vocab] draft distribution of each node, or None

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents differ in length")
        depths(self.parents)  # validates the tree order
        if self.q is not None and self.q.shape[0] != len(self.tokens):
            raise ValueError("q must have one row per node")

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY = DraftProposal([], [])


class Drafter(Protocol):
    """Proposes draft tokens; learns what was committed after each verification.

    Every drafter subclasses this protocol, so it has the optional abilities below with their defaults (a drafter
    without an ability keeps the default): :meth:`fork` (None: it cannot draft beside other sequences),
    :meth:`batched` (None: no batch drafter of its own) and :meth:`finish_window` (nothing to learn).
    """

    def start(self, state: TargetState, prompt: list[int]) -> None:
        """A new window: reset per-window state (caches) for this target state and prompt."""

    def propose(self, request: DraftRequest) -> DraftProposal: ...

    def commit(self, tokens: list[int]) -> None:
        """The committed sequence after verification (prompt + sampled, the new pending last)."""

    def fork(self) -> Drafter | None:
        """A fresh drafter for another sequence decoded beside this one, sharing what is shared (an n-gram pool, a
        trained module) and nothing per-sequence; None (the default): it cannot draft beside others."""
        return None

    def batched(self, capacity: int) -> BatchDrafter | None:
        """A batch drafter of its own for ``capacity`` rows (EAGLE chains: every row in one head forward); None (the
        default): rows draft with one :meth:`fork` each (core/drafters/batched.batch_drafter)."""
        return None

    def finish_window(self) -> None:
        """The sequence ended (an n-gram pool learns it); the default learns nothing."""


class BatchDrafter(Protocol):
    """Proposes a draft for every active row of a batch (core/batched.py); slots as in the decoder's batch."""

    def admit(self, slot: int, state: TargetState, prompt: list[int]) -> None:
        """A new row in ``slot``: ``state`` is that row as a batch-1 target state (after prefill)."""

    def propose(self, requests: Sequence[DraftRequest | None]) -> list[DraftProposal]:
        """One proposal per active row (``requests[b]`` for slot ``b``; None: the row has no room)."""

    def commit(self, slot: int, tokens: list[int]) -> None:
        """Row ``slot``'s committed sequence after verification (prompt + sampled, pending last)."""

    def finish(self, slot: int) -> None:
        """Row ``slot`` left the batch (its slot may be refilled by :meth:`move` or :meth:`admit`)."""

    def move(self, src: int, dst: int) -> None:
        """The row in slot ``src`` now lives in slot ``dst``."""


@dataclass(frozen=True)
class ModelDraftOptions:
    """How a model drafter drafts."""

    confidence_threshold: float = 0.0  # adaptive: stop below this drafter probability (0 = never)
    tree_topk: int = 0  # sparse tree: alternatives added at each low-confidence position (0 = chain)
    tree_threshold: float = 0.6  # sparse tree: positions below this confidence get alternatives
    branch_steps: int = 3  # sparse tree, second pass: tokens drafted on after each alternative (0 = leaves)

    def __post_init__(self) -> None:
        if not 0.0 <= self.confidence_threshold < 1.0 or not 0.0 <= self.tree_threshold <= 1.0:
            raise ValueError("thresholds must be within [0, 1)")
        if self.tree_topk < 0 or self.branch_steps < 0:
            raise ValueError("tree_topk and branch_steps must be >= 0")


def draft_chain(request: DraftRequest, budget: int, logits: torch.Tensor, advance: Callable[[int], torch.Tensor],
                options: ModelDraftOptions, *, vocab: DraftVocab | None = None,
                rewind: Callable[[int], None] | None = None) -> DraftProposal:
    """The drafting loop shared by model drafters: from the drafter's ``logits [vocab]`` after the
    pending token, choose a token under the shared logit filter (argmax, or a sample), stop below the
    adaptive confidence threshold, and ``advance(token)`` to the next logits; then add sparse-tree
    branches (``rewind(n)``, when given, puts the drafter back to just after the chain's first ``n``
    tokens, so the second pass drafts on from each alternative; else alternatives stay leaves).

    With a draft vocabulary ``vocab`` the logits are ``[Vd]`` (column ``c`` is token ``vocab.host[c]``)
    and are filtered there; only sampling mode scatters each node's ``q`` row to the full vocabulary.
    """
    sampled = request.tokens[request.prompt_len :]
    ids = None if vocab is None else vocab.host
    draft: list[int] = []
    conf: list[float] = []
    q_rows, alts = [], []
    grow_chain = True  # the goodput rule may end the chain before the budget (branches keep the budget)
    while len(draft) < budget and grow_chain:
        row = request.filter(logits[None], [sampled + draft]) if vocab is None else \
            request.filter(logits[None], [sampled + draft], vocab=vocab)
        probs = row.softmax(-1)[0]
        col = draft_token(probs, request)
        p = float(probs[col])
        if not math.isfinite(p) or (draft and p < options.confidence_threshold):
            break
        tok = col if ids is None else ids[col]
        draft.append(tok)
        conf.append(p)
        q_rows.append(None if request.greedy else (probs if vocab is None else vocab.to_full(probs, 0.0)))
        grow_chain = request.more(conf)
        if options.tree_topk:
            top = probs.topk(min(options.tree_topk + 1, probs.shape[-1])).indices.tolist()
            alts.append(top if ids is None else [ids[c] for c in top])
        else:
            alts.append([])
        if len(draft) < budget and grow_chain:
            logits = advance(tok)

    def grow(pos: int, alt: int, steps: int) -> list[tuple[int, float]]:  # the chain's token at pos -> alt
        rewind(pos)
        return continue_branch(request.filter, sampled + draft[:pos] + [alt], advance(alt), advance, steps,
                               options.confidence_threshold, vocab=vocab)

    return sparse_tree(draft, conf, q_rows, alts, budget, options, None if rewind is None else grow)


def draft_token(probs: torch.Tensor, request: DraftRequest) -> int:
    """The drafter's column from its filtered distribution ``probs [vocab]``: argmax, or a sample
    (the token id itself unless ``probs`` is over a draft vocabulary)."""
    if request.greedy:
        return int(probs.argmax())
    where = request.generator.device if request.generator is not None else probs.device
    u = torch.rand(1, generator=request.generator, dtype=torch.float64, device=where).float().to(probs.device)
    return int(sample_inverse_cdf(probs[None], u)[0])


def sparse_tree(draft, conf, q_rows, alts, budget: int, options: ModelDraftOptions,
                grow: Callable[[int, int, int], list[tuple[int, float]]] | None = None) -> DraftProposal:
    """The drafted chain plus SpecASR's second pass at its low-confidence positions, one sparse tree.

    Each of the drafter's next-best tokens ``alts[pos]`` at a position whose confidence is below
    ``tree_threshold`` becomes a sibling of the chain's token there, and ``grow(pos, alt, steps)``
    (when the drafter can resume from a prefix) drafts up to ``branch_steps`` tokens on from it:
    ``[(token, probability)]``. Without ``grow`` (or ``branch_steps = 0``) alternatives are leaves.
    Branches come after every chain node, earliest position first, so parents precede children.
    In sampling mode chain nodes keep their drafter distribution ``q``; branch nodes are point
    masses (their tokens are picked deterministically from the drafter's state: top-k, then argmax).
    """
    tokens, parents, confs, q = list(draft), list(range(-1, len(draft) - 1)), list(conf), list(q_rows)
    for pos, c in enumerate(conf):
        if not options.tree_topk or c >= options.tree_threshold:
            continue
        for alt in alts[pos]:
            if alt == draft[pos] or len(tokens) >= budget:
                continue
            tokens.append(alt)
            parents.append(pos - 1)
            confs.append(0.0)
            q.append(None)
            room = min(options.branch_steps, budget - len(tokens))
            for tok, p in grow(pos, alt, room) if grow is not None and room > 0 else []:
                parents.append(len(tokens) - 1)
                tokens.append(tok)
                confs.append(p)
                q.append(None)
    q_t = None
    if q and q[0] is not None:
        r0 = q[0]
        q_t = torch.stack([r if r is not None else _one_hot(t, r0) for r, t in zip(q, tokens)])
    return DraftProposal(tokens, parents, confs, q_t)


def continue_branch(filt: FilterFn, prefix: list[int], logits: torch.Tensor, advance: Callable[[int], torch.Tensor],
                    steps: int, threshold: float = 0.0, stop: int | None = None,
                    vocab: DraftVocab | None = None) -> list[tuple[int, float]]:
    """SpecASR's second pass for one branch: from the drafter's ``logits [vocab]`` after ``prefix``
    (sampled tokens, the branch's alternative last), draft greedily up to ``steps`` tokens under the
    logit filter ``filt``, stopping below ``threshold`` or before ``stop``: ``[(token, probability)]``.
    With a draft vocabulary ``vocab`` the logits are ``[Vd]`` and filtered there."""
    out: list[tuple[int, float]] = []
    while len(out) < steps:
        prefixes = [prefix + [t for t, _ in out]]
        row = (filt(logits[None], prefixes) if vocab is None else filt(logits[None], prefixes, vocab=vocab))[0]
        col = int(row.argmax())
        p = float(row.softmax(-1)[col])
        tok = col if vocab is None else vocab.host[col]
        if not math.isfinite(p) or p < threshold or tok == stop:
            break
        out.append((tok, p))
        if len(out) < steps:
            logits = advance(tok)
    return out


def _one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    """A point mass on ``token`` shaped, typed and placed like the distribution ``like [vocab]``."""
    row = torch.zeros_like(like)
    row[token] = 1.0
    return row
