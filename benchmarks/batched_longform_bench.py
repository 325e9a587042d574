"""Batched long-form (issue 45): ``whisper-base-batched-longform`` against sequential long-form (AR and the default
EAGLE preset) and faster-whisper's sequential and ``BatchedInferencePipeline`` modes, on one long file::

    python benchmarks/batched_longform_bench.py --out docs/benchmarks/batched-longform
    python benchmarks/batched_longform_bench.py --audio LONG.wav --reference LONG.txt --out OUT

Without ``--audio`` a long file is built from ``samples/en``: every clip ``--cycles`` times, shuffled, with 2.5-4.5 s
of silence between (reference: the clips' ``.txt`` transcripts in the same order). One ``specli bench`` run in
per-file mode (presets in its process, each faster-whisper peer in its own worker process, interleaved, English,
``--threads`` 2 by default) writes ``OUT/report.*``; this script adds ``OUT/summary.md``: wall seconds and WER of each
system, the batched preset against faster-whisper batched, and against sequential long-form. The batched preset's
text differs from sequential by design (README, "Batched long-form"): its WER sits beside sequential's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from whisper_decode_workload import long_file_and_text  # noqa: E402

BATCHED = "whisper-base-batched-longform"
SEQUENTIAL = ("whisper-base-ar", "whisper-eagle-asr")
PEERS = ("faster-whisper:int8", "faster-whisper-batched:int8")
FW_BATCHED = "faster-whisper-batched:int8"


def summary(report: dict) -> list[str]:
    """Markdown rows: each system's wall and WER, then the ratios the issue asks for."""
    s = {x["system"]: x for x in report["summaries"]}

    def wer(name: str) -> str:
        e = s[name].get("errors") or {}
        return "-" if not e.get("utterances") else f"{100 * e['wer']:.1f}%"

    audio = s[BATCHED]["audio_seconds"]
    lines = [f"One file, {audio:.1f} s; median wall over the measured passes.", "",
             "| system | wall s | audio s / wall s | WER |", "|---|---|---|---|"]
    lines += [f"| {n} | {x['wall_seconds']:.2f} | {audio / x['wall_seconds']:.2f} | {wer(n)} |" for n, x in s.items()]
    mine = s[BATCHED]["wall_seconds"]
    lines += ["", *(f"- {BATCHED} vs {n}: {s[n]['wall_seconds'] / mine:.2f}x" for n in (FW_BATCHED, *SEQUENTIAL)
                    if n in s)]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--audio", type=Path, help="one long file (default: built from samples/en)")
    ap.add_argument("--reference", type=Path, help="its reference transcript (a text file), with --audio")
    ap.add_argument("--cycles", type=int, default=3, help="built file: every sample clip this many times")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "batched-longform")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="auto", help="auto: bfloat16 on CPUs with native bf16, else float32")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-warmup", action="store_true", help="no unrecorded pass first (a quick check)")
    ap.add_argument("--no-peers", action="store_true", help="presets only (faster-whisper not installed)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.audio is not None:
        path, text = args.audio, args.reference.read_text(encoding="utf-8").strip() if args.reference else None
    else:
        path, text = long_file_and_text(args.out, args.cycles, gaps=(2.5, 4.5), seed=3)
    cmd = [sys.executable, "-m", "specli.cli", "bench", str(path), "--presets", ",".join((*SEQUENTIAL, BATCHED)),
           "--threads", str(args.threads), "--dtype", args.dtype, "--repeat", str(args.repeat), "--language", "en",
           "--no-plots", "--out", str(args.out), "-q"]
    if not args.no_peers:
        cmd += ["--peers", ",".join(PEERS)]
    if args.no_warmup:
        cmd.append("--no-warmup")
    if text is not None:
        refs = args.out / "references.tsv"
        refs.write_text(f"{path}\t{text}\n", encoding="utf-8")
        cmd += ["--references", str(refs)]
    print(" ".join(cmd[1:]), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)
    lines = ["# Batched long-form vs sequential and faster-whisper batched", "", *summary(
        json.loads((args.out / "report.json").read_text()))]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
