"""FSQ training with probe heads: codes -> CTC over espeak phonemes (a residual conv stack) + the token's 4 vocoder mel frames.

The FSQ projection (graph.FSQ) is what ships; the heads only make the codes carry phonetic content
(CTC) and local acoustics (mel L1).  ``quantise=False`` trains the same model without rounding (the
continuous reference).
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .graph import FSQ, MEL_FRAMES_PER_TOKEN, feature_dim
from .store import FeatureSet

CTC_PER_TOKEN = 2  # CTC frames per token: phonemes can outnumber 21.5 Hz tokens


class ResBlock(nn.Module):
    """Pre-norm residual conv block over time: LayerNorm, conv k, GELU, 1x1 conv."""

    def __init__(self, dim: int, kernel: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.conv = nn.Conv1d(dim, dim, kernel, padding=kernel // 2)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # [B, n, dim], [B, n, 1]
        h = self.conv((self.norm(x) * mask).transpose(1, 2)).transpose(1, 2)
        return x + self.out(F.gelu(h)) * mask


class Probe(nn.Module):
    def __init__(self, levels: Sequence[int], n_symbols: int, quantise: bool = True, dim_in: int = 512,
                 hidden: int = 256, mel_bins: int = 80, blocks: int = 5, kernel: int = 5) -> None:
        super().__init__()
        self.fsq = FSQ(levels, dim_in)
        self.quantise = quantise
        d = len(levels)
        self.inp = nn.Linear(d, hidden)
        self.blocks = nn.ModuleList(ResBlock(hidden, kernel) for _ in range(blocks))
        self.norm = nn.LayerNorm(hidden)
        self.ctc = nn.Linear(hidden, CTC_PER_TOKEN * (n_symbols + 1))  # blank = 0
        self.mel = nn.Sequential(nn.Conv1d(d, hidden, 3, padding=1), nn.GELU(),
                                 nn.Conv1d(hidden, MEL_FRAMES_PER_TOKEN * mel_bins, 3, padding=1))
        self.mel_bins = mel_bins

    def codes(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.fsq.codes(x, self.quantise) * mask.unsqueeze(-1)

    def heads(self, c: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """codes ``[B, n, d]`` -> (CTC log-probs ``[B, 2n, V+1]``, mel ``[B, 4n, 80]``).

        CTC: a residual conv stack (receptive field ``blocks * (kernel - 1) + 1`` tokens) over the codes;
        mel: two small convs (3 tokens of context), so the codes themselves must carry local acoustics."""
        b, n, _ = c.shape
        mask = (torch.arange(n, device=c.device)[None] < lengths[:, None].to(c.device)).unsqueeze(-1).float()
        h = self.inp(c)
        for block in self.blocks:
            h = block(h, mask)
        logits = self.ctc(self.norm(h)).reshape(b, n * CTC_PER_TOKEN, -1)
        mel = self.mel(c.transpose(1, 2)).transpose(1, 2).reshape(b, n * MEL_FRAMES_PER_TOKEN, self.mel_bins)
        return logits.log_softmax(-1), mel


def from_config(cfg: dict, n_symbols: int) -> Probe:
    """The probe of a run's config (its FSQ reads ``512 * taps`` features), untrained."""
    return Probe(cfg["levels"], n_symbols, cfg["quantise"], dim_in=feature_dim(cfg["layer"]), hidden=cfg["hidden"])


class Batch:
    """Padded features, mels and CTC targets of some clips."""

    def __init__(self, fs: FeatureSet, rows: Sequence[int], targets: Sequence[Sequence[int]]) -> None:
        n = torch.tensor([int(fs.n[i]) for i in rows])
        nmax = int(n.max())
        self.x = torch.zeros(len(rows), nmax, fs.feats.shape[1])
        self.mel = torch.zeros(len(rows), MEL_FRAMES_PER_TOKEN * nmax, fs.mel.shape[1])
        for j, i in enumerate(rows):
            f, m = fs.clip(i)
            self.x[j, :len(f)] = torch.from_numpy(f.astype(np.float32))
            self.mel[j, :len(m)] = torch.from_numpy(m.astype(np.float32))
        self.lengths = n
        self.mask = (torch.arange(nmax)[None] < n[:, None]).float()
        self.targets = [list(targets[i]) for i in rows]
        self.rows = list(rows)


def batches(fs: FeatureSet, max_tokens: int, seed: int, shuffle: bool = True) -> list[list[int]]:
    """Length-sorted batches of at most ``max_tokens`` padded tokens, in a seeded random order."""
    rng = np.random.default_rng(seed)
    noise = rng.random(len(fs.n)) if shuffle else np.zeros(len(fs.n))
    order = np.lexsort((noise, fs.n))
    out, cur, cur_max = [], [], 0
    for i in order:
        m = max(cur_max, int(fs.n[i]))
        if cur and m * (len(cur) + 1) > max_tokens:
            out.append(cur)
            cur, m = [], int(fs.n[i])
        cur.append(int(i))
        cur_max = m
    if cur:
        out.append(cur)
    if shuffle:
        rng.shuffle(out)
    return out


def losses(model: Probe, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(CTC loss per target symbol, masked mel L1)."""
    c = model.codes(b.x, b.mask)
    logp, mel = model.heads(c, b.lengths)
    tgt = torch.tensor([s for t in b.targets for s in t], dtype=torch.long)
    tlen = torch.tensor([len(t) for t in b.targets])
    ctc = F.ctc_loss(logp.transpose(0, 1), tgt, b.lengths * CTC_PER_TOKEN, tlen, blank=0,
                     reduction="mean", zero_infinity=True)
    mmask = b.mask.repeat_interleave(MEL_FRAMES_PER_TOKEN, dim=1).unsqueeze(-1)
    l1 = ((mel - b.mel).abs() * mmask).sum() / (mmask.sum() * mel.shape[-1])
    return ctc, l1


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def greedy(logp: torch.Tensor, length: int) -> list[int]:
    ids = logp[: length * CTC_PER_TOKEN].argmax(-1).tolist()
    out, prev = [], 0
    for s in ids:
        if s != prev and s != 0:
            out.append(s)
        prev = s
    return out


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


@torch.no_grad()
def evaluate(model: Probe, fs: FeatureSet, targets: Sequence[Sequence[int]], max_tokens: int = 4000) -> dict:
    """Held-out PER (greedy CTC), mel L1 and the FSQ indices of every clip."""
    model.eval()
    errs = total = 0
    l1_sum = l1_n = 0.0
    indices: list[np.ndarray] = [np.zeros(0, np.int64)] * len(fs.n)
    for rows in batches(fs, max_tokens, 0, shuffle=False):
        b = Batch(fs, rows, targets)
        c = model.codes(b.x, b.mask)
        logp, mel = model.heads(c, b.lengths)
        idx = model.fsq.indices(b.x)
        for j, i in enumerate(rows):
            hyp = greedy(logp[j], int(b.lengths[j]))
            errs += edit_distance(b.targets[j], hyp)
            total += len(b.targets[j])
            indices[i] = idx[j, : int(b.lengths[j])].numpy()
        _, l1 = losses(model, b)
        l1_sum += l1.item() * len(rows)
        l1_n += len(rows)
    model.train()
    return {"per": errs / max(1, total), "mel_l1": l1_sum / max(1.0, l1_n), "indices": indices}


def usage(indices: Sequence[np.ndarray], size: int) -> dict:
    """Codebook usage: codes used, dead codes, perplexity exp(H) of the code distribution."""
    counts = np.bincount(np.concatenate(list(indices)), minlength=size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return {"size": size, "used": int((counts > 0).sum()), "dead": int((counts == 0).sum()),
            "perplexity": float(np.exp(-(p * np.log(p)).sum())), "tokens": int(counts.sum())}


def iterate(order: list[list[int]], start: int) -> Iterator[tuple[int, list[int]]]:
    for k in range(start, len(order)):
        yield k, order[k]

