"""EAGLE-2 dynamic draft tree for the EAGLE-ASR Speech-Draft head.

The tree search itself (expand the ``topk`` best nodes a level, keep the ``total`` of highest path
probability) is model-neutral: ``specli.core.drafters.tree_search``. Here each level is **one** head forward
over the frontier: its rows attend to their own ancestors only (a tree mask over the head's small K/V cache).

The target verifies the tree in one forward (``core/tree.py``), as any other tree: greedy output
stays identical to plain greedy decoding whatever the head proposes.

Sampling: the tree's tokens are picked deterministically from the drafter's (filtered) distributions
(top-k by path probability), so each node is a point mass given the drafter's state and the proposal
carries ``q = None``; sibling-wise rejection (``verify.sample_tree``) then keeps the target's
distribution exactly. It is lossless but accepts less than a sampled chain would: EAGLE-2's own
sampling mode needs a multi-draft rejection scheme that this verifier does not implement.
"""

from __future__ import annotations

import torch

from specli.core.device import host_to_device
from specli.core.drafters.base import EMPTY, Drafter, DraftProposal, DraftRequest
from specli.asr.drafters.eagle_head import SpeechDraftHead, packed_for_inference
from specli.core.kv_cache import KVCache
from specli.core.logits import DraftVocab
from specli.models.whisper.target import DecoderState
from specli.core.drafters.tree_search import MAX_TOPK, DynamicTreeOptions, TreeNodes, add_children

__all__ = ["MAX_TOPK", "DynamicTreeDrafter", "DynamicTreeOptions"]


def ancestor_slots(nodes: TreeNodes, node: int) -> list[int]:
    """Head cache slots that ``node``'s row attends to besides itself: the root's and its expanded ancestors'."""
    slots = [0]
    node = nodes.parents[node]
    while node >= 0:
        slots.append(nodes.slot[node])
        node = nodes.parents[node]
    return slots


class DynamicTreeDrafter(Drafter):
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
        nodes = TreeNodes()
        self._cache.length = 0
        out = self._expand(x, [[0]])  # the root: slot 0, attends to itself
        frontier = [-1]
        for level in range(opts.depth):
            children = self._score_children(request, nodes, frontier, out)
            if level + 1 == opts.depth or not children:
                break
            row_of = {f: r for r, f in enumerate(frontier)}  # row of out holding each expanded node
            frontier = nodes.frontier(children, opts.topk)
            rows = [row_of[nodes.parents[i]] for i in frontier]
            start = self._cache.length
            for j, node in enumerate(frontier):
                nodes.slot[node] = start + j
            x = head.next_input(out[:, rows], host_to_device([[nodes.tokens[i] for i in frontier]], torch.long, dev),
                                host_to_device([[pos + nodes.depth[i] for i in frontier]], torch.long, dev))
            out = self._expand(x, [ancestor_slots(nodes, i) + [nodes.slot[i]] for i in frontier])
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

    def _score_children(self, request: DraftRequest, nodes: TreeNodes, frontier: list[int],
                        out: torch.Tensor) -> list[int]:
        """Add the ``topk`` most likely children of each frontier node (rows of ``out [1, m, d]``)."""
        sampled = request.tokens[request.prompt_len :]
        logits = self._draft_logits(out, [sampled + nodes.path(f) for f in frontier])  # [m, Vd]
        return add_children(request, nodes, frontier, logits, self.tree, self._tree_vocab)
