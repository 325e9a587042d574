"""Small protocols and result types shared by decoding strategies."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from specli.core.drafters.llm.layout import VocabLayout  # a leaf module: no loop
from specli.core.kv_cache import KVCache


@dataclass(frozen=True)
class HiddenStates:
    """Target hidden states a drafter reads, each ``[batch, n, d_model]``.

    ``low`` / ``mid`` / ``last`` are the states every target exposes (first block's output, middle
    block's output, the final normed state that feeds the vocabulary projection); ``aux`` holds the
    states of extra layers a drafter asked the target for (EAGLE-3 / DFlash / DSpark), in the order
    the target was told.
    """

    low: torch.Tensor  # output of the first decoder block
    mid: torch.Tensor  # output of the middle decoder block
    last: torch.Tensor  # final normed state (input of the vocabulary projection)
    aux: tuple[torch.Tensor, ...] = ()  # requested auxiliary layers, each [batch, n, d_model]
    aux_ids: tuple[int, ...] = ()  # target layer of each aux entry (0 = embeddings, i = output of block i - 1)

    def select(self, rows: list[int]) -> HiddenStates:
        """The states of scored rows ``rows`` (e.g. the accepted path of a tree)."""
        return HiddenStates(self.low[:, rows], self.mid[:, rows], self.last[:, rows],
                            tuple(a[:, rows] for a in self.aux), self.aux_ids)

    def pick(self, layers: Sequence[int]) -> tuple[torch.Tensor, ...]:
        """The aux states of target ``layers``, in that order: a target serving several drafters (``bench`` over
        EAGLE-3 and DFlash presets of one model) returns the union of what they asked for."""
        where = {layer: i for i, layer in enumerate(self.aux_ids)}
        missing = [i for i in layers if i not in where]
        if missing:
            raise ValueError(f"the target returns no states of layers {missing} (it returns {list(self.aux_ids)}): "
                             "build it with the drafter's aux layers")
        return tuple(self.aux[where[i]] for i in layers)


@dataclass(frozen=True)
class ScoreOutput:
    """What one target forward returns."""

    logits: torch.Tensor  # [batch, n, vocab], float32, before any logit rule
    hidden: HiddenStates


class TargetState(Protocol):
    """Per-sequence state of a target: at least its preallocated self-attention cache.

    Whisper's state adds the window's encoder output and cross-attention K/V; a decoder-only
    target's state is its cache alone. The decode loop and verification only touch ``cache``.
    """

    @property
    def cache(self) -> KVCache: ...


class Target(Protocol):
    """A model that scores a chain or tree of candidate tokens in one forward."""

    def score(
        self,
        state: TargetState,
        tokens: torch.Tensor,  # [B, n]
        positions: torch.Tensor | None = None,  # [B, n]
        tree_mask: torch.Tensor | None = None,  # [B, n, n] bool
        # rows whose logits are returned; None: all. Given only by a prompt prefill (core/job.prefill), whose rows no
        # one-token step has to reproduce bit for bit: a target may attend over them in one call
        logit_rows: Sequence[int] | None = None,
    ) -> ScoreOutput: ...


class BeamTarget(Target, Protocol):
    """A target that beam search can widen: the hypotheses are the rows of one state (core/beam.py)."""

    def widen(self, state: TargetState, rows: int) -> TargetState:
        """A ``rows``-row state from a one-row one: its cache's filled slots in every row
        (:meth:`~specli.core.kv_cache.KVCache.widened`), the row's context (Whisper: encoder output, cross
        K/V) shared by all rows. Beam search reorders rows through ``state.cache.reorder``."""


class LogitRules(Protocol):
    """A pure function from raw logits and each row's sampled prefix to masked logits.

    Rules may also take a ``vocab`` keyword (a :class:`~specli.core.logits.DraftVocab`: the
    columns stand for those sorted token ids only) and must then return the full rule restricted to
    those columns; ``filter_logits`` hands rules without it the row scattered into the full vocabulary.
    """

    def __call__(self, logits: torch.Tensor, prefixes: Sequence[Sequence[int]]) -> torch.Tensor: ...


@dataclass
class DecodeStats:
    """Counters of one decode; strategies add to them, benchmarks read them."""

    tokens: int = 0  # tokens emitted (eot included)
    target_forwards: int = 0  # decoder forwards of the target, prefill included
    decode_seconds: float = 0.0  # wall time inside the decode loop
    draft_seconds: float = 0.0  # time in the drafter (propose + commit)
    verify_seconds: float = 0.0  # time in target forwards, logit filtering and verification
    verify_steps: int = 0  # token-producing target forwards (verifying a draft of k >= 0 tokens; greedy: k = 0)
    drafted: int = 0  # draft tokens (tree nodes) proposed
    accepted: int = 0  # draft tokens accepted
    position_attempts: list[int] = field(default_factory=list)  # steps whose draft reached depth d+1 ...
    position_accepts: list[int] = field(default_factory=list)  # ... and of those, accepted at depth d+1
    draft_lengths: list[int] = field(default_factory=list)  # draft_lengths[k]: steps that drafted a depth-k draft

    def record_step(self, draft_depth: int, accepted: int) -> None:
        """One verification: the draft's depth and how many tokens were accepted."""
        self.verify_steps += 1
        self.accepted += accepted
        _grow(self.draft_lengths, draft_depth)
        self.draft_lengths[draft_depth] += 1
        for d in range(min(draft_depth, accepted + 1)):
            if d == len(self.position_attempts):
                self.position_attempts.append(0)
                self.position_accepts.append(0)
            self.position_attempts[d] += 1
            self.position_accepts[d] += int(d < accepted)

    @property
    def acceptance_length(self) -> float:
        """Tokens per verification step, bonus included (tau)."""
        return (self.accepted + self.verify_steps) / self.verify_steps if self.verify_steps else 1.0


COUNTERS = ("tokens", "target_forwards", "decode_seconds", "draft_seconds", "verify_seconds", "verify_steps",
            "drafted", "accepted")


def accumulate(dst, src: DecodeStats) -> None:
    """Add ``src``'s counters to ``dst`` (a DecodeStats, or any record with the same fields)."""
    for name in COUNTERS:
        setattr(dst, name, getattr(dst, name) + getattr(src, name))
    for d in range(len(src.position_attempts)):
        if d == len(dst.position_attempts):
            dst.position_attempts.append(0)
            dst.position_accepts.append(0)
        dst.position_attempts[d] += src.position_attempts[d]
        dst.position_accepts[d] += src.position_accepts[d]
    lengths = getattr(dst, "draft_lengths", None)
    if lengths is not None:
        _grow(lengths, len(src.draft_lengths) - 1)
        for k, n in enumerate(src.draft_lengths):
            lengths[k] += n


def _grow(counts: list[int], index: int) -> None:
    """Extend ``counts`` with zeros so that ``counts[index]`` exists."""
    counts.extend([0] * (index + 1 - len(counts)))


@dataclass(frozen=True)
class DecodeResult:
    """What a decode of one window returns."""

    tokens: list[int]  # sampled tokens after the prompt, eot excluded
    sum_logprob: float  # sum of the sampled tokens' log-probabilities (eot included)
    probed: float  # the job's probe (Whisper: P(<|nospeech|>) at <|startoftranscript|>); 0.0 without one
    finished: bool  # True when eot was reached, False when the length limit stopped it
    stats: DecodeStats


class BatchTarget(Protocol):
    """A target that decodes a batch of independent rows in one preallocated state (core/batched.py).

    The state's ``cache`` is a :class:`~specli.core.kv_cache.RaggedKVCache` (one length per row);
    :meth:`score` over ``tokens [B, n]`` uses rows ``[0, B)``, writes row ``b``'s K/V at its own
    length and leaves the lengths to the caller. Whisper and the Qwen2 / CosyVoice LMs implement it.
    """

    def start_batch(self, capacity: int, max_len: int | None, spare: int = 0) -> TargetState:
        """An empty state of ``capacity`` slots, ``max_len`` positions a row plus ``spare`` padding slots."""

    def admit(self, state: TargetState, slot: int, context: object) -> None:
        """A new row in ``slot``: write its context (Whisper: encoder output ``[1, A, d]``); empty cache."""

    def row_state(self, state: TargetState, slot: int, context: object = None) -> TargetState:
        """Slot ``slot`` as a batch-1 state over the same memory (prefill, drafters); ``context`` is the
        row's context as given to :meth:`admit`."""

    def move(self, state: TargetState, src: int, dst: int) -> None:
        """Copy slot ``src`` (cache and context) into slot ``dst``."""

    def score(self, state: TargetState, tokens: torch.Tensor,  # [B, n]
              positions: torch.Tensor | None = None,  # [B, n]
              tree_mask: torch.Tensor | None = None,  # [B, n, n] bool
              logit_rows: Sequence[int] | None = None,  # rows whose logits are returned; None: all
              ) -> ScoreOutput: ...


@dataclass(frozen=True, kw_only=True)
class TargetParts:
    """What a block drafter takes from its target (frozen, shared, never saved with the drafter)."""

    hidden: int  # target width
    layers: int  # target decoder blocks
    vocab: int  # rows of its head (output ids)
    embed: Callable[[torch.Tensor], torch.Tensor]  # input ids [...] -> embeddings [..., hidden]
    head_weight: torch.Tensor  # [vocab, hidden] the head
    head_bias: torch.Tensor | None  # [vocab] or None
    heads: int  # target attention heads (defaults for a fresh drafter)
    kv_heads: int  # target key/value heads
    head_dim: int  # target head width
    intermediate: int  # target MLP width
    rms_eps: float  # target RMSNorm epsilon
    rope_theta: float  # target RoPE base
    max_positions: int  # target positions
    mask_token_id: int  # an input id never generated, used for masked slots by default
    device: torch.device  # where the target's tensors live


class DraftableTarget(Protocol):
    """What a block drafter (core/drafters/llm: DSpark, DFlash, EAGLE-3) may ask its target for; the Qwen2 decoder,
    the CosyVoice LMs and the audio-LLM targets implement it. Nothing else of the target is read by a drafter."""

    def draft_parts(self) -> TargetParts:
        """Sizes, input embedding, head and default mask token (:class:`TargetParts`)."""

    def request_aux_layers(self, layers: Sequence[int]) -> tuple[int, ...]:
        """Have :meth:`Target.score` return the states of ``layers`` (input numbering: 0 = embeddings, i = output of
        block i - 1) for one drafter, beside those it returns for others (their union: a served target feeds every
        drafter loaded for it). Returns the ids that drafter picks (:meth:`HiddenStates.pick`); ValueError names a
        layer the target does not have."""

    def token_layout(self, record: dict) -> VocabLayout | None:
        """The token layout a drafter file's ``token_layout`` record names (another export of this target whose
        speech ids map onto its native ones), or None when its ids are native."""
