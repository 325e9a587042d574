"""Before/after of a decode change in ONE process (issue 45): ``specli`` at git revision ``--before`` (extracted to
a temporary directory and imported first) and the working tree's ``specli``, each with its own ``whisper-base-ar``
engine; the workloads of ``whisper_decode_workload.py`` (the bundled English clips one by one, the ~2-minute file)
run interleaved, the order flipped every repeat; prints each side's median wall and after/before, and checks
that both sides give the same outputs: every segment's tokens, times, ``avg_logprob``, ``no_speech_prob``,
``compression_ratio`` and temperature, compared as exact floats (``--sets clips``: every bundled clip, en, es and
fr; ``--batch``: files transcribed together through the batched scheduler; ``--preset``: another preset)::

    OMP_NUM_THREADS=1 python benchmarks/whisper_decode_ab.py --before 8806f7f --dtype float32 --repeat 3
    OMP_NUM_THREADS=1 python benchmarks/whisper_decode_ab.py --before cee3496 --sets clips --batch 3 --repeat 1
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from whisper_decode_workload import SAMPLES, long_file  # noqa: E402  (imports the working tree's specli)


def _specli_modules() -> dict:
    return {m: mod for m, mod in sys.modules.items() if m == "specli" or m.startswith("specli.")}


def _use(modules: dict) -> None:
    """Make ``modules`` the loaded ``specli`` (a lazy import inside a side resolves to its own code)."""
    for name in _specli_modules():
        del sys.modules[name]
    sys.modules.update(modules)


def _fresh_specli(root: Path):
    """Import ``specli`` from ``root`` (dropping any loaded one); returns (transcribe, engine loader, presets)."""
    _use({})
    sys.path.insert(0, str(root))
    try:
        pipeline = importlib.import_module("specli.asr.pipeline")
        strategies = importlib.import_module("specli.asr.strategies")
        presets = importlib.import_module("specli.presets")
    finally:
        sys.path.remove(str(root))
    return pipeline.transcribe, strategies.load_engine, presets.load_preset


def _record(outcome) -> object:
    """What a file's outputs are made of: its error, or each segment's tokens, times and floats (exact)."""
    if outcome.result is None:
        return outcome.error
    return [(s.tokens, s.start, s.end, s.avg_logprob, s.no_speech_prob, s.compression_ratio, s.temperature)
            for s in outcome.result.segments]


def _tokens(records: list[object]) -> list[object]:
    """Each file's error or segment tokens (what a transcript says, without its times and floats)."""
    return [r if isinstance(r, str) else [seg[0] for seg in r] for r in records]


def _side(root: Path, dtype: str, preset: str, batch: int):
    transcribe, load_engine, load_preset = _fresh_specli(root)
    engine = load_engine(load_preset(preset), dtype=dtype)
    modules = _specli_modules()

    def run(files: list[Path]) -> tuple[float, list[object]]:
        _use(modules)
        t0 = time.perf_counter()
        if batch > 1:
            records = [_record(o) for o in transcribe(files, engine=engine, batch_size=batch)]
        else:
            records = [_record(o) for f in files for o in transcribe([f], engine=engine)]
        return time.perf_counter() - t0, records

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="git revision of the 'before' code")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sets", default="short,long", help="workloads to run: short, long, clips (en, es, fr)")
    ap.add_argument("--cycles", type=int, default=2, help="passes over the clips in the long file")
    ap.add_argument("--preset", default="whisper-base-ar")
    ap.add_argument("--batch", type=int, default=1, help="files transcribed together (1: one by one)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        blob = subprocess.run(["git", "-C", str(REPO), "archive", args.before, "specli"], check=True,
                              capture_output=True).stdout
        tarfile.open(fileobj=BytesIO(blob)).extractall(old, filter="data")
        sides = {"before": _side(old, args.dtype, args.preset, args.batch),
                 "after": _side(REPO, args.dtype, args.preset, args.batch)}
        sets = {"short": sorted(SAMPLES.glob("*.wav")), "long": [long_file(Path(tmp), args.cycles)],
                "clips": sorted(SAMPLES.parent.glob("*/*.wav"))}
        sets = {k: v for k, v in sets.items() if k in args.sets.split(",")}
        for run in sides.values():
            run(sorted(SAMPLES.glob("*.wav"))[:1])  # warm-up
        walls: dict[tuple[str, str], list[float]] = {}
        outputs: dict[tuple[str, str], list[list[object]]] = {}  # every repeat's records
        for r in range(args.repeat):
            for name, files in sets.items():
                for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                    wall, out = sides[side](files)
                    walls.setdefault((side, name), []).append(wall)
                    outputs.setdefault((side, name), []).append(out)
    print(f"{args.preset}, dtype {args.dtype}, batch {args.batch}, {torch.get_num_threads()} thread(s), "
          f"{args.repeat} interleaved repeats, medians")
    print("| set | before s | after s | after/before | same tokens | same outputs |\n|---|---|---|---|---|---|")
    for name in sets:
        b, a = (statistics.median(walls[(s, name)]) for s in ("before", "after"))
        runs = [x for side in ("before", "after") for x in outputs[(side, name)]]
        same = all(x == runs[0] for x in runs)
        tokens = all(_tokens(x) == _tokens(runs[0]) for x in runs)
        print(f"| {name} | {b:.2f} | {a:.2f} | {a / b:.3f} | {tokens} | {same} |")
    for name, files in sets.items():  # which files' tokens moved between the sides (first repeats)
        b, a = (_tokens(outputs[(s, name)][0]) for s in ("before", "after"))
        moved = [f"{f.parent.name}/{f.name}" for f, x, y in zip(files, b, a) if x != y]
        print(f"{name}: {len(moved)} of {len(files)} files' tokens differ before/after " + " ".join(moved))
    for (side, name), w in walls.items():
        print(f"{side} {name}: " + " ".join(f"{x:.2f}" for x in w))


if __name__ == "__main__":
    main()
