"""The Whisper decode workloads of the decode profile and the waste A/B (issue 45): the bundled English clips
one by one (short clips, batch 1) and a ~2-minute file built from them (long-form, timestamps, previous-text
prompts), transcribed through the library path (``specli.asr.pipeline.transcribe``) with ``whisper-base-ar``.

    OMP_NUM_THREADS=1 py-spy record -r 250 -f raw -o prof.txt -- python benchmarks/whisper_decode_workload.py \\
        --dtype float32 --repeat 2
    python benchmarks/whisper_decode_workload.py --ab OTHER_WORKTREE   # before/after, interleaved, one process
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from specli.asr.pipeline import transcribe
from specli.asr.strategies import load_engine
from specli.io.audio import SAMPLE_RATE, load_audio
from specli.presets import load_preset

SAMPLES = Path(__file__).resolve().parent.parent / "samples/en"


def long_file_and_text(out: Path, cycles: int, gaps: tuple[float, float] = (1.0, 4.0), seed: int = 1
                       ) -> tuple[Path, str]:
    """``out/long.wav``: the English clips ``cycles`` times, each cycle shuffled, each clip followed by a silence drawn
    from ``gaps`` (s); and its reference, the clips' ``.txt`` transcripts in the same order."""
    rng, parts, texts = np.random.default_rng(seed), [], []
    clips = sorted(SAMPLES.glob("*.wav"))
    for _ in range(cycles):
        for k in rng.permutation(len(clips)):
            parts += [load_audio(clips[k]), np.zeros(round(SAMPLE_RATE * rng.uniform(*gaps)), np.float32)]
            texts.append(clips[k].with_suffix(".txt").read_text(encoding="utf-8").strip())
    path = out / "long.wav"
    sf.write(path, np.concatenate(parts), SAMPLE_RATE, subtype="PCM_16")
    return path, " ".join(texts)


def long_file(out: Path, cycles: int = 4) -> Path:
    """~2 minutes: the English clips in shuffled order with 1-4 s gaps (as ``tests/test_longform.py`` builds)."""
    return long_file_and_text(out, cycles)[0]


def run(engine, files: list[Path]) -> tuple[float, list[str]]:
    t0 = time.perf_counter()
    texts = [o.result.text if o.result else o.error for f in files for o in transcribe([f], engine=engine)]
    return time.perf_counter() - t0, texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--set", choices=("short", "long", "both"), default="both")
    ap.add_argument("--cycles", type=int, default=4, help="passes over the clips in the long file (4: ~2 min)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    engine = load_engine(load_preset("whisper-base-ar"), dtype=args.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        sets = {"short": sorted(SAMPLES.glob("*.wav")), "long": [long_file(Path(tmp), args.cycles)]}
        names = ("short", "long") if args.set == "both" else (args.set,)
        run(engine, sets["short"][:1])  # warm-up
        for _ in range(args.repeat):
            for name in names:
                wall, texts = run(engine, sets[name])
                print(f"{name}: {wall:.2f} s, {sum(len(t) for t in texts)} chars", file=sys.stderr)


if __name__ == "__main__":
    main()
