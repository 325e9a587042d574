"""The training loop shared by EAGLE-ASR heads (:mod:`specli.distill.train`) and speech drafters
(:mod:`specli.distill.speech_train`).

A family hands :func:`train_loop` a :class:`Trainee` (its module, optimizer and callables: the loss of a
batch of items, validation, saving the module in ``OUT``, its checkpoint entries) and its options (any
object with the :class:`LoopSettings` fields). The loop runs ``epochs`` passes over the items in an order
seeded by ``seed + epoch``, one optimizer step per ``batch`` items (learning rate: linear warm-up, then with
a step budget a cosine to a tenth), and stops when ``steps`` (if given) are spent.

Checkpoints (``OUT/checkpoints/ckpt-<step>.pt``: the module's entries, the optimizer, the position and the
best validation so far; the two latest kept) are written every ``checkpoint_every`` steps and at every
*boundary* (end of an epoch, or where the step budget stopped it); a rerun resumes from the latest.

Validation runs only at a boundary (every ``val_every``-th epoch, after the last one, and where training
stops), and the module saved in ``OUT`` is the best validated one. A boundary is handled by one function,
:func:`_boundary`, in one order: validate, save the module in ``OUT`` if it is the best, then write the
boundary checkpoint. ``OUT``'s module therefore never changes after the latest checkpoint was written: the
best validation a resumed run reads is the one of the module in ``OUT`` (a checkpoint inside an epoch is
written before that epoch's validation, and a run resumed from it validates again).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from specli.io.atomic import write_atomic_with

Progress = Callable[[str], None]
CHECKPOINTS = "checkpoints"  # the checkpoint directory under OUT


class LoopSettings(Protocol):
    """The options the loop reads (both families' option dataclasses have them)."""

    @property
    def epochs(self) -> int: ...  # passes over the items

    @property
    def steps(self) -> int: ...  # optimizer steps in all (0 = no limit)

    @property
    def lr(self) -> float: ...  # peak learning rate

    @property
    def warmup(self) -> int: ...  # steps of linear warm-up

    @property
    def batch(self) -> int: ...  # items per optimizer step

    @property
    def seed(self) -> int: ...  # seed of the item order and of each step's generator

    @property
    def checkpoint_every(self) -> int: ...  # optimizer steps between checkpoints

    @property
    def val_every(self) -> int: ...  # validate after every N-th epoch (and the last one)

    @property
    def clip(self) -> float: ...  # gradient-norm clipping


@dataclass(frozen=True)
class Trainee:
    """What the loop trains, and the family's part of each step."""

    module: torch.nn.Module  # the drafter trained (its parameters are clipped)
    optimizer: torch.optim.Optimizer  # its optimizer (the loop sets the learning rate, steps it and checkpoints it)
    items: int  # training items (windows, sequences) an epoch passes over
    # (item indices, the step's generator) -> the batch's loss and its parts in words (progress lines)
    loss: Callable[[list[int], torch.Generator], tuple[torch.Tensor, str]]
    # -> acceptance length and what it was measured on in words; None: no validation data
    validate: Callable[[], tuple[float, str]] | None
    save: Callable[[int, float, float | None], None]  # (steps done, last loss, validation) -> module saved in OUT
    entries: Callable[[], dict]  # the module's checkpoint entries (state dicts, config); optimizer and position added


@dataclass(frozen=True)
class Position:
    """Where training is: a checkpoint's position."""

    step: int  # optimizer steps done in all
    epoch: int  # the epoch under way (0-based)
    batch_index: int  # batches of it done


@dataclass(frozen=True)
class TrainSummary:
    """What a training run did."""

    steps: int  # optimizer steps taken in all (resumed ones included)
    last_loss: float  # loss of the last step
    val_acceptance: float | None  # acceptance length on the held-out items at the last validation
    best_acceptance: float | None  # the best validation acceptance: the module saved is that one
    head_dir: Path  # where the module was saved
    seconds_per_step: float  # mean wall time of this run's steps


@dataclass
class _Run:
    """The mutable state of one run of the loop."""

    step: int  # optimizer steps done in all
    best: float | None  # best validation acceptance so far (that of the module in OUT)
    loss: float = float("nan")  # loss of the last step
    val: float | None = None  # the last validation acceptance of this run
    spent: float = 0.0  # wall seconds of this run's steps
    taken: int = 0  # steps taken by this run


def learning_rate(options: LoopSettings, step: int) -> float:
    """Linear warm-up, then (with a step budget) cosine decay to a tenth of ``lr`` at ``steps``."""
    lr = options.lr * min(1.0, (step + 1) / max(options.warmup, 1))
    if options.steps and step >= options.warmup:
        done = min(1.0, (step - options.warmup) / max(options.steps - options.warmup, 1))
        lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))
    return lr


def epoch_batches(n: int, batch: int, seed: int, epoch: int, skip: int = 0) -> Iterator[tuple[int, list[int]]]:
    """``(batch index, item indices)`` of one epoch over ``n`` items in an order seeded by ``seed + epoch``;
    the first ``skip`` batches (done before a resume) are left out."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
    for bi, i in enumerate(range(0, n, batch)):
        if bi >= skip:
            yield bi, [int(j) for j in order[i : i + batch]]


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest ``ckpt-*.pt`` of ``ckpt_dir`` (None when there is none)."""
    found = sorted(ckpt_dir.glob("ckpt-*.pt"))
    return found[-1] if found else None


def read_checkpoint(out: Path) -> dict | None:
    """The latest checkpoint under ``out`` (None for a new run): the entries a family restores its module
    and optimizer from; :func:`train_loop` reads the position and best validation from it."""
    latest = latest_checkpoint(out / CHECKPOINTS)
    return None if latest is None else torch.load(latest, weights_only=True)


def write_checkpoint(ckpt_dir: Path, position: Position, best: float | None, entries: dict) -> None:
    """Write ``ckpt-<step>.pt`` atomically: ``entries`` (state dicts), the position and the best validation
    so far; keep the two latest checkpoints."""
    state = {**entries, "step": position.step, "epoch": position.epoch, "batch_index": position.batch_index,
             "best_val": -1.0 if best is None else best}
    write_atomic_with(ckpt_dir / f"ckpt-{position.step:08d}.pt", lambda fh: torch.save(state, fh))
    for old in sorted(ckpt_dir.glob("ckpt-*.pt"))[:-2]:  # keep the two latest
        old.unlink()


def checkpoint_position(state: dict | None) -> tuple[Position, float | None]:
    """The position and best validation so far of a checkpoint's ``state`` (the start: None)."""
    if state is None:
        return Position(0, 0, 0), None
    best = float(state.get("best_val", -1.0))
    return Position(int(state["step"]), int(state["epoch"]), int(state["batch_index"])), (None if best < 0 else best)


def restored_optimizer(module: torch.nn.Module, lr: float, state: dict | None,
                       weight_decay: float = 0.01) -> torch.optim.AdamW:
    """AdamW over ``module``'s parameters, its state restored from a checkpoint's ``state`` (if any)."""
    opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=weight_decay)
    if state is not None:
        opt.load_state_dict(state["optim"])
    return opt


def _spent(options: LoopSettings, step: int) -> bool:
    return bool(options.steps) and step >= options.steps


def _checkpoint(trainee: Trainee, out: Path, run: _Run, epoch: int, batch_index: int) -> None:
    entries = {**trainee.entries(), "optim": trainee.optimizer.state_dict()}
    write_checkpoint(out / CHECKPOINTS, Position(run.step, epoch, batch_index), run.best, entries)


def _train_step(trainee: Trainee, options: LoopSettings, run: _Run, idx: list[int]) -> str:
    """One optimizer step on the items ``idx``; its loss's parts in words."""
    gen = torch.Generator().manual_seed(options.seed * 1_000_003 + run.step)
    t0 = time.perf_counter()
    opt = trainee.optimizer
    for group in opt.param_groups:
        group["lr"] = learning_rate(options, run.step)
    loss, parts = trainee.loss(idx, gen)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainee.module.parameters(), options.clip)
    opt.step()
    run.step, run.loss = run.step + 1, float(loss.detach())
    run.spent, run.taken = run.spent + time.perf_counter() - t0, run.taken + 1
    return parts


def _train_epoch(trainee: Trainee, options: LoopSettings, out: Path, run: _Run, epoch: int, skip: int,
                 progress: Progress | None) -> int | None:
    """The batches of ``epoch`` after the first ``skip``; the batch index where the step budget stopped
    it (None: the epoch ran to its end). Checkpoints written here precede the epoch's validation."""
    for bi, idx in epoch_batches(trainee.items, options.batch, options.seed, epoch, skip):
        if _spent(options, run.step):
            return bi
        parts = _train_step(trainee, options, run, idx)
        if progress is not None:
            progress(f"epoch {epoch + 1} step {run.step}: loss {run.loss:.4f} ({parts})")
        if run.step % options.checkpoint_every == 0:
            _checkpoint(trainee, out, run, epoch, bi + 1)
    return None


def _boundary(trainee: Trainee, out: Path, run: _Run, epoch: int, validate: bool, resume_at: tuple[int, int],
              progress: Progress | None) -> None:
    """The end of an epoch's training (or where the budget stopped it): validate (when ``validate``), save
    the module in OUT if it is the best so far, and only then write the checkpoint a rerun resumes from
    (at ``resume_at``: epoch, batches of it done), which records that best."""
    if validate and trainee.validate is not None:
        run.val, measured = trainee.validate()
        if progress is not None:
            progress(f"epoch {epoch + 1}: validation acceptance length {run.val:.3f} {measured}")
        if run.best is None or run.val > run.best:  # the module saved in OUT is the best validated one
            run.best = run.val
            trainee.save(run.step, run.loss, run.val)
    _checkpoint(trainee, out, run, *resume_at)


def train_loop(trainee: Trainee, options: LoopSettings, out: Path, state: dict | None,
               progress: Progress | None = None) -> TrainSummary:
    """Train ``trainee`` from the checkpoint ``state`` (None: from the start; see :func:`read_checkpoint`)
    under ``options``; checkpoints go to ``out/checkpoints`` and the best validated module (or, without
    validation, the last) to ``out``."""
    start, best = checkpoint_position(state)
    run = _Run(start.step, best)
    for epoch in range(start.epoch, options.epochs):
        if _spent(options, run.step):
            break
        stopped = _train_epoch(trainee, options, out, run, epoch, start.batch_index if epoch == start.epoch else 0,
                               progress)
        ends = stopped is not None or _spent(options, run.step)  # no step of this run comes after this boundary
        due = ends or (epoch + 1) % options.val_every == 0 or epoch + 1 == options.epochs
        _boundary(trainee, out, run, epoch, due, (epoch, stopped) if stopped is not None else (epoch + 1, 0),
                  progress)
        if stopped is not None:
            break
    if run.best is None or (run.val is not None and run.val >= run.best):  # not validated, or the last is the best
        trainee.save(run.step, run.loss, run.val)
    return TrainSummary(run.step, run.loss, run.val, run.best, out, run.spent / max(run.taken, 1))
