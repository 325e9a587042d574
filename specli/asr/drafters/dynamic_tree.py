"""EAGLE-2 dynamic draft tree for the EAGLE-ASR Speech-Draft head.

A chain spends its whole budget on one guess per position; a static tree spends it on a fixed shape.
EAGLE-2 ("Faster Inference of Language Models with Dynamic Draft Trees") lets the drafter's own
confidence shape the tree:

* **Expand.** The head's first step (the target's hidden state + the pending token) gives the root's
  draft distribution; its ``topk`` most likely tokens are the first level. At every later level the
  ``topk`` nodes with the highest *path* probability (the product of the draft probabilities along
  the path from the root) are expanded together in **one** head forward: their rows attend to their
  own ancestors only (a tree mask over the head's small K/V cache), and each contributes its
  ``topk`` most likely children.
* **Rerank.** Of every node scored (expanded or not), the ``total`` with the highest path
  probability form the proposal (``min_path`` > 0 also drops nodes whose path probability is below
  it, so an unsure head proposes a small tree and stops expanding early, as the adaptive chain does).
  A child's path probability never exceeds its parent's, so the kept
  set is closed under ancestry; nodes are emitted in creation order, so parents precede children.

The target verifies the tree in one forward (``core/tree.py``), as any other tree: greedy output
stays identical to plain greedy decoding whatever the head proposes.

Sampling: the tree's tokens are picked deterministically from the drafter's (filtered) distributions
(top-k by path probability), so each node is a point mass given the drafter's state and the proposal
carries ``q = None``; sibling-wise rejection (``verify.sample_tree``) then keeps the target's
distribution exactly. It is lossless but accepts less than a sampled chain would: EAGLE-2's own
sampling mode needs a multi-draft rejection scheme that this verifier does not implement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specli.core.device import host_to_device
from specli.core.drafters.base import EMPTY, DraftProposal, DraftRequest
from specli.asr.drafters.eagle_head import SpeechDraftHead, packed_for_inference
from specli.core.kv_cache import KVCache
from specli.core.logits import DraftVocab
from specli.models.whisper.target import DecoderState
from specli.core.tree import path_to

MAX_TOPK = 8  # nodes expanded per level (and children per node), at most


@dataclass(frozen=True)
class DynamicTreeOptions:
    """Shape limits of an EAGLE-2 dynamic draft tree."""

    depth: int = 5  # levels of the tree: head forwards per proposal (the root step included)
    topk: int = 4  # nodes expanded per level, and children scored per expanded node
    total: int = 12  # nodes kept in the proposal (best path probabilities; capped by the request's budget)
    min_path: float = 0.0  # nodes whose path probability is below this are dropped (the root's best child stays)

    def __post_init__(self) -> None:
        if not 1 <= self.depth <= 16:
            raise ValueError("dynamic tree depth must be within 1..16")
        if not 1 <= self.topk <= MAX_TOPK:
            raise ValueError(f"dynamic tree topk must be within 1..{MAX_TOPK}")
        if not 1 <= self.total <= 64:
            raise ValueError("dynamic tree total must be within 1..64")
        if not 0.0 <= self.min_path < 1.0:
            raise ValueError("dynamic tree min_path must be within [0, 1)")

    @property
    def slots(self) -> int:
        """Head K/V slots one proposal needs: the root, then ``topk`` expanded nodes per later level."""
        return 1 + self.topk * (self.depth - 1)


class _Nodes:
    """The scored nodes of one proposal: token, parent, path log-probability, depth, head K/V slot."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.score: list[float] = []  # log path probability (sum of the draft log-probabilities)
        self.depth: list[int] = []  # children of the root have depth 1
        self.slot: list[int] = []  # slot of the node's K/V in the head cache once expanded, else -1

    def add(self, token: int, parent: int, score: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.score.append(score)
        self.depth.append(1 if parent < 0 else self.depth[parent] + 1)
        self.slot.append(-1)
        return len(self.tokens) - 1

    def path(self, node: int) -> list[int]:
        """Tokens from the root's child down to ``node`` (empty for the root, ``-1``)."""
        return [self.tokens[i] for i in path_to(self.parents, node)]

    def ancestor_slots(self, node: int) -> list[int]:
        """Head cache slots that ``node``'s row attends to besides itself: the root's and its expanded ancestors'."""
        slots = [0]
        node = self.parents[node]
        while node >= 0:
            slots.append(self.slot[node])
            node = self.parents[node]
        return slots

    def best(self, total: int) -> DraftProposal:
        """The ``total`` nodes of highest path probability (ancestry-closed), in creation order."""
        order = sorted(range(len(self.tokens)), key=lambda i: (-self.score[i], i))
        kept: set[int] = set()
        for i in order:
            if len(kept) == total:
                break
            if self.parents[i] < 0 or self.parents[i] in kept:
                kept.add(i)
        keep = sorted(kept)
        index = {old: new for new, old in enumerate(keep)}
        return DraftProposal([self.tokens[i] for i in keep],
                             [index[self.parents[i]] if self.parents[i] >= 0 else -1 for i in keep],
                             [math.exp(self.score[i]) for i in keep])


class DynamicTreeDrafter:
    """Proposes EAGLE-2 dynamic trees with a :class:`SpeechDraftHead` (one head forward per level)."""

    def __init__(self, head: SpeechDraftHead, options: DynamicTreeOptions = DynamicTreeOptions()) -> None:
        cfg = head.cfg
        if options.slots > cfg.max_steps:
            raise ValueError(f"a dynamic tree of depth {options.depth} and topk {options.topk} needs "
                             f"{options.slots} head cache slots; the head holds {cfg.max_steps}")
        self.head = packed_for_inference(head)
        self.tree = options
        self._device = head.embed.device  # the target's device: the head, its cache and its inputs live there
        self._cache = KVCache(1, 1, cfg.heads, options.slots, cfg.d_model // cfg.heads, device=self._device)
        self._cross: tuple[torch.Tensor, torch.Tensor] | None = None
        small = head.vocab_ids.numel() < cfg.vocab  # filter in the draft vocabulary, not the full row
        self._tree_vocab = DraftVocab(head.vocab_ids, cfg.vocab) if small else None

    @torch.inference_mode()
    def start(self, state: DecoderState, prompt: list[int]) -> None:
        """A new window: the head's cross-attention K/V of its encoder output, once."""
        self._cross = tuple(t.contiguous() for t in self.head.cross_kv(state.audio_features))

    def commit(self, tokens: list[int]) -> None:
        """Nothing to keep: every proposal starts from the target's latest hidden state."""

    @torch.inference_mode()
    def propose(self, request: DraftRequest) -> DraftProposal:
        if request.hidden is None or request.budget < 1 or self._cross is None:
            return EMPTY
        head, opts, dev = self.head, self.tree, self._device
        pos = len(request.tokens) - 1  # decoder position of the pending token; a node at depth j sits at pos + j
        hid = request.hidden
        x = head.first_input(hid.low[:, -1:], hid.mid[:, -1:], hid.last[:, -1:],
                             host_to_device([[request.tokens[-1]]], torch.long, dev),
                             host_to_device([[pos]], torch.long, dev))
        nodes = _Nodes()
        self._cache.length = 0
        out = self._expand(x, [[0]])  # the root: slot 0, attends to itself
        frontier = [-1]
        for level in range(opts.depth):
            children = self._score_children(request, nodes, frontier, out)
            if level + 1 == opts.depth or not children:
                break
            row_of = {f: r for r, f in enumerate(frontier)}  # row of out holding each expanded node
            frontier = sorted(children, key=lambda i: (-nodes.score[i], i))[: opts.topk]
            rows = [row_of[nodes.parents[i]] for i in frontier]
            start = self._cache.length
            for j, node in enumerate(frontier):
                nodes.slot[node] = start + j
            x = head.next_input(out[:, rows], host_to_device([[nodes.tokens[i] for i in frontier]], torch.long, dev),
                                host_to_device([[pos + nodes.depth[i] for i in frontier]], torch.long, dev))
            out = self._expand(x, [nodes.ancestor_slots(i) + [nodes.slot[i]] for i in frontier])
        return nodes.best(min(opts.total, request.budget))

    def _expand(self, x: torch.Tensor, attend: list[list[int]]) -> torch.Tensor:
        """One head forward for ``x [1, m, d]`` new rows; row ``i`` attends to the cache slots
        ``attend[i]`` (its ancestors, then its own new slot). Returns the head outputs ``[1, m, d]``."""
        start, m = self._cache.length, x.shape[1]
        width = start + m
        sets = [set(a) for a in attend]
        mask = host_to_device([[[j in a for j in range(width)] for a in sets]], torch.bool, self._device)
        past = self._cache.view(0, start) if start else None
        out, k, v = self.head.block(x, past, self._cross, mask)
        self._cache.write(0, start, k, v)
        self._cache.length = width
        return out

    def _draft_logits(self, out: torch.Tensor, prefixes: list[list[int]]) -> torch.Tensor:
        """The head's logits ``[m, Vd]`` for its outputs ``out [1, m, d]`` (row ``i`` after ``prefixes[i]``)."""
        return self.head.logits(out[0])

    def _score_children(self, request: DraftRequest, nodes: _Nodes, frontier: list[int],
                        out: torch.Tensor) -> list[int]:
        """Add the ``topk`` most likely children of each frontier node (rows of ``out [1, m, d]``)
        under the shared logit filter, scored by path log-probability; returns the new nodes."""
        sampled = request.tokens[request.prompt_len :]
        prefixes = [sampled + nodes.path(f) for f in frontier]
        logits = self._draft_logits(out, prefixes)  # [m, Vd] (the draft vocabulary's columns)
        vocab = self._tree_vocab
        if vocab is None:
            filtered = request.filter(logits, prefixes)
        else:
            filtered = request.filter(logits, prefixes, vocab=vocab)
        top = filtered.log_softmax(-1).topk(min(self.tree.topk, filtered.shape[-1]), -1)  # [m, k]
        k = top.values.shape[1]
        flat = torch.cat([top.values.double().flatten(), top.indices.double().flatten()]).tolist()  # one readback
        new = []
        floor = math.log(self.tree.min_path) if self.tree.min_path > 0 else -math.inf
        for r, f in enumerate(frontier):
            base = 0.0 if f < 0 else nodes.score[f]
            for c in range(k):
                logp, col = flat[r * k + c], int(flat[len(flat) // 2 + r * k + c])
                if not math.isfinite(logp) or (base + logp < floor and (f >= 0 or c > 0)):
                    continue
                new.append(nodes.add(col if vocab is None else vocab.host[col], f, base + logp))
        return new
