"""Unit tests of the speech-drafter distillation losses (pure functions, hand-computed values)."""

from __future__ import annotations

import math

import pytest
import torch

from specli.distill import losses


def _logits(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs).log()


def test_vocab_maps_follow_the_speculators_convention():
    ids = torch.tensor([1, 3, 4])
    d2t, t2d = losses.vocab_maps(ids, 6)
    assert d2t.tolist() == [1, 2, 2]  # target = draft + d2t[draft]
    assert t2d.tolist() == [False, True, False, True, True, False]
    assert losses.draft_ids(d2t).tolist() == [1, 3, 4]
    with pytest.raises(ValueError):
        losses.vocab_maps(torch.tensor([3, 1]), 6)


def test_tv_full_vocabulary_matches_hand_value():
    q = _logits([0.5, 0.5, 0.0 + 1e-30])
    p = _logits([0.25, 0.25, 0.5])
    d2t, _ = losses.vocab_maps(torch.arange(3), 3)
    assert float(losses.tv_distance(q, p, d2t)) == pytest.approx(0.5, abs=1e-6)
    assert float(losses.tv_distance(p, p, d2t)) == pytest.approx(0.0, abs=1e-6)


def test_tv_counts_target_mass_outside_the_draft_vocabulary():
    # draft rows are target ids 0 and 2; target id 1 (mass 0.3) can never be proposed
    d2t, _ = losses.vocab_maps(torch.tensor([0, 2]), 3)
    p = _logits([0.5, 0.3, 0.2])
    q = _logits([0.5, 0.5])
    # |0.5-0.5| + |0.5-0.2| + 0.3 (outside) = 0.6 -> TV 0.3
    assert float(losses.tv_distance(q, p, d2t)) == pytest.approx(0.3, abs=1e-6)
    # the best the drafter can do is p restricted: TV = the outside mass
    best = _logits([0.5 / 0.7, 0.2 / 0.7])
    assert float(losses.tv_distance(best, p, d2t)) == pytest.approx(0.3, abs=1e-6)


def test_tv_is_the_rejection_probability_of_speculative_sampling():
    torch.manual_seed(0)
    q_l, p_l = torch.randn(5, 7), torch.randn(5, 7)
    d2t, _ = losses.vocab_maps(torch.arange(7), 7)
    q, p = q_l.softmax(-1), p_l.softmax(-1)
    accept = torch.minimum(q, p).sum(-1)  # sum_x q(x) min(1, p(x)/q(x))
    assert torch.allclose(losses.tv_distance(q_l, p_l, d2t), 1 - accept, atol=1e-6)


def test_draft_cross_entropy_maps_labels_and_ignores_outside_ids():
    d2t, t2d = losses.vocab_maps(torch.tensor([1, 3]), 5)
    logits = torch.tensor([[0.0, math.log(3.0)], [math.log(3.0), 0.0], [0.0, 0.0]])
    labels = torch.tensor([3, 1, 4])  # 3 -> row 1 (p 0.75), 1 -> row 0 (p 0.75), 4 outside: ignored
    assert losses.draft_labels(labels, t2d).tolist() == [1, 0, -100]
    ce = losses.draft_cross_entropy(logits, labels, t2d)
    assert float(ce) == pytest.approx(-math.log(0.75), abs=1e-6)
    w = torch.tensor([1.0, 0.0, 1.0])
    assert float(losses.draft_cross_entropy(logits, labels, t2d, w)) == pytest.approx(-math.log(0.75), abs=1e-6)
    none = losses.draft_cross_entropy(logits[2:], labels[2:], t2d)
    assert float(none) == 0.0


def test_weighted_kl_weights_slots_and_renormalises_over_the_draft_vocabulary():
    d2t, _ = losses.vocab_maps(torch.tensor([0, 1]), 3)
    target = _logits([0.4, 0.4, 0.2])[None, None].expand(1, 2, 3)  # renormalised over rows 0, 1: (0.5, 0.5)
    q0 = _logits([0.5, 0.5])  # KL 0
    q1 = _logits([0.8, 0.2])  # KL = 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2)
    draft = torch.stack([q0, q1])[None]  # [1, 2, 2]
    kl1 = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)
    w = torch.tensor([1.0, 3.0])
    assert float(losses.weighted_kl(draft, target, d2t, w)) == pytest.approx(3 * kl1 / 4, rel=1e-5)
    mask = torch.tensor([[True, False]])
    assert float(losses.weighted_kl(draft, target, d2t, w, mask)) == pytest.approx(0.0, abs=1e-6)


def test_recipe_weights():
    w = losses.dflash_weights(4)
    assert w.tolist() == pytest.approx([0.0, 1.0, math.exp(-0.25), math.exp(-0.5)])
    assert losses.eagle3_weights(3).tolist() == pytest.approx([1.0, 0.8, 0.64])
    with pytest.raises(ValueError):
        losses.eagle3_weights(3, 0.0)


def test_confidence_bce_target_is_one_minus_tv_and_detached():
    d2t, _ = losses.vocab_maps(torch.arange(3), 3)
    q = _logits([0.5, 0.5, 1e-30]).requires_grad_(True)
    p = _logits([0.25, 0.25, 0.5])
    conf = torch.zeros((), requires_grad=True)  # sigmoid 0.5
    bce = losses.confidence_bce(conf, q, p, d2t)
    # target 1 - TV = 0.5: BCE(0.5, 0.5) = ln 2
    assert float(bce) == pytest.approx(math.log(2), abs=1e-6)
    bce.backward()
    assert q.grad is None and float(conf.grad) == pytest.approx(0.0, abs=1e-6)
    # the minimum is at the target: a confident head is pulled down when TV is large
    high = losses.confidence_bce(torch.tensor(3.0), q.detach(), p, d2t)
    assert float(high) > float(bce)


def test_dspark_loss_mixes_ce_and_tv():
    d2t, t2d = losses.vocab_maps(torch.arange(3), 3)
    draft = _logits([0.5, 0.25, 0.25])[None, None]
    target = _logits([0.25, 0.5, 0.25])[None, None]
    labels = torch.tensor([[1]])
    loss, parts = losses.dspark_loss(draft, target, labels, d2t, t2d, torch.ones(1, 1, dtype=torch.bool))
    assert parts["tv"] == pytest.approx(0.25, abs=1e-6)
    assert parts["ce"] == pytest.approx(-math.log(0.25), abs=1e-6)
    assert float(loss) == pytest.approx(0.1 * -math.log(0.25) + 0.9 * 0.25, abs=1e-6)
