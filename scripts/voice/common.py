"""Shared helpers of the voice's build: progress on stderr, the corpus's sentences, the learning-rate schedule,
atomic checkpoints. Paths come from :mod:`scripts.voice.paths`."""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from specli.io.atomic import write_atomic_with


def log(msg: str) -> None:
    """Progress on stderr (scripts only; library code never prints)."""
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Clip:
    """One corpus sentence."""

    id: str  # first 12 hex digits of the sentence's sha1
    text: str  # the sentence as piper spoke it
    seconds: float  # audio length


def clips(split: str, corpus: Path) -> list[Clip]:
    """The ``train`` or ``heldout`` sentences of the corpus ``corpus`` (``<work>/data``), in file order."""
    path = corpus / f"{split}.tsv"
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            cid, text, seconds = line.split("\t")[:3]
            out.append(Clip(cid, text, float(seconds)))
    return out


def wav_path(clip_id: str, corpus: Path) -> Path:
    return corpus / "wavs" / f"{clip_id}.wav"


def lr_at(step: int, peak: float, warmup: int, total: int) -> float:
    """Linear warm-up to ``peak``, then cosine decay to a tenth of it at ``total`` steps."""
    if step < warmup:
        return peak * (step + 1) / warmup
    done = min(1.0, (step - warmup) / max(total - warmup, 1))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))


def update(model: torch.nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor, lr: float) -> None:
    """One optimiser step on ``loss`` at learning rate ``lr``, the gradient norm clipped to 1."""
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def save(path: Path, payload: dict) -> None:
    """``torch.save`` written atomically (a crash never leaves half a checkpoint)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic_with(path, lambda fh: torch.save(payload, fh))


class Ema:
    """An exponential moving average of a model's weights (Polyak averaging): after each optimiser step
    ``avg = decay * avg + (1 - decay) * weights``; ``model`` is the averaged copy (eval mode, no gradients)."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay {decay}: in (0, 1)")
        self.decay = decay  # weight of the average at each step (0.999: ~1,000 steps' memory)
        self.model = copy.deepcopy(model).eval().requires_grad_(False)

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        avg, now = list(self.model.parameters()), list(model.parameters())
        torch._foreach_lerp_(avg, now, 1.0 - self.decay)
        for a, b in zip(self.model.buffers(), model.buffers(), strict=True):
            a.copy_(b)


def init_weights(path: Path) -> dict[str, torch.Tensor]:
    """The float32 weights ``--init`` names: a voice's ``flow.pt`` / ``llm.pt`` (a flat state dict, the official
    keys), or a run's ``best.pt`` (its ``model``: a run continues from another run's best without an extraction
    step)."""
    state = torch.load(path, weights_only=True)
    if isinstance(state.get("model"), dict):
        state = state["model"]
    return {k: v.float() for k, v in state.items()}


def restore(run: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, init: Path | None,
            ema: Ema | None = None) -> tuple[int, float]:
    """``(step, best held-out value)`` of a run: its latest checkpoint's (model, optimiser and ``ema`` restored; a
    checkpoint without an average starts it at the weights), else 0 and inf, from ``init`` weights when given (a
    shipped voice's float16 file with the official keys), else from scratch."""
    found = sorted((run / "checkpoints").glob("ckpt-*.pt"))
    step, best = 0, float("inf")
    if found:
        state = torch.load(found[-1], weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        step, best = state["step"], state["best"]
    elif init is not None:
        model.load_state_dict(init_weights(init))
        log(f"initialised from {init}")
    if ema is not None:
        ema.model.load_state_dict(state["ema"] if found and "ema" in state else model.state_dict())
    return step, best


def checkpoint(run: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int, best: float,
               ema: Ema | None = None) -> None:
    """``<run>/checkpoints/ckpt-<step>.pt`` (model, optimiser, step, best, the average when kept), the two latest
    kept."""
    save(run / "checkpoints" / f"ckpt-{step:08d}.pt",
         {"model": model.state_dict(), "optim": opt.state_dict(), "step": step, "best": best,
          **({"ema": ema.model.state_dict()} if ema is not None else {})})
    for old in sorted((run / "checkpoints").glob("ckpt-*.pt"))[:-2]:
        old.unlink()
