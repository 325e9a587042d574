"""scripts/voice/lm.py: the regularisers of the voice LM's training (dropout, input-token noise) leave the
saved model and its inference untouched; cheap offline checks on a tiny Qwen2, no corpus needed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: scripts.voice

pytest.importorskip("transformers")
from scripts.voice import lm as T  # noqa: E402

CODEBOOK, ROWS = 20, 20 + T.EXTRA_ROWS


def _model(dropout: float) -> T.VoiceLM:
    shape = T.LMShape(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64, max_positions=128)
    torch.manual_seed(0)
    return T.VoiceLM(T.qwen_config(shape, 64), ROWS, dropout)


def _batch() -> tuple[torch.Tensor, ...]:
    # two sequences: 4 text ids (past the speech rows), then speech tokens + eos (id CODEBOOK + 1); one padded
    seqs = [([ROWS + 3, ROWS + 9, ROWS + 1, CODEBOOK + 2, 5, 7, 7, 1, 19, CODEBOOK + 1], 4),
            ([ROWS + 5, ROWS + 2, CODEBOOK + 2, 3, 3, 11, CODEBOOK + 1], 3)]
    return T.collate(seqs, [0, 1])


def test_dropout_adds_no_weights_and_is_off_in_eval() -> None:
    plain, dropped = _model(0.0), _model(0.3)
    assert plain.state_dict().keys() == dropped.state_dict().keys()  # llm.pt keeps the official keys
    dropped.load_state_dict(plain.state_dict())
    ids, mask, _ = _batch()
    plain.eval(), dropped.eval()
    with torch.no_grad():
        assert torch.equal(plain(ids, mask), dropped(ids, mask))
        dropped.train()
        assert not torch.equal(plain(ids, mask), dropped(ids, mask))
        # the residual branches themselves: each attention and MLP output is dropped through its forward hook
        layer, x = dropped.llm.model.model.layers[0], torch.randn(1, 50, 32)
        assert len(layer.self_attn._forward_hooks) == len(layer.mlp._forward_hooks) == 1
        assert (layer.mlp(x) == 0).float().mean() > 0.1  # p = 0.3; an MLP output is never exactly 0 otherwise


def test_the_loss_scores_the_targets_alone_as_the_full_logits_would() -> None:
    """Training runs the codebook-wide decoder on the speech targets only: the same loss and the same gradients as
    cross-entropy over every position's logits with the prompt and padding ignored."""
    model, batch = _model(0.0), _batch()
    ids, mask, target = batch
    loss = T.loss_of(model, batch, bf16=False)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    full = torch.nn.functional.cross_entropy(model(ids, mask).flatten(0, 1), target.flatten(), ignore_index=-100)
    want = torch.autograd.grad(full, list(model.parameters()))
    assert int((target != -100).sum()) < target.numel()  # prompt and padding are left out
    torch.testing.assert_close(loss, full, rtol=1e-6, atol=1e-6)
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)


def test_token_noise_replaces_only_speech_inputs() -> None:
    batch = _batch()
    ids, mask, target = batch
    assert T.corrupt(batch, 0.0, CODEBOOK, torch.Generator()) is batch
    noisy, mask2, target2 = T.corrupt(batch, 1.0, CODEBOOK, torch.Generator().manual_seed(0))
    assert torch.equal(mask2, mask) and torch.equal(target2, target)  # targets are never touched
    speech = (ids < CODEBOOK) & mask.bool()
    assert torch.equal(noisy[~speech], ids[~speech])  # text, sos/task/eos and padding kept
    assert (noisy[speech] < CODEBOOK).all() and not torch.equal(noisy[speech], ids[speech])
    share = []
    for seed in range(200):
        n, _, _ = T.corrupt(batch, 0.25, CODEBOOK, torch.Generator().manual_seed(seed))
        share.append(float((n != ids)[speech].float().mean()))
    # a replaced token may draw its own id back (1 / 20): the changed share is 0.25 * 19/20 = 0.2375
    assert abs(sum(share) / len(share) - 0.2375) < 0.03
