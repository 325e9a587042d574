"""DSpark: the DFlash backbone with a low-rank Markov head and a confidence head.

One draft forward over ``[context; block]`` gives base logits for all ``B`` slots (``sample_from_anchor``:
slot ``k`` predicts position ``P + k + 1``, so a block yields ``B`` drafts). Then, in order, slot ``k``
adds the **Markov** bias ``W2(W1[prev_k])`` (``W1: Embedding(rows, r)``, ``W2: Linear(r, draft_vocab)``
without bias; ``prev_0`` = the pending/bonus token, ``prev_k`` = the draft at slot ``k - 1``); the
request's logit filter (the target's sampler) turns the result into ``q_k``, from which the draft is
drawn (argmax when greedy) and which is kept for rejection sampling. With a reduced draft vocabulary
tokens outside it get ``q = 0`` (only the residual can produce them).

The **confidence head** (``Linear(H + r, 1)`` on ``[hidden_k; W1[prev_k]]``) predicts the probability
that slot ``k`` is accepted; the running product is the predicted survival of the chain, and adaptive
truncation stops drafting when it falls below ``confidence_threshold`` (never changes the output).

``W1`` is indexed by target ids when it has ``target_vocab`` rows (speculators' ``MarkovHead``), else by
draft rows; a previous token it has no row for (e.g. CosyVoice2's task id before the first draft)
gets a zero embedding.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from specli.core.drafters.llm.dflash import BlockDraftModule, new_block_config
from specli.core.drafters.llm.base import DraftTrainOutput, SpeechDraftConfig, TargetParts, init_linear


class MarkovHead(nn.Module):
    """``bias(prev) = W2(W1[prev])`` over the draft vocabulary."""

    def __init__(self, rows: int, rank: int, draft_vocab: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(rows, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab, bias=False)


class ConfidenceHead(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, 1)


class DSparkModule(BlockDraftModule):
    """DSpark = DFlash backbone + Markov head (rank ``markov_rank``) + optional confidence head."""

    def __init__(self, config: SpeechDraftConfig, parts: TargetParts, draft_ids: torch.Tensor | None = None,
                 markov_rows: int | None = None) -> None:
        super().__init__(config, parts, draft_ids)
        r = config.markov_rank
        self.markov_head = MarkovHead(markov_rows or config.target_vocab, r, config.draft_vocab) if r else None
        self.confidence_head = ConfidenceHead(config.hidden + r) if config.confidence_head else None
        self.to(parts.device)

    def prev_embedding(self, prev: torch.Tensor) -> torch.Tensor | None:
        """``W1`` rows of the previous tokens (target ids ``[...]``) -> ``[..., r]`` (zeros where none)."""
        if self.markov_head is None:
            return None
        w1 = self.markov_head.markov_w1
        rows = prev.long()
        if w1.num_embeddings != self.config.target_vocab:
            v = self.config.target_vocab
            rows = torch.where(rows < v, self.t2d_rows[rows.clamp(0, v - 1)], torch.full_like(rows, -1))
        valid = (rows >= 0) & (rows < w1.num_embeddings)
        return w1(rows.clamp(0, w1.num_embeddings - 1)) * valid[..., None]

    def markov_bias(self, emb: torch.Tensor | None) -> torch.Tensor | float:
        return 0.0 if emb is None else self.markov_head.markov_w2(emb)

    def confidence_logit(self, hidden: torch.Tensor, emb: torch.Tensor | None) -> torch.Tensor | None:
        """Acceptance logits ``[...]`` of states ``[..., H]`` (with the Markov embedding when present)."""
        if self.confidence_head is None:
            return None
        feats = hidden if emb is None else torch.cat([hidden, emb.to(hidden.dtype)], -1)
        return self.confidence_head.proj(feats).squeeze(-1)

    def forward_train(self, context: torch.Tensor, input_ids: torch.Tensor,
                      anchors: torch.Tensor | None = None) -> DraftTrainOutput:
        """Teacher-forced: slot ``k``'s previous token is the true token at ``anchor + k``."""
        if anchors is None:
            raise ValueError("block drafters train on anchors [B, A]")
        h, pos = self._train_hidden(context, input_ids, anchors)
        b, t = input_ids.shape
        s = self.config.block_size
        prev_pos = anchors[..., None] + torch.arange(s, device=anchors.device)  # [B, A, S]
        prev = input_ids.gather(1, prev_pos.clamp(0, t - 1).view(b, -1)).view_as(prev_pos)
        emb = self.prev_embedding(prev)
        logits = self.head(h) + self.markov_bias(emb)
        return DraftTrainOutput(logits, pos, self.confidence_logit(h, emb))

    def slot_logits(self, base: torch.Tensor, hidden: torch.Tensor, slot: int, prev: int) -> torch.Tensor:
        emb = self.prev_embedding(torch.tensor(prev, device=base.device))
        return base[slot] + self.markov_bias(emb)

    def slot_rows(self, base: torch.Tensor, slot: int, prev: torch.Tensor,
                  table: torch.Tensor | None = None) -> torch.Tensor:
        if table is not None:  # [V + 1, Vd]: ids past the vocabulary read the zero row
            return base[slot] + table[prev.clamp(max=table.shape[0] - 1)]
        return base[slot] + self.markov_bias(self.prev_embedding(prev))

    @torch.no_grad()
    def slot_table(self, max_entries: int = 1 << 22) -> torch.Tensor | None:
        """The Markov bias of every previous token at once, ``[target_vocab + 1, Vd]`` (the last row zeros: ids
        past the vocabulary), so that a dynamic tree's level is a row gather instead of a rank-``r`` product;
        None without a Markov head or when the table would hold more than ``max_entries`` values (16 MiB)."""
        v = self.config.target_vocab
        if self.markov_head is None or (v + 1) * self.config.draft_vocab > max_entries:
            return None
        return self.markov_bias(self.prev_embedding(torch.arange(v + 1, device=self.draft_ids.device))).contiguous()

    def slot_confidence(self, hidden: torch.Tensor, slot: int, prev: int) -> float | None:
        emb = self.prev_embedding(torch.tensor(prev, device=hidden.device))
        logit = self.confidence_logit(hidden[slot], emb)
        return None if logit is None else 1.0 / (1.0 + math.exp(-float(logit)))


def new_dspark(parts: TargetParts, layers: int = 3, block_size: int = 8, markov_rank: int = 256,
               confidence_head: bool = True, draft_vocab_ids: torch.Tensor | None = None, seed: int = 0,
               **kw) -> DSparkModule:
    """A fresh DSpark module (published recipe: 3 layers, block 8, Markov rank 256, confidence head)."""
    vd = 0 if draft_vocab_ids is None else draft_vocab_ids.numel()
    cfg = new_block_config("dspark", parts, layers, block_size, vd, markov_rank=markov_rank,
                           confidence_head=confidence_head, **kw)
    mod = DSparkModule(cfg, parts, draft_vocab_ids)
    init_linear(mod, seed=seed)
    return mod
