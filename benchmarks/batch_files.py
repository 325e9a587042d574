"""Files per second of ``transcribe`` at several ``--batch-size`` values (continuous batching over files).

    python benchmarks/batch_files.py --model whisper-base --batch-sizes 1,4,8 --copies 2 --threads 2

Transcribes every clip of ``samples/`` (``--copies`` times each, so a batch has files to refill it)
at each batch size, after one warm-up file, and prints files/s, audio seconds per second and how
many files' texts differ from batch 1 (near-tie flips of batched products; expected 0).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from specli.io.audio import audio_duration
from specli.asr.pipeline import transcribe_files
from specli.asr.strategies import load_engine
from specli.asr.windows import TranscribeOptions
from specli.presets import load_preset

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="whisper-base")
    ap.add_argument("--preset", default="whisper-base-ar", help="preset (its decoding); --model overrides its model")
    ap.add_argument("--dtype", default=None, help="float32, bfloat16 ... (default: the preset's)")
    ap.add_argument("--batch-sizes", default="1,4,8")
    ap.add_argument("--copies", type=int, default=2, help="each clip this many times")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    engine = load_engine(load_preset(args.preset), args.model, args.dtype)
    clips = sorted(SAMPLES.glob("*/*.wav")) * args.copies
    audio = sum(audio_duration(c) for c in clips)
    opts = TranscribeOptions()
    list(transcribe_files(engine.model, enumerate(clips[:1]), opts, engine.decode))  # warm-up
    reference: dict | None = None
    print(f"{engine.preset.model} {engine.preset.dtype} {len(clips)} files, {audio:.1f} s audio, "
          f"{args.threads} threads")
    for size in (int(s) for s in args.batch_sizes.split(",")):
        t0 = time.perf_counter()
        texts = {k: r.text for k, r in transcribe_files(engine.model, enumerate(clips), opts, engine.decode, size)}
        wall = time.perf_counter() - t0
        reference = reference or texts
        flips = sum(texts[k] != reference[k] for k in texts)
        print(f"batch {size:3d}: {wall:7.1f} s  {len(clips) / wall:6.2f} files/s  {audio / wall:6.2f} audio s/s  "
              f"texts differing from the first size: {flips}")


if __name__ == "__main__":
    main()
