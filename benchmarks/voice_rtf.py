"""Real-time factor of specli-en's synthesis, stage by stage, beside piper's own speed on the same sentences.

The first ``--sentences`` held-out sentences of the voice corpus (``<work>/data/heldout.tsv`` of ``python -m
scripts.voice corpus``), as a user runs them: one fresh ``specli synthesize`` process a preset (model loading not
counted; every new sentence length costs what it costs in a real run), then piper (``python -m piper``, as the
corpus stage runs it, model loads included) on the same sentences. Presets run in turn, ``--repeat`` times each.
Not a test:

    python benchmarks/voice_rtf.py --corpus WORK/data --sentences 100 --threads 2 --out OUT
    python benchmarks/voice_rtf.py --corpus WORK/data --presets specli-en-ar --models specli-en,OLD_VOICE_DIR \
        --repeat 2 --no-piper --out OUT     # two voices' AR, interleaved
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.voice.corpus import piper as piper_corpus  # noqa: E402
from scripts.voice.corpus import store as corpus_store  # noqa: E402
from specli.bench.runner import machine_info  # noqa: E402
from voice_roundtrip import heldout  # noqa: E402

STAGES = ("llm", "flow", "vocoder", "total")


def specli_run(lines: Path, preset: str, threads: int, out: Path, vocoder_dtype: str | None,
               model: str | None = None) -> dict:
    """One ``specli synthesize`` process (``model``: the preset's own when None): seconds of each stage over the
    audio's seconds."""
    cmd = [sys.executable, "-m", "specli", "synthesize", str(lines), "--preset", preset, "--threads", str(threads),
           "--seed", "0", "--jsonl", "-", "-o", str(out), "--overwrite"]
    cmd += ["--vocoder-dtype", vocoder_dtype] if vocoder_dtype else []
    cmd += ["--model", model] if model else []
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    audio = sum(r["duration_s"] for r in rows)
    return {"sentences": len(rows), "audio_seconds": round(audio, 2),
            "rtf": {k: round(sum(r["seconds"][k] for r in rows) / audio, 4) for k in STAGES}}


def piper_run(texts: list[str], work: Path) -> dict:
    """piper on the same sentences (one process a chunk of sentences, as the corpus stage runs it)."""
    engine = piper_corpus.find_piper(sys.executable, None)
    items = [(piper_corpus.sha1(t), t) for t in texts]
    start = time.perf_counter()
    frames = sum(corpus_store.wav_frames(wav) or 0 for _key, wav in piper_corpus.run_piper(engine, items, work))
    wall = time.perf_counter() - start
    audio = frames / corpus_store.SAMPLE_RATE
    return {"sentences": len(items), "audio_seconds": round(audio, 2), "rtf": {"total": round(wall / audio, 4)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="the voice corpus (<work>/data)")
    ap.add_argument("--sentences", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--presets", default="specli-en-ar,specli-en-dflash")
    ap.add_argument("--models", default="",
                    help="comma-separated voice directories (or names) each preset runs with, in turn within a pass "
                         "(default: the preset's own); a system is then named PRESET@MODEL")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--vocoder-dtype", default=None, help="passed to synthesize (default: its own, auto)")
    ap.add_argument("--no-piper", action="store_true", help="specli's presets only")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    texts = [text for _cid, text in heldout(args.corpus, args.sentences)]
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {"sentences": len(texts), "threads": args.threads, "vocoder_dtype": args.vocoder_dtype or "auto",
                    "machine": machine_info(args.threads), "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        lines = Path(tmp) / "lines.txt"
        lines.write_text("\n".join(texts) + "\n", encoding="utf-8")
        for rep in range(args.repeat):
            for m, model in enumerate(args.models.split(",") if args.models else [None]):
                for preset in args.presets.split(","):
                    system = f"{preset}@{model}" if model else preset
                    run = specli_run(lines, preset, args.threads, Path(tmp) / f"{preset}-{m}", args.vocoder_dtype,
                                     model)
                    report["runs"].append({"system": system, "pass": rep + 1, **run})
                    print(system, rep + 1, run["rtf"], file=sys.stderr, flush=True)
            if args.no_piper:
                continue
            pip = Path(tmp) / f"piper-{rep}"
            pip.mkdir()
            run = piper_run(texts, pip)
            report["runs"].append({"system": "piper", "pass": rep + 1, **run})
            print("piper", rep + 1, run["rtf"], file=sys.stderr, flush=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
