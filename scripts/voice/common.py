"""Shared paths and corpus access for the scripts that build specli's own voice (specli-en).

Everything heavy lives outside git under ``$SPECLI_VOICE_WORK`` (default ``/work/voice``): the piper corpus
(``data/``, rebuilt by ``scripts/make_voice_data.py``), the speech tokenizer's caches, training checkpoints.
What must outlive a machine is committed under ``data/voice/`` (sentence hashes, speech-token ids) and, once it
beats the committed one, the voice itself: ``specli/voices/specli-en/``, the shipped package data that training
continues from.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from specli.io.atomic import write_atomic_with

REPO = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("SPECLI_VOICE_WORK", "/work/voice"))
CORPUS = WORK / "data"  # wavs/<id>.wav, train.tsv, heldout.tsv (scripts/make_voice_data.py)
VOICE_DIR = REPO / "specli" / "voices" / "specli-en"  # the voice in training (committed once a session)
BLANK = "CosyVoice-BlankEN"  # the text tokenizer + Qwen2 config directory inside a model directory


def log(msg: str) -> None:
    """Progress on stderr (scripts only; library code never prints)."""
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Clip:
    """One corpus sentence."""

    id: str  # first 12 hex digits of the sentence's sha1
    text: str  # the sentence as piper spoke it
    seconds: float  # audio length


def clips(split: str, corpus: Path = CORPUS) -> list[Clip]:
    """The ``train`` or ``heldout`` sentences of the corpus, in file order."""
    path = corpus / f"{split}.tsv"
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            cid, text, seconds = line.split("\t")[:3]
            out.append(Clip(cid, text, float(seconds)))
    return out


def wav_path(clip_id: str, corpus: Path = CORPUS) -> Path:
    return corpus / "wavs" / f"{clip_id}.wav"


def lr_at(step: int, peak: float, warmup: int, total: int) -> float:
    """Linear warm-up to ``peak``, then cosine decay to a tenth of it at ``total`` steps."""
    if step < warmup:
        return peak * (step + 1) / warmup
    done = min(1.0, (step - warmup) / max(total - warmup, 1))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))


def save(path: Path, payload: dict) -> None:
    """``torch.save`` written atomically (a crash never leaves half a checkpoint)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic_with(path, lambda fh: torch.save(payload, fh))
