"""Sentences of specli-en's corpus as a text file (one a line) without building its audio: the training pool
(sha1 order, the sentences the voice was trained on first) or the held-out range, from the Debian fortunes
exactly as ``scripts/make_voice_data.py`` selects them. The drafters of the voice are distilled on the training
pool (``scripts/voice/distill_drafters.sh``) and benchmarked on held-out sentences.

    python scripts/voice/texts.py --split train --skip 0 --count 3000 --out /work/voice/drafters/train.txt
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import json
from pathlib import Path

from common import REPO, log  # scripts/voice/common.py

from specli.io.atomic import write_atomic_with


def _corpus_module():
    spec = importlib.util.spec_from_file_location("make_voice_data", REPO / "scripts" / "make_voice_data.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def sentences(split: str, heldout: int = 300) -> list[tuple[str, str]]:
    """``(sha1[:12], text)`` of ``split`` ("train": the training pool, "heldout": the held-out range)."""
    mvd = _corpus_module()
    sel = mvd.select(mvd.collect_sentences(mvd.FORTUNE_DIR), heldout)
    rows = sel.train_pool if split == "train" else sel.heldout
    return [(sha[:12], text) for sha, text in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", choices=["train", "heldout"], default="train")
    ap.add_argument("--skip", type=int, default=0, help="leave out the first N sentences of the split")
    ap.add_argument("--count", type=int, default=0, help="at most N sentences (0: all)")
    ap.add_argument("--jsonl", action="store_true", help='write {"id", "text"} lines (ids = sha1 prefixes)')
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rows = sentences(args.split)[args.skip:]
    rows = rows[: args.count] if args.count else rows
    if args.jsonl:
        lines = [json.dumps({"id": sid, "text": text}, ensure_ascii=False) for sid, text in rows]
    else:
        lines = [text for _, text in rows]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    data = ("\n".join(lines) + "\n").encode()
    write_atomic_with(args.out, lambda fh: fh.write(data))
    log(f"{len(rows)} {args.split} sentences -> {args.out}")


if __name__ == "__main__":
    main()
