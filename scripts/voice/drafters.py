"""The speculative drafters of specli-en (DSpark, DFlash, EAGLE-3), distilled on-policy from the voice's own LM:
labels are the LM's speech tokens for the corpus's training sentences at the deployment sampler (greedy, specli-en's
default, or ras), validated on held-out sentences 100-199 (the round-trip and speed benchmarks use 0-99). Both steps
are ``specli distill`` runs, which resume; work files under ``<work>/drafters``.

    python -m scripts.voice drafters --work DIR --step labels     # 2,000 sentences: 6 min (Zen 5) to 40 min, 2 threads
    python -m scripts.voice drafters --work DIR --step train --drafters dspark --layers 1 --epochs 8   # ~35 min
    python -m scripts.voice drafters --work DIR --step train --drafters dflash --layers 1 --epochs 16  # 12 min (Zen 5)
    python -m scripts.voice drafters --work DIR --step train --drafters eagle3 --block 4 --epochs 6

Each drafter's head covers the ``--draft-vocab`` codes the LM spoke most in the labels (default 2,048 of 19,683).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from .common import log
from .corpus.texts import sentences, write_jsonl

DRAFTERS = ("dspark", "dflash", "eagle3")
# the head's rows: specli-en's greedy LM speaks 4,220 of its 19,683 codes in the labels and the 2,048 most frequent
# cover 93.8% of held-out labels (1,536: 89.1%); a 3,072-row head (98.1%) accepted and sped up no more (fortieth
# session); on the 3^8 voice a head over all 6,761 rows made DFlash slower than AR on a Zen 5 (0.89x)
DRAFT_VOCAB = 2048


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--step", choices=("labels", "train", "all"), default="all")
    ap.add_argument("--sentences", type=int, default=2000, help="training sentences labelled")
    ap.add_argument("--sampler", choices=("greedy", "ras"), default="greedy", help="the deployment sampler")
    ap.add_argument("--drafters", default=",".join(DRAFTERS), help="comma-separated, trained one after another")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--layers", type=int, default=0, help="draft layers (0: the recipe's)")
    ap.add_argument("--block", type=int, default=0,
                    help="block size / EAGLE-3 unroll (0: the recipe's: DSpark 8, DFlash 4, EAGLE-3 7)")
    ap.add_argument("--draft-vocab", type=int, default=DRAFT_VOCAB,
                    help="rows of the drafter's head: the codes the LM spoke most in the labels (0: every code)")


def _specli(threads: int, *args: str) -> None:
    """``python -m specli ARGS`` on ``threads`` threads (the CLI is the tool here); a failure stops the stage."""
    cmd = [sys.executable, "-m", "specli", *args]
    log(" ".join(cmd))
    subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))


def labels(work: Path, voice: Path, args: argparse.Namespace) -> None:
    rows = {"train": sentences("train")[: args.sentences], "val": sentences("heldout")[100:200]}
    for split, picked in rows.items():
        write_jsonl([{"id": sid, "text": text} for sid, text in picked], work / f"{split}.jsonl")
    sampler = args.sampler
    for split in rows:
        _specli(args.threads, "distill", "data", "--preset", "cosyvoice3-ar", "--model", str(voice),
                "--sampler", sampler, "-q", "--out", str(work / f"data-{sampler}" / split), str(work / f"{split}.jsonl"))


def train(work: Path, voice: Path, args: argparse.Namespace) -> None:
    data = work / f"data-{args.sampler}"
    for drafter in args.drafters.split(","):
        _specli(args.threads, "distill", "train", "--preset", "cosyvoice3-ar", "--model", str(voice),
                "--drafter", drafter, "--layers", str(args.layers), "--block", str(args.block),
                "--draft-vocab", str(args.draft_vocab), "--epochs", str(args.epochs),
                "--val", str(data / "val"), "--out", str(work / drafter), str(data / "train"))


def run(work: Path, voice: Path, args: argparse.Namespace) -> None:
    if args.step in ("labels", "all"):
        labels(work, voice, args)
    if args.step in ("train", "all"):
        train(work, voice, args)
