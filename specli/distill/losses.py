"""Distillation losses for speech-token drafters, as pure functions of logits.

Draft vocabulary (speculators convention): the drafter scores ``Vd`` rows; ``d2t [Vd]`` are offsets,
draft row ``i`` is target id ``i + d2t[i]``, and ``t2d [V]`` (bool) marks the target ids that have a
draft row. A target id outside the draft vocabulary has draft probability 0, so it contributes its
whole target mass to the total-variation distance and is ignored by the cross-entropy.

* :func:`tv_distance` -- ``TV(q, p) = 1/2 sum_x |q(x) - p(x)|`` per row (DSpark's main loss: the
  probability that one draw is *rejected* by speculative sampling is exactly ``TV(q, p)``);
* :func:`draft_cross_entropy` -- CE of the target's sampled tokens over the draft vocabulary;
* :func:`weighted_kl` -- ``sum_k w_k KL(p_k || q_k)`` per slot, with ``p`` renormalised over the draft
  vocabulary (DFlash, EAGLE-3); :func:`dflash_weights` / :func:`eagle3_weights` give the recipes' ``w``;
* :func:`confidence_bce` -- BCE of the confidence head towards ``1 - TV(q, p)`` (the acceptance
  probability of the slot), the target detached.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def draft_ids(d2t: torch.Tensor) -> torch.Tensor:
    """Target id of each draft row, ``arange(Vd) + d2t``. [Vd]"""
    return torch.arange(d2t.numel(), device=d2t.device) + d2t


def vocab_maps(ids: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t [Vd], t2d [V])`` of a draft vocabulary given as ascending target ids ``ids [Vd]``."""
    if ids.numel() and (bool((ids[1:] <= ids[:-1]).any()) or int(ids[0]) < 0 or int(ids[-1]) >= vocab):
        raise ValueError("draft vocabulary ids must be ascending, unique and within the target vocabulary")
    d2t = ids - torch.arange(ids.numel(), device=ids.device)
    t2d = torch.zeros(vocab, dtype=torch.bool, device=ids.device)
    t2d[ids] = True
    return d2t, t2d


def prune_to_draft(target_logits: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    """Target logits ``[..., V]`` restricted to the draft rows ``[..., Vd]``."""
    return target_logits.index_select(-1, draft_ids(d2t))


def tv_distance(draft_logits: torch.Tensor, target_logits: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    """``TV(q, p)`` per row ``[...]``: ``q = softmax(draft_logits [..., Vd])`` over the draft rows,
    ``p = softmax(target_logits [..., V])`` over the whole target vocabulary."""
    q = draft_logits.float().softmax(-1)
    p = target_logits.float().softmax(-1)
    p_draft = p.index_select(-1, draft_ids(d2t))
    outside = (1.0 - p_draft.sum(-1)).clamp(min=0.0)  # target mass the drafter can never propose
    return 0.5 * ((q - p_draft).abs().sum(-1) + outside)


def draft_labels(labels: torch.Tensor, t2d: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Target-id labels ``[...]`` -> draft rows; ids outside the draft vocabulary (and ``ignore_index``)
    become ``ignore_index``."""
    row = torch.cumsum(t2d.long(), 0) - 1  # [V] draft row of each target id (valid where t2d)
    safe = labels.clamp(min=0, max=t2d.numel() - 1)
    keep = (labels >= 0) & (labels < t2d.numel()) & t2d[safe]
    return torch.where(keep, row[safe], torch.full_like(labels, ignore_index))


def draft_cross_entropy(draft_logits: torch.Tensor, labels: torch.Tensor, t2d: torch.Tensor,
                        weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean CE of ``labels [...]`` (target ids, ``-100`` = none) under ``draft_logits [..., Vd]``;
    ``weights [...]`` (optional) weigh each row; 0 when no row has a label in the draft vocabulary."""
    rows = draft_labels(labels, t2d)
    ce = F.cross_entropy(draft_logits.float().flatten(0, -2), rows.flatten(), ignore_index=-100,
                         reduction="none").view(rows.shape)
    w = (rows >= 0).float() * (1.0 if weights is None else weights)
    return (ce * w).sum() / w.sum().clamp(min=1e-12)


def weighted_kl(draft_logits: torch.Tensor, target_logits: torch.Tensor, d2t: torch.Tensor,
                weights: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``sum_k w_k KL(p_k || q_k) / sum_k w_k`` averaged over valid rows.

    ``draft_logits [N, K, Vd]``, ``target_logits [N, K, V]`` (renormalised over the draft rows),
    ``weights [K]``, ``mask [N, K]`` (True = slot has a target; default all).
    """
    log_q = draft_logits.float().log_softmax(-1)
    log_p = prune_to_draft(target_logits.float(), d2t).log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)  # [N, K]
    w = weights.to(kl.dtype)[None, :].expand_as(kl)
    if mask is not None:
        w = w * mask.to(kl.dtype)
    return (kl * w).sum() / w.sum().clamp(min=1e-12)


def confidence_bce(confidence_logits: torch.Tensor, draft_logits: torch.Tensor, target_logits: torch.Tensor,
                   d2t: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """BCE of ``confidence_logits [...]`` towards ``1 - TV(q, p)`` (detached: the confidence head does
    not move the drafter's distribution); ``mask [...]`` selects the rows."""
    target = (1.0 - tv_distance(draft_logits.detach(), target_logits.detach(), d2t)).clamp(0.0, 1.0)
    bce = F.binary_cross_entropy_with_logits(confidence_logits.float(), target, reduction="none")
    if mask is None:
        return bce.mean()
    m = mask.to(bce.dtype)
    return (bce * m).sum() / m.sum().clamp(min=1e-12)


def dflash_weights(block: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """DFlash slot weights ``[block]``: slot 0 (the given token) 0, slot ``k >= 1`` ``exp(-(k-1)/4)``."""
    k = torch.arange(block, dtype=torch.float32, device=device)
    return torch.where(k > 0, torch.exp(-(k - 1) / 4.0), torch.zeros_like(k))


def eagle3_weights(unroll: int, decay: float = 0.8, device: torch.device | str = "cpu") -> torch.Tensor:
    """EAGLE-3 test-time-training weights ``[unroll]``: ``decay ** k`` for step ``k = 0..unroll-1``."""
    if not 0.0 < decay <= 1.0:
        raise ValueError("decay must be within (0, 1]")
    return torch.tensor([decay**k for k in range(unroll)], dtype=torch.float32, device=device)


def dspark_loss(draft_logits: torch.Tensor, target_logits: torch.Tensor, labels: torch.Tensor,
                d2t: torch.Tensor, t2d: torch.Tensor, mask: torch.Tensor,
                ce_weight: float = 0.1, tv_weight: float = 0.9) -> tuple[torch.Tensor, dict[str, float]]:
    """DSpark's ``ce_weight * CE + tv_weight * TV`` over the valid slots ``mask [N, B]``.

    ``draft_logits [N, B, Vd]``, ``target_logits [N, B, V]``, ``labels [N, B]`` (target ids sampled
    by the target at each slot's position). Returns the loss and its parts (floats, for logging).
    """
    if ce_weight < 0 or tv_weight < 0 or ce_weight + tv_weight <= 0:
        raise ValueError("loss weights must be >= 0, not both 0")
    m = mask.float()
    tv = (tv_distance(draft_logits, target_logits, d2t) * m).sum() / m.sum().clamp(min=1e-12)
    ce = draft_cross_entropy(draft_logits, torch.where(mask, labels, torch.full_like(labels, -100)), t2d)
    loss = ce_weight * ce + tv_weight * tv
    return loss, {"ce": float(ce.detach()), "tv": float(tv.detach())}
