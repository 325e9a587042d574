"""Whisper on the CPU (issue 26): the AR, EAGLE and goodput presets against faster-whisper's int8 modes.

Per held-out set (``heldout_bench.py``'s sets: ``in`` and ``out`` short clips, ``long`` > 2 min, ``lang``
non-English, ``translate``) one ``specli bench --batch-sizes`` run in throughput mode: every system transcribes
the whole set at each batch size (one warm-up pass, then ``--repeat`` measured passes, interleaved), the presets
in one process and each faster-whisper peer in its own worker process::

    python scripts/make_distill_audio.py --out /work/distill/audio --espeak 1200 --extra 1800 --multi 400 \\
        --heldout-only
    python benchmarks/cpu_bench.py --audio /work/distill/audio --out docs/benchmarks/whisper-cpu

Writes ``OUT/<model>-<set>/`` (the bench report) and ``OUT/summary-<model>.md``: audio seconds per wall second
of each system at each batch size, the default preset against the best faster-whisper mode, and every
speculative preset against AR at the same batch size. A set whose report exists is skipped (rerun to resume).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from heldout_bench import build_sets, run_bench  # noqa: E402  (the same held-out sets and references)

REPO = Path(__file__).resolve().parent.parent
PRESETS = {"base": ("whisper-base-ar", "whisper-eagle-asr", "whisper-eagle-asr-goodput"),
           "tiny.en": ("whisper-tiny.en-ar", "whisper-tiny.en-eagle-asr")}
PEERS = ("faster-whisper:int8", "faster-whisper-batched:int8")


def run(model: str, name: str, files: list[Path], out: Path, args: argparse.Namespace) -> Path:
    dest = out / f"{model}-{name}"
    if (dest / "report.json").exists():
        return dest
    run_bench(name, files, dest, out / "references.tsv",
              ["--presets", ",".join(PRESETS[model]), "--peers", ",".join(PEERS), "--batch-sizes", args.batch_sizes,
               "--dtype", args.dtype, "--threads", str(args.threads), "--repeat", str(args.repeat)])
    return dest


def summary(model: str, name: str, dest: Path) -> list[str]:
    """Rows of one set: each system's audio s / wall s per batch size, and the ratios the issue asks for."""
    rows = json.loads((dest / "report.json").read_text())["throughput"]
    by = {(r["system"], r["batch_size"]): r for r in rows}
    sizes = sorted({r["batch_size"] for r in rows})
    systems = list(dict.fromkeys(r["system"] for r in rows))

    def cell(system: str, b: int) -> str:
        r = by.get((system, b))
        return "-" if r is None else f"{r['throughput']:.2f}"

    def wer(system: str) -> str:
        r = next((x for x in rows if x["system"] == system and x.get("wer") is not None), None)
        return "-" if r is None else f"{100 * r['wer']:.1f}%"

    ar, default = PRESETS[model][0], PRESETS[model][1]
    peer_best = max((r["throughput"] for r in rows if r["system"].startswith("faster-whisper")), default=None)
    lines = [f"| {name} | {s} | " + " | ".join(cell(s, b) for b in sizes) + f" | {wer(s)} |" for s in systems]
    best_default = max(by[(default, b)]["throughput"] for b in sizes if (default, b) in by)
    if peer_best:
        cells = [f"{best_default / peer_best:.2f}x"] + [""] * len(sizes)
        lines.append(f"| {name} | **{default} (best batch) / best faster-whisper** | " + " | ".join(cells) + " |")
    for spec in PRESETS[model][1:]:
        ratios = [f"{by[(spec, b)]['throughput'] / by[(ar, b)]['throughput']:.2f}x"
                  if (spec, b) in by and (ar, b) in by else "-" for b in sizes]
        lines.append(f"| {name} | {spec} / {ar} | " + " | ".join(ratios) + " | |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--audio", type=Path, required=True, help="make_distill_audio.py's output folder")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "whisper-cpu")
    ap.add_argument("--model", choices=sorted(PRESETS), default="base")
    ap.add_argument("--sets", default="short,long,lang,translate")
    ap.add_argument("--batch-sizes", default="1,4,8")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="measured passes after one warm-up pass")
    args = ap.parse_args()
    sets = build_sets(args.audio, args.out)
    sets["short"] = sets["in"] + sets["out"]
    sizes = args.batch_sizes.split(",")
    lines = ["| set | system | " + " | ".join(f"batch {b}" for b in sizes) + " | WER |",
             "|---|---|" + "---|" * len(sizes) + "---|"]
    for name in args.sets.split(","):
        lines += summary(args.model, name, run(args.model, name, sets[name], args.out, args))
    text = "\n".join(lines) + "\n"
    (args.out / f"summary-{args.model}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
