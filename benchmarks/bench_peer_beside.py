"""What a ``specli bench`` peer beside a preset does to the preset's timing (issue 26), measured, not tested.

Each peer runs in its own worker process (specli/bench/peer_worker.py) so that CTranslate2's OpenMP pool never
shares the presets' process; with it in the same process the preset's decode phase moved 1.5x to 16x. This
alternates a bench of the preset alone and one with the peer beside it, ``--rounds`` times each, in this fresh
interpreter, and prints the medians of the preset's decode seconds (the sum over the clips of the median repeat)
and their ratio, which should be near 1 on a quiet machine. The structure (no CTranslate2 import here, workers
reaped) is what tests/test_bench_peer_process.py checks.

    python benchmarks/bench_peer_beside.py samples/en/*.wav --rounds 3 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # specli from this checkout

from specli.bench.runner import BenchOptions, run_bench  # noqa: E402


def preset_decode_seconds(clips: list[str], preset: str, peers: tuple[str, ...], threads: int, repeat: int) -> float:
    opts = BenchOptions((preset,), peers=peers, repeat=repeat, threads=threads, language="en", dtype="float32")
    report = run_bench(clips, opts)
    return {s["system"]: s for s in report["summaries"]}[preset]["decode_seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("clips", nargs="+")
    ap.add_argument("--preset", default="whisper-tiny.en-ar")
    ap.add_argument("--peer", default="faster-whisper:int8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    alone, beside = [], []
    for _ in range(args.rounds):
        alone.append(preset_decode_seconds(args.clips, args.preset, (), args.threads, args.repeat))
        beside.append(preset_decode_seconds(args.clips, args.preset, (args.peer,), args.threads, args.repeat))
    ratio = statistics.median(beside) / statistics.median(alone)
    print(json.dumps({"preset": args.preset, "peer": args.peer, "threads": args.threads, "alone": alone,
                      "beside": beside, "ratio": round(ratio, 3),
                      "ctranslate2_imported": any(m.split(".")[0] == "ctranslate2" for m in sys.modules)}))


if __name__ == "__main__":
    main()
