"""One ``specli bench`` command at two (or more) git revisions, run alternately on the same inputs, so that a
refactor's "behaviour unchanged, speed within noise" is a measurement: each revision is checked out to a temporary
detached worktree and run with ``PYTHONPATH`` pointing at it (the installed package is not used), the order of the
revisions flipped every round. Prints, per system of the bench report, each run's wall seconds and the median per
revision, each command's CPU seconds (model loading included; at one thread the steadier measure on a shared
machine), and whether every revision's transcripts / outputs agree with the first revision's (the
report's per-utterance texts for transcription presets)::

    python benchmarks/revisions_ab.py --rev d43a6a1 --rev 65a7c14 --rounds 3 -- \
        samples/en samples/es samples/fr --presets whisper-base-ar,whisper-eagle-asr --repeat 2 --threads 2 \
        --dtype float32
    python benchmarks/revisions_ab.py --rev cee3496 --rev HEAD --rounds 3 -- \
        lines.txt --presets specli-en-ar,specli-en-dflash --repeat 2 --threads 2

``--out`` keeps every run's bench directory and writes ``summary.json``. Paths among the bench arguments are
resolved against the current directory before the runs (they run inside the worktrees).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def absolute(args: list[str]) -> list[str]:
    """Bench arguments with existing relative paths made absolute (the runs' working directory is a worktree)."""
    return [str(Path(a).resolve()) if not a.startswith("-") and Path(a).exists() else a for a in args]


def slug(rev: str) -> str:
    """A revision as a directory name."""
    return rev.replace("/", "_")


def checkout(rev: str, root: Path) -> Path:
    tree = root / slug(rev)
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(tree), rev], check=True)
    found = subprocess.run([sys.executable, "-c", "import specli; print(specli.__file__)"], cwd=tree, check=True,
                           env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, text=True).stdout.strip()
    if not Path(found).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"{rev}: python imports specli from {found}, not from its worktree {tree}")
    return tree


def run_once(tree: Path, bench_args: list[str], out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "specli", "bench", *bench_args, "--out", str(out), "-q", "--no-plots"]
    t0, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{tree.name}: specli bench failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    report = json.loads((out / "report.json").read_text())
    return {"process_seconds": time.perf_counter() - t0,  # the whole command, model loading included
            "process_cpu_seconds": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
            "systems": {s["system"]: {"wall": s["wall_seconds"], "tokens": s.get("tokens"),
                                      "audio_seconds": s.get("audio_seconds")} for s in report["summaries"]},
            "outputs": outputs(report)}


def outputs(report: dict) -> dict[str, str]:
    """``system/file -> token ids (else text)`` of the report's utterances (what the revisions must agree on)."""
    found = {}
    for utt in report.get("utterances", []):
        value = utt.get("token_ids", utt.get("text"))
        if value is not None:
            found[f"{utt.get('system')}/{utt.get('file', utt.get('id'))}"] = json.dumps(value)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", action="append", required=True, help="a git revision (give two or more)")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the revisions")
    ap.add_argument("--out", type=Path, help="keep every run's bench directory here (default: a temporary one)")
    ap.add_argument("bench", nargs=argparse.REMAINDER, help="-- then the `specli bench` arguments")
    args = ap.parse_args()
    bench_args = absolute([a for a in args.bench if a != "--"])
    with tempfile.TemporaryDirectory(prefix="specli-ab-") as tmp:
        root = Path(tmp)
        out = args.out or root / "out"
        trees = {rev: checkout(rev, root / "trees") for rev in args.rev}
        try:
            runs: dict[str, list[dict]] = {rev: [] for rev in args.rev}
            for r in range(args.rounds):
                order = args.rev if r % 2 == 0 else list(reversed(args.rev))
                for rev in order:
                    res = run_once(trees[rev], bench_args, out / f"{slug(rev)}-{r}")
                    runs[rev].append(res)
                    walls = ", ".join(f"{k} {v['wall']:.2f} s" for k, v in res["systems"].items())
                    print(f"round {r} {rev}: {walls}", flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
        summary = summarise(runs, args.rev)
        print(json.dumps(summary, indent=1))
        if args.out:
            (args.out / "summary.json").write_text(json.dumps({"bench": bench_args, "runs": runs,
                                                               "summary": summary}, indent=1))


def summarise(runs: dict[str, list[dict]], revs: list[str]) -> dict:
    first = revs[0]
    systems = sorted(runs[first][0]["systems"])
    out: dict = {"median_wall": {}, "ratio_to_first": {}, "median_process_cpu": {}, "outputs_agree_with_first": {}}
    for rev in revs:
        med = {s: statistics.median(run["systems"][s]["wall"] for run in runs[rev]) for s in systems}
        out["median_wall"][rev] = med
        base = out["median_wall"][first]
        out["ratio_to_first"][rev] = {s: med[s] / base[s] for s in systems}
        out["median_process_cpu"][rev] = statistics.median(run["process_cpu_seconds"] for run in runs[rev])
        ref = runs[first][0]["outputs"]
        out["outputs_agree_with_first"][rev] = all(run["outputs"] == ref for run in runs[rev])
    return out


if __name__ == "__main__":
    main()
