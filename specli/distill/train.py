"""Train an EAGLE Speech-Draft head on ``specli distill data`` shards.

Unrolled multi-step training (EAGLE-3 "training-time test"): from every start row ``p`` of a window
(the target state that predicted the pending token ``t[p+1]``), the head drafts ``K`` steps. Step 1
reads the target's low / mid / last states of row ``p``; steps 2..K read the head's *own* output of
the previous step (never the target's states of later rows) with the embedding of the target's token
at that position (teacher-forced tokens, on-policy labels). Step ``k`` predicts ``t[p+k+1]``; the
loss is ``sum_k beta**(k-1) * CE_k`` (each CE a mean over the valid rows), optimised with AdamW.

The epochs, step budget, learning-rate schedule, checkpoints (head + optimizer + position, under
``OUT/checkpoints``; a rerun resumes from the latest) and validation are :mod:`specli.distill.loop`'s.
With validation windows, the head saved in ``OUT`` is the one with the best validation acceptance so far
(early stopping on a small data set).
Validation acceptance length (tau, tokens per target forward, bonus included) is measured every
``val_every`` epochs by running the real
:func:`~specli.core.speculative.speculative_decode` with an :class:`EagleDrafter` (greedy, chain)
against the target on held-out windows; its output is checked against the recorded greedy tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

from specli.asr.drafters.eagle_head import SpeechDraftHead, draft_vocabulary, load_head, save_head

from specli.asr.drafters.eagle import EagleDrafter
from specli.core.job import DecodeJob
from specli.core.speculative import SpecOptions, speculative_decode
from specli.models.whisper.loader import WhisperModel
from specli.models.whisper.rules import WhisperLogitRules
from specli.core.types import DecodeStats, accumulate
from specli.distill.loop import (Progress, Trainee, TrainSummary, learning_rate, read_checkpoint, restored_optimizer,
                                 train_loop)

__all__ = ["Batch", "TrainOptions", "TrainSummary", "dropped", "learning_rate", "make_batch", "new_head", "noisy",
           "start_rows", "train", "unrolled_loss", "validate"]


@dataclass(frozen=True)
class TrainOptions:
    """How to train a head."""

    epochs: int = 1  # passes over the training windows
    steps: int = 0  # stop after this many optimizer steps in all (0 = no limit)
    lr: float = 3e-4  # AdamW learning rate
    batch: int = 4  # windows per optimizer step
    unroll: int = 7  # K: draft steps unrolled per start row
    beta: float = 0.8  # weight of step k is beta ** (k - 1)
    max_starts: int = 64  # start rows sampled per window per step (bounds the LM-head cost)
    checkpoint_every: int = 100  # optimizer steps between checkpoints
    val_windows: int = 16  # held-out windows decoded for the acceptance length (0 = none)
    val_max_draft: int = 8  # max_draft of the validation decode
    val_every: int = 1  # validate after every N-th epoch (and after the last one)
    seed: int = 0  # seed of the window order and start sampling
    clip: float = 1.0  # gradient-norm clipping
    warmup: int = 50  # optimizer steps of linear learning-rate warm-up (from the step count: resumable)
    # with a step budget the rate then decays along a cosine to lr / 10 at ``steps``
    draft_vocab: int = 8192  # rows of the head's draft vocabulary, most frequent first (0 = whole vocabulary)
    feature_noise: float = 0.05  # Gaussian noise on the target's low/mid/last states, std relative to each row's RMS
    dropout: float = 0.1  # dropout on the block's input at every unrolled step (training only; inference unchanged)
    # matmul precision of the training steps: bfloat16 = CPU autocast (weights, gradients and AdamW state stay
    # float32; ~1.5x faster steps on CPUs with native bf16), float32 = plain
    precision: Literal["float32", "bfloat16"] = "float32"
    init: str | None = None  # start from this trained head (directory or shipped name; its draft vocabulary)

    def __post_init__(self) -> None:
        if self.precision not in ("float32", "bfloat16"):
            raise ValueError(f"precision must be 'float32' or 'bfloat16', not {self.precision!r}")
        if not self.feature_noise >= 0.0:
            raise ValueError("feature_noise must be >= 0")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("dropout must be within [0, 1)")
        if self.draft_vocab < 0:
            raise ValueError("draft_vocab must be >= 0")
        if self.val_every < 1 or self.checkpoint_every < 1:
            raise ValueError("val_every and checkpoint_every must be >= 1")
        if self.epochs < 1 or self.steps < 0 or self.batch < 1 or self.unroll < 1 or self.max_starts < 1:
            raise ValueError("epochs, batch, unroll and max_starts must be >= 1; steps >= 0")
        if not 0.0 < self.beta <= 1.0 or self.lr <= 0:
            raise ValueError("beta must be within (0, 1] and lr > 0")


@dataclass(frozen=True)
class Batch:
    """Unrolled training examples of ``B`` windows, ``S`` start rows each, ``K`` steps."""

    low: torch.Tensor  # [B, S, d] target states of the start rows
    mid: torch.Tensor  # [B, S, d]
    last: torch.Tensor  # [B, S, d]
    tokens: torch.Tensor  # [B, S, K] input token of each step (t[p+k])
    positions: torch.Tensor  # [B, S, K] its decoder position (p+k)
    labels: torch.Tensor  # [B, S, K] target token of each step (t[p+k+1]), -100 where none
    audio: torch.Tensor  # [B, A, d] encoder outputs


def start_rows(window: dict) -> list[int]:
    """Rows ``p`` whose pending token ``t[p+1]`` is the prompt's last token or a sampled one."""
    n, plen = len(window["tokens"]), int(window["plen"])
    return list(range(max(plen - 2, 0), n - 2))


def make_batch(windows: list[dict], unroll: int, max_starts: int, gen: torch.Generator | None = None) -> Batch:
    """Gather start rows (at most ``max_starts`` per window, sampled) into padded tensors."""
    rows = []
    for w in windows:
        starts = torch.tensor(start_rows(w), dtype=torch.long)
        if len(starts) > max_starts:
            starts = starts[torch.randperm(len(starts), generator=gen)[:max_starts]].sort().values
        rows.append(starts)
    b, s, d = len(windows), max(1, max(len(r) for r in rows)), windows[0]["last"].shape[-1]
    low, mid, last = (torch.zeros(b, s, d) for _ in range(3))
    tokens = torch.zeros(b, s, unroll, dtype=torch.long)
    positions = torch.zeros(b, s, unroll, dtype=torch.long)
    labels = torch.full((b, s, unroll), -100, dtype=torch.long)
    steps = torch.arange(1, unroll + 1)
    for i, (w, starts) in enumerate(zip(windows, rows)):
        n = len(starts)
        if not n:
            continue
        t = w["tokens"]
        for name, dst in (("low", low), ("mid", mid), ("last", last)):
            dst[i, :n] = w[name][starts].float()
        pos = starts[:, None] + steps[None]  # [n, K] position of each step's input token
        valid_in, valid_out = pos < len(t), pos + 1 < len(t)
        tokens[i, :n] = torch.where(valid_in, t[pos.clamp(max=len(t) - 1)], 0)
        positions[i, :n] = pos.clamp(max=len(t) - 1)
        labels[i, :n] = torch.where(valid_out, t[(pos + 1).clamp(max=len(t) - 1)], -100)
    audio = torch.stack([w["audio"].float() for w in windows])
    return Batch(low, mid, last, tokens, positions, labels, audio)


def noisy(h: torch.Tensor, std: float, gen: torch.Generator | None = None) -> torch.Tensor:
    """``h [..., d]`` plus Gaussian noise of ``std`` times each row's RMS (``h`` itself when ``std`` is 0)."""
    if not std:
        return h
    rms = h.float().pow(2).mean(-1, keepdim=True).sqrt()
    return h + std * rms * torch.randn(h.shape, generator=gen, dtype=h.dtype, device=h.device)


def dropped(x: torch.Tensor, p: float, gen: torch.Generator | None = None) -> torch.Tensor:
    """Inverted dropout of ``x`` with probability ``p`` (seeded by ``gen``; ``x`` itself when ``p`` is 0)."""
    if not p:
        return x
    keep = torch.rand(x.shape, generator=gen, device=x.device) >= p
    return x * keep.to(x.dtype) / (1.0 - p)


def unrolled_loss(head: SpeechDraftHead, batch: Batch, beta: float, feature_noise: float = 0.0, dropout: float = 0.0,
                  gen: torch.Generator | None = None) -> tuple[torch.Tensor, list[float]]:
    """``sum_k beta**(k-1) * CE_k`` over ``K`` unrolled steps, and each step's CE. Regularisers (training
    only, both 0 = off): ``feature_noise`` perturbs the target's states (relative Gaussian noise, as the head
    will meet states of audio it never saw), ``dropout`` drops the block's input at every step."""
    cross = head.cross_kv(batch.audio)
    low, mid, last = (noisy(h, feature_noise, gen) for h in (batch.low, batch.mid, batch.last))
    x = head.first_input(low, mid, last, batch.tokens[..., 0], batch.positions[..., 0])
    past: tuple[torch.Tensor, torch.Tensor] | None = None
    total = torch.zeros(())
    per_step: list[float] = []
    unroll = batch.tokens.shape[-1]
    for k in range(unroll):
        out, kk, vv = head.block(dropped(x, dropout, gen), past, cross)
        past = (kk, vv) if past is None else (torch.cat([past[0], kk], 2), torch.cat([past[1], vv], 2))
        labels = batch.labels[..., k]
        labels = torch.where(labels >= 0, head.to_draft[labels.clamp(min=0)], -100)  # draft rows
        if bool((labels >= 0).any()):
            ce = F.cross_entropy(head.logits(out).flatten(0, 1), labels.flatten(), ignore_index=-100)
            total = total + beta**k * ce
            per_step.append(float(ce.detach()))
        if k + 1 < unroll:  # the head's own output feeds the next step
            x = head.next_input(out, batch.tokens[..., k + 1], batch.positions[..., k + 1])
    return total, per_step


def validate(head: SpeechDraftHead, model: WhisperModel, windows: list[dict], max_draft: int = 8) -> tuple[float, int]:
    """Acceptance length of real greedy speculative decoding on ``windows``; and how many decoded
    differently from the recorded greedy tokens (must be 0: decoding is lossless)."""
    head.eval()
    sp, target = model.special, model.target
    stats, mismatched = DecodeStats(), 0
    drafter = EagleDrafter(head)
    for w in windows:
        tokens, plen = w["tokens"].tolist(), int(w["plen"])
        prompt = tokens[:plen]
        rules = WhisperLogitRules.for_model(sp, timestamps=prompt[-1] != sp.no_timestamps)
        state = target.start(w["audio"][None].to(target.compute_dtype))
        max_new = min(224, target.dims.text_ctx - plen)
        job = DecodeJob(tuple(prompt), rules, sp.eot, max_new)
        res = speculative_decode(target, state, job, drafter, SpecOptions(max_draft=max_draft))
        expected = [t for t in tokens[plen:] if t != sp.eot]
        mismatched += int(res.tokens != expected)
        accumulate(stats, res.stats)
    head.train()
    return stats.acceptance_length, mismatched


def new_head(model: WhisperModel, windows: list[dict], draft_vocab: int) -> SpeechDraftHead:
    """A fresh head whose draft vocabulary is the ``draft_vocab`` tokens the target emitted most often
    in ``windows`` (plus every special and timestamp token; the whole vocabulary when 0), its block
    started from the target's last decoder layer (in 70 steps on tiny.en data: step-1 loss 3.1 vs 5.5
    from a random block)."""
    target = model.target
    vocab = target.dims.vocab
    ids = None
    if draft_vocab and draft_vocab < vocab:
        counts = torch.zeros(vocab, dtype=torch.long)
        for w in windows:
            counts += torch.bincount(w["tokens"][int(w["plen"]) :], minlength=vocab)
        ids = draft_vocabulary(counts, draft_vocab, model.special.eot)
    return SpeechDraftHead.for_target(target, model.name, ids).init_from_target(target)


def _training_info(opts: TrainOptions, step: int, loss: float, val: float | None, n_windows: int) -> dict:
    return {"steps": step, "epochs": opts.epochs, "lr": opts.lr, "batch": opts.batch, "unroll": opts.unroll,
            "beta": opts.beta, "max_starts": opts.max_starts, "draft_vocab": opts.draft_vocab,
            "feature_noise": opts.feature_noise, "dropout": opts.dropout, "precision": opts.precision,
            "init": opts.init,
            "last_loss": loss, "val_acceptance": val,
            "train_windows": n_windows}




def _restore(state: dict | None, model: WhisperModel, windows: list[dict], options: TrainOptions) -> SpeechDraftHead:
    """The head of the checkpoint ``state`` (its own draft vocabulary, whatever the data now holds), else
    ``options.init``'s trained head (a float32 copy, its own draft vocabulary), else a new one."""
    if state is not None:
        head = SpeechDraftHead.for_target(model.target, model.name, state["head"]["vocab_ids"])
        head.load_state_dict(state["head"])
        return head
    if options.init:
        return load_head(options.init, model.target)
    return new_head(model, windows, options.draft_vocab)


def _trainee(head: SpeechDraftHead, opt: torch.optim.Optimizer, model: WhisperModel, out: Path, windows: list[dict],
             val_set: list[dict], options: TrainOptions) -> Trainee:
    """The loop's view of an EAGLE head: unrolled loss (under autocast with bfloat16 precision), greedy
    validation on ``val_set``, ``save_head`` into ``out``."""
    half = options.precision == "bfloat16"

    def loss(idx: list[int], gen: torch.Generator) -> tuple[torch.Tensor, str]:
        batch = make_batch([windows[j] for j in idx], options.unroll, options.max_starts, gen)
        with torch.autocast(batch.audio.device.type, dtype=torch.bfloat16, enabled=half):
            total, per_step = unrolled_loss(head, batch, options.beta, options.feature_noise, options.dropout, gen)
        return total, f"per step {', '.join(f'{c:.2f}' for c in per_step)}"

    def check() -> tuple[float, str]:
        val, bad = validate(head, model, val_set, options.val_max_draft)
        return val, (f"on {len(val_set)} window(s); {bad} decoded differently from the recorded greedy tokens")

    def save(step: int, last_loss: float, val: float | None) -> None:
        save_head(head, out, _training_info(options, step, last_loss, val, len(windows)))

    return Trainee(head, opt, len(windows), loss, check if val_set else None, save,
                   lambda: {"head": head.state_dict()})


def train(
    windows: list[dict], model: WhisperModel, out: Path, options: TrainOptions = TrainOptions(),
    val_windows: list[dict] | None = None, progress: Progress | None = None,
) -> TrainSummary:
    """Train (or resume training) a head for ``model`` on ``windows``; save it under ``out``."""
    windows = [w for w in windows if start_rows(w)]
    if not windows:
        raise ValueError("no training window has a sampled token to predict")
    state = read_checkpoint(out)
    head = _restore(state, model, windows, options).train()
    opt = restored_optimizer(head, options.lr, state)
    val_set = (val_windows or [])[: options.val_windows]
    return train_loop(_trainee(head, opt, model, out, windows, val_set, options), options, out, state, progress)
