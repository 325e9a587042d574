"""scripts/voice/vocoder.py: a HiFi-GAN with fewer blocks a stage, started from the teacher's weights and trained
blockwise to reproduce it; gradients reach HiFi-GAN's convolutions in training (oneDNN's fused convolution, which
has no autograd kernel, is for inference only)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from specli.tts.acoustic.hifigan import HifiGan, HifiGanConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from scripts.voice import vocoder as V  # noqa: E402

# a tiny V1 shape with three blocks a stage, as V1 has
TINY = HifiGanConfig(upsample_rates=(4, 2), upsample_kernel_sizes=(8, 4), upsample_initial_channel=16,
                     resblock_kernel_sizes=(3, 5, 7), resblock_dilation_sizes=((1, 3), (1, 2), (1, 3)),
                     hop_size=8, n_fft=16, win_size=16, sampling_rate=8000, fmax=4000.0)


def _teacher(seed: int = 0) -> HifiGan:
    torch.manual_seed(seed)
    return HifiGan(TINY).eval().requires_grad_(False)


def _mels(batch: int, frames: int, seed: int) -> torch.Tensor:  # [B, 80, T]
    return torch.randn(batch, 80, frames, generator=torch.Generator().manual_seed(seed)) - 5.0


def test_the_student_keeps_the_teachers_weights_for_the_kept_blocks() -> None:
    teacher = _teacher()
    student = V.student_of(teacher, (3, 7))
    assert student.cfg.resblock_kernel_sizes == (3, 7) and student.cfg.resblock_dilation_sizes == ((1, 3), (1, 3))
    for stage in range(2):
        for new, old in ((0, 0), (1, 2)):
            a, b = student.resblocks[stage * 2 + new].state_dict(), teacher.resblocks[stage * 3 + old].state_dict()
            assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(student.conv_post.weight, teacher.conv_post.weight)
    with torch.inference_mode():  # all kernels kept: the teacher's function
        torch.testing.assert_close(V.student_of(teacher, (3, 5, 7)).vocode(_mels(1, 9, 1)),
                                   teacher.vocode(_mels(1, 9, 1)), rtol=0, atol=0)
    for bad in ((), (9,), (3, 3)):
        with pytest.raises(ValueError, match="distinct kernels"):
            V.pruned_config(TINY, bad)


def test_gradients_reach_the_convolutions_in_training() -> None:
    """The same gradients with oneDNN's fused convolution available as without it (it is skipped when a
    gradient is wanted: backpropagating through it silently gives none)."""
    import specli.tts.acoustic.hifigan as H

    student = V.student_of(_teacher(), (3, 7)).train()
    grads = []
    for fused in (True, False):
        student.zero_grad()
        old = H._POINTWISE
        H._POINTWISE = H._POINTWISE and fused
        try:
            student(_mels(2, 6, 2)).abs().mean().backward()
        finally:
            H._POINTWISE = old
        grads.append([p.grad.clone() for p in student.parameters()])
    assert all(g.abs().sum() > 0 for g in grads[0])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_blockwise_training_brings_the_student_toward_the_teacher() -> None:
    teacher = _teacher()
    student = V.student_of(teacher, (3, 7)).train()
    opt = torch.optim.Adam(student.parameters(), lr=3e-3)
    mels = _mels(4, 12, 3)
    losses = []
    for _ in range(60):
        loss = V.blockwise_loss(student, V.stage_io(teacher, mels))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])
    with torch.inference_mode():  # the whole chain follows: closer to the teacher's audio than at the start
        before = (V.student_of(teacher, (3, 7)).vocode(mels) - teacher.vocode(mels)).abs().mean()
        after = (student.vocode(mels) - teacher.vocode(mels)).abs().mean()
    assert after < 0.7 * before, (float(before), float(after))


def test_the_stage_trains_resumes_and_keeps_its_best(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "wavs").mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows = {"train": [], "heldout": []}
    for i in range(240):
        split = "train" if i < 4 else "heldout"
        cid = f"{i:012x}"
        sf.write(data / "wavs" / f"{cid}.wav", (0.1 * rng.standard_normal(8 * 40)).astype(np.float32), 8000)
        rows[split].append(f"{cid}\tsentence {i}\t0.04")
    for split, lines in rows.items():
        (data / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    args = argparse.Namespace(kernels="3,7", steps=4, lr=1e-3, warmup=1, batch=2, segment=8, val_every=2, seed=0)
    run = tmp_path / "train" / "vocoder"
    best = V.train(data, run, args, teacher=_teacher())
    saved = torch.load(run / "best.pt", weights_only=False)
    assert saved["val"] == best and saved["config"]["resblock_kernel_sizes"] == (3, 7) and saved["step"] in (2, 4)
    args.steps = 6  # resumes from step 4's checkpoint
    V.train(data, run, args, teacher=_teacher())
    assert sorted(p.name for p in (run / "checkpoints").glob("*.pt"))[-1] == "ckpt-00000006.pt"
    student = HifiGan(HifiGanConfig(**{**saved["config"], "resblock_dilation_sizes": tuple(
        tuple(d) for d in saved["config"]["resblock_dilation_sizes"])}))
    student.load_state_dict(saved["model"])  # best.pt loads into the plain generator
