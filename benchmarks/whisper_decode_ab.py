"""Before/after of a decode change in ONE process (issue 45): ``specli`` at git revision ``--before`` (extracted to
a temporary directory and imported first) and the working tree's ``specli``, each with its own ``whisper-base-ar``
engine; the workloads of ``whisper_decode_workload.py`` (the bundled English clips one by one, the ~2-minute file)
run interleaved, the order flipped every repeat; prints each side's median wall and after/before, and checks
that both sides give the same texts::

    OMP_NUM_THREADS=1 python benchmarks/whisper_decode_ab.py --before 8806f7f --dtype float32 --repeat 3
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


def _side(root: Path, dtype: str):
    transcribe, load_engine, load_preset = _fresh_specli(root)
    engine = load_engine(load_preset("whisper-base-ar"), dtype=dtype)
    modules = _specli_modules()

    def run(files: list[Path]) -> tuple[float, list[str]]:
        _use(modules)
        t0 = time.perf_counter()
        texts = [o.result.text if o.result else o.error for f in files for o in transcribe([f], engine=engine)]
        return time.perf_counter() - t0, texts

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="git revision of the 'before' code")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sets", default="short,long", help="workloads to run: short, long or both")
    ap.add_argument("--cycles", type=int, default=2, help="passes over the clips in the long file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        blob = subprocess.run(["git", "-C", str(REPO), "archive", args.before, "specli"], check=True,
                              capture_output=True).stdout
        tarfile.open(fileobj=BytesIO(blob)).extractall(old, filter="data")
        sides = {"before": _side(old, args.dtype), "after": _side(REPO, args.dtype)}
        sets = {"short": sorted(SAMPLES.glob("*.wav")), "long": [long_file(Path(tmp), args.cycles)]}
        sets = {k: v for k, v in sets.items() if k in args.sets.split(",")}
        for run in sides.values():
            run(sorted(SAMPLES.glob("*.wav"))[:1])  # warm-up
        walls: dict[tuple[str, str], list[float]] = {}
        texts: dict[tuple[str, str], list[str]] = {}
        for r in range(args.repeat):
            for name, files in sets.items():
                for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                    wall, out = sides[side](files)
                    walls.setdefault((side, name), []).append(wall)
                    texts[(side, name)] = out
    print(f"dtype {args.dtype}, {torch.get_num_threads()} thread(s), {args.repeat} interleaved repeats, medians")
    print("| set | before s | after s | after/before | same texts |\n|---|---|---|---|---|")
    for name in sets:
        b, a = (statistics.median(walls[(s, name)]) for s in ("before", "after"))
        print(f"| {name} | {b:.2f} | {a:.2f} | {a / b:.3f} | {texts[('before', name)] == texts[('after', name)]} |")
    for (side, name), w in walls.items():
        print(f"{side} {name}: " + " ".join(f"{x:.2f}" for x in w))


if __name__ == "__main__":
    main()
