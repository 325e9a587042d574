"""Held-out EAGLE-ASR benchmark (issue 16): five sets, two dtypes, AR vs the EAGLE preset vs faster-whisper.

Sets (all built on this machine from Debian packages and ``scripts/make_distill_audio.py``'s held-out
folders, never trained on):

* ``in``        in domain: held-out clips of the training sources (asterisk-en, espeak, festival)
* ``out``       out of domain: ``pocketsphinx-testdata`` (real read speech, references) + piper (a neural voice)
* ``long``      long-form: the 30 real English clips of ``docs/benchmarks/dtype-bf16/manifest.tsv`` joined into
                one file (0.6 s of silence between clips, > 2 min; the reference is the joined texts)
* ``lang``      non-English: held-out real Asterisk prompts in es / fr / it / ru (language detected per file)
* ``translate`` the same clips, ``--task translate``

Per set and dtype one ``specli bench`` run, side by side in one process: the AR preset, the EAGLE preset and
faster-whisper (float32 next to float32, its int8 mode next to bfloat16), greedy, 2 threads::

    python scripts/make_distill_audio.py --out /work/distill/audio --espeak 1200 --extra 1800 --multi 400 \
        --heldout-only   # once: the held-out folders alone (the texts follow the training counts)
    python benchmarks/heldout_bench.py --audio /work/distill/audio --out docs/benchmarks/eagle-asr-heldout
    python benchmarks/heldout_bench.py ... --model tiny.en --sets in,out,long --dtypes float32

Each run writes ``OUT/<model>-<set>-<dtype>/`` (report.md, report.json, runs.jsonl); ``OUT/summary.md``
collects the headline figures. A run whose report exists is skipped (rerun to resume).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

from specli.io.audio import load_audio

REPO = Path(__file__).resolve().parent.parent
MANIFEST = REPO / "docs" / "benchmarks" / "dtype-bf16" / "manifest.tsv"
POCKETSPHINX = Path("/usr/share/pocketsphinx/test/data")
PRESETS = {"base": ("whisper-base-ar", "whisper-eagle-asr"),
           "tiny.en": ("whisper-tiny.en-ar", "whisper-tiny.en-eagle-asr")}
PEER = {"float32": "faster-whisper:float32", "bfloat16": "faster-whisper:int8"}
SR = 16000


def pick(folder: Path, n: int, max_seconds: float = 30.0) -> list[Path]:
    """The first ``n`` clips of ``folder`` (sorted) of at most ``max_seconds``."""
    clips = [p for p in sorted(folder.glob("*.wav")) if sf.info(str(p)).duration <= max_seconds]
    if len(clips) < n:
        raise SystemExit(f"{folder}: {len(clips)} clips of <= {max_seconds} s, need {n} (run make_distill_audio.py)")
    return clips[:n]


def references() -> dict[str, str]:
    rows = [line.split("\t", 1) for line in MANIFEST.read_text().splitlines() if line.strip()]
    return {path: text.strip() for path, text in rows if not path.startswith("path")}


def long_form(out: Path) -> tuple[Path, str]:
    """One file of the 30 manifest clips with 0.6 s of silence between them, and its joined reference."""
    refs = references()
    wav = out / "long-form-real-en.wav"
    if not wav.exists():
        gap = np.zeros(int(0.6 * SR), dtype=np.float32)
        parts = []
        for path in refs:
            parts += [load_audio(path).astype(np.float32), gap]  # 16 kHz mono (Asterisk prompts are 8 kHz)
        sf.write(str(wav), np.concatenate(parts), SR)
    return wav, " ".join(refs.values())


def build_sets(audio: Path, out: Path) -> dict[str, list[Path]]:
    """The five sets' file lists, and ``out/references.tsv`` (every file with a known text)."""
    out.mkdir(parents=True, exist_ok=True)
    wav, long_text = long_form(out)
    lang = [c for code in ("es", "fr", "it", "ru") for c in pick(audio / "heldout-lang" / f"asterisk-{code}", 2)]
    sets = {
        "in": [*pick(audio / "heldout-in" / "asterisk-en", 3), *pick(audio / "heldout-in" / "espeak", 3),
               *pick(audio / "heldout-in" / "festival", 2)],
        "out": [*sorted(POCKETSPHINX.glob("*/*.wav")), *pick(audio / "heldout-out" / "piper", 4)],
        "long": [wav], "lang": lang, "translate": lang,
    }
    refs = {**references(), str(wav): long_text}
    (out / "references.tsv").write_text("path\ttext\n" + "".join(f"{p}\t{t}\n" for p, t in refs.items()))
    return sets


def run(model: str, name: str, files: list[Path], dtype: str, out: Path, threads: int, repeat: int) -> Path:
    dest = out / f"{model}-{name}-{dtype}"
    if (dest / "report.json").exists():
        return dest
    ar, eagle = PRESETS[model]
    run_bench(name, files, dest, out / "references.tsv",
              ["--presets", f"{ar},{eagle}", "--peers", PEER[dtype], "--dtype", dtype, "--threads", str(threads),
               "--repeat", str(repeat)])
    return dest


def run_bench(name: str, files: list[Path], dest: Path, references: Path, options: list[str]) -> None:
    """One ``specli bench`` run of a held-out set (English sets pinned to en, ``translate`` translating)."""
    cmd = [sys.executable, "-m", "specli.cli", "bench", *map(str, files), *options, "--references", str(references),
           "--no-plots", "--out", str(dest), "-q"]
    if name in ("in", "out", "long", "short"):
        cmd += ["--language", "en"]
    if name == "translate":
        cmd += ["--task", "translate"]
    print(" ".join(cmd[1:]), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)


def summary_row(model: str, name: str, dtype: str, dest: Path) -> str:
    rep = json.loads((dest / "report.json").read_text())
    s = {x["system"]: x for x in rep["summaries"]}
    ar, eagle = (s[p] for p in PRESETS[model])
    peer = s[PEER[dtype]]
    def wer(x: dict) -> str:
        e = x.get("errors") or {}
        return "-" if not e.get("utterances") else f"{100 * e['wer']:.1f}%"
    fw = peer["wall_seconds"] / eagle["wall_seconds"]
    ll = eagle["lossless"]
    dec = eagle.get("speedup_decode")
    share = (eagle.get("draft_seconds") or 0) / max(eagle.get("decode_seconds") or 0, 1e-9)
    return (f"| {model} | {name} | {dtype} | {ar['audio_seconds']:.0f} | {eagle.get('acceptance_micro') or 0:.2f} | "
            f"{'-' if dec is None else f'{dec:.2f}x'} | {share:.0%} | {eagle['speedup_e2e']:.2f}x | {fw:.2f}x ({PEER[dtype]}) | "
            f"{ll['identical']}/{ll['compared']} | {wer(ar)} / {wer(eagle)} / {wer(peer)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--audio", type=Path, required=True, help="make_distill_audio.py's output folder")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "eagle-asr-heldout")
    ap.add_argument("--model", choices=sorted(PRESETS), default="base")
    ap.add_argument("--sets", default="in,out,long,lang,translate")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="measured passes after one warm-up pass")
    args = ap.parse_args()
    sets = build_sets(args.audio, args.out)
    rows = []
    for dtype in args.dtypes.split(","):
        for name in args.sets.split(","):
            dest = run(args.model, name, sets[name], dtype, args.out, args.threads, args.repeat)
            rows.append(summary_row(args.model, name, dtype, dest))
    head = ("| model | set | dtype | audio s | EAGLE tau | EAGLE decode vs AR | draft share of decode | EAGLE e2e vs AR | EAGLE vs peer "
            "| identical to AR | WER AR / EAGLE / peer |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    text = head + "\n".join(rows) + "\n"
    summary = args.out / f"summary-{args.model}.md"
    summary.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
