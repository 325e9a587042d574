"""EAGLE drafting for a whole batch: every row's head step runs in ONE head forward.

The per-row adapter (:class:`~specli.core.drafters.batched.PerRowDrafters` over
:class:`~specli.asr.drafters.eagle.EagleDrafter`) runs ``rows x steps`` head forwards a target
step; this drafter runs ``steps``: the head's block takes ``[R, 1, d]`` (one draft per row), its
self-attention K/V grow by one position a step for every row, and its cross-attention reads each
slot's K/V, computed once when the row is admitted and moved with the row. Each row chooses its
tokens from the head's logits through its own logit filter and generator (argmax or a sample, the
adaptive confidence stop; a head with a draft vocabulary is filtered in its own columns), exactly as
:func:`~specli.core.drafters.base.draft_chain` does for one row; rows that stop early ride along
until the longest draft is done. Chains only (no sparse tree); the head runs in ``dtype`` (float32 unless told;
:meth:`EagleDrafter.batched` passes its own head's dtype and int8 choice), the window K/V in the same dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from specli.core.device import host_to_device
from specli.core.drafters.base import EMPTY, DraftProposal, DraftRequest, ModelDraftOptions, draft_token
from specli.asr.drafters.eagle_head import SpeechDraftHead, packed_for_inference
from specli.core.logits import DraftVocab
from specli.core.tree import chain_parents
from specli.core.types import TargetState


class BatchedEagleDrafter:
    """A :class:`~specli.core.drafters.base.BatchDrafter` over one :class:`SpeechDraftHead`."""

    def __init__(self, head: SpeechDraftHead, capacity: int, options: ModelDraftOptions = ModelDraftOptions(),
                 dtype: torch.dtype = torch.float32, int8: bool = False) -> None:
        if options.tree_topk:
            raise ValueError("the batched EAGLE drafter drafts chains (tree_topk must be 0)")
        # dtype: the head's matrices and activations (bfloat16: half the bytes); int8: its matrices weight-only int8
        self.head = packed_for_inference(head, dtype, int8)
        self.options = options
        cfg = head.cfg  # a draft vocabulary is filtered in its own columns, as EagleDrafter does
        self.vocab = None if head.vocab_ids.numel() == cfg.vocab else DraftVocab(head.vocab_ids, cfg.vocab)
        self.capacity = capacity
        self._cross: tuple[torch.Tensor, torch.Tensor] | None = None  # [capacity, H, A, hd] x2, at first admit

    @torch.inference_mode()
    def admit(self, slot: int, state: TargetState, prompt: list[int]) -> None:
        k, v = self.head.cross_kv(state.audio_features)  # [1, H, A, hd] each, in the head's dtype (as EagleDrafter)
        if self._cross is None or self._cross[0].shape[1:] != k.shape[1:]:
            self._cross = (k.new_zeros(self.capacity, *k.shape[1:]), v.new_zeros(self.capacity, *v.shape[1:]))
        self._cross[0][slot], self._cross[1][slot] = k[0], v[0]

    def move(self, src: int, dst: int) -> None:
        self._cross[0][dst], self._cross[1][dst] = self._cross[0][src], self._cross[1][src]

    def finish(self, slot: int) -> None:
        """Nothing per row to keep: a proposal starts from the target's latest hidden state."""

    def commit(self, slot: int, tokens: list[int]) -> None:
        """Nothing to keep (as :class:`~specli.asr.drafters.eagle.EagleDrafter`)."""

    @torch.inference_mode()
    def propose(self, requests: Sequence[DraftRequest | None]) -> list[DraftProposal]:
        rows = [b for b, r in enumerate(requests) if r is not None and r.hidden is not None and r.budget > 0]
        out = [EMPTY] * len(requests)
        if not rows or self._cross is None:
            return out
        reqs = [requests[b] for b in rows]
        head, dev = self.head, self._cross[0].device
        pos = [len(r.tokens) - 1 for r in reqs]  # decoder position of each row's pending token
        x = head.first_input(*(torch.cat([getattr(r.hidden, name)[:, -1:] for r in reqs])
                               for name in ("low", "mid", "last")),
                             host_to_device([[r.tokens[-1]] for r in reqs], torch.long, dev),
                             host_to_device([[p] for p in pos], torch.long, dev))  # [R, 1, d]
        idx = host_to_device(rows, torch.long, dev)
        contiguous = rows == list(range(len(rows)))
        cross = tuple(t[: len(rows)] if contiguous else t.index_select(0, idx) for t in self._cross)
        drafts = _Drafts(reqs, min(head.cfg.max_steps, max(r.budget for r in reqs)), self.options, self.vocab)
        past = None
        for step in range(drafts.steps):
            h, k, v = head.block(x, past, cross)
            past = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
            chosen = drafts.choose(head.logits(h)[:, 0])  # [R, Vd] -> next input token of each row
            if not drafts.live:
                break
            x = head.next_input(h, host_to_device([[t] for t in chosen], torch.long, dev),
                                host_to_device([[p + step + 1] for p in pos], torch.long, dev))
        for i, b in enumerate(rows):
            out[b] = drafts.proposal(i)
        return out


class _Drafts:
    """The growing chain of each row: token choice under the row's filter, confidence stop, budget."""

    def __init__(self, reqs: list[DraftRequest], steps: int, options: ModelDraftOptions,
                 vocab: DraftVocab | None) -> None:
        self.reqs, self.steps, self.options, self.vocab = reqs, steps, options, vocab
        self.tokens: list[list[int]] = [[] for _ in reqs]
        self.conf: list[list[float]] = [[] for _ in reqs]
        self.q: list[list[torch.Tensor]] = [[] for _ in reqs]
        self.live = {i for i, r in enumerate(reqs)}

    def choose(self, logits: torch.Tensor) -> list[int]:  # logits [R, Vd] (Vd = V without a draft vocabulary)
        chosen, vocab = [], self.vocab
        for i, r in enumerate(self.reqs):
            if i not in self.live:
                chosen.append(r.tokens[-1])  # a stopped row rides along; its outputs are never read
                continue
            draft = self.tokens[i]
            prefixes = [r.tokens[r.prompt_len :] + draft]
            row = r.filter(logits[i : i + 1], prefixes) if vocab is None else \
                r.filter(logits[i : i + 1], prefixes, vocab=vocab)
            probs = row.softmax(-1)[0]
            col = draft_token(probs, r)
            p = float(probs[col])
            if not math.isfinite(p) or (draft and p < self.options.confidence_threshold):
                self.live.discard(i)
                chosen.append(r.tokens[-1])
                continue
            tok = col if vocab is None else vocab.host[col]
            draft.append(tok)
            self.conf[i].append(p)
            if not r.greedy:
                self.q[i].append(probs if vocab is None else vocab.to_full(probs, 0.0))
            if len(draft) >= min(r.budget, self.steps) or not r.more(self.conf[i]):
                self.live.discard(i)
            chosen.append(tok)
        return chosen

    def proposal(self, i: int) -> DraftProposal:
        n = len(self.tokens[i])
        q = torch.stack(self.q[i]) if self.q[i] else None
        return DraftProposal(self.tokens[i], chain_parents(n), self.conf[i], q)
