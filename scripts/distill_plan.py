#!/usr/bin/env python3
"""The label jobs of ``scripts/distill_pipeline.sh``: which clips each ``specli distill data`` call labels.

Reads the audio tree of ``scripts/make_distill_audio.py`` and prints one job a line, tab-separated::

    <output dir, relative to the model's label root>  <task>  <ts|nots>  <language>  <chunk id>  <clip> <clip> ...

The first ``--val-first`` rounds of held-out (validation) jobs first (3 clips of every set a round), then the
training clips in chunks of ``--chunk`` taken round-robin over the sources, so that a run stopped anywhere
has labelled every source about equally, then the remaining validation rounds. Each training clip's
decode mode is fixed by a hash of its path (deterministic, independent of the order): ``--timestamps``
percent with timestamp tokens, and for non-English clips of a multilingual target ``--translate`` percent
labelled by the translate task (X -> English), the rest transcribed; the proportions follow real use.
English-only targets (``--english-only``) get the English sources only, transcribed.

    python scripts/distill_plan.py /work/distill/audio --chunk 40 > jobs.tsv
"""

from __future__ import annotations

import argparse
import zlib
from pathlib import Path

# language of each source folder of make_distill_audio.py (the rest are English)
LANGUAGE = {"es": "es", "fr": "fr", "it": "it", "ru": "ru", "de": "de"}
VAL_SPLITS = ("heldout-in", "heldout-out")  # English validation sets, labelled as one directory each


def language(source: str) -> str:
    """``espeak-ru`` -> ``ru``, ``asterisk-en`` / ``festival`` -> ``en``."""
    return LANGUAGE.get(source.rsplit("-", 1)[-1], "en") if "-" in source else "en"


def mode(path: Path, lang: str, timestamps: int, translate: int, multilingual: bool) -> tuple[str, str]:
    """(task, ts|nots) of one training clip, fixed by a hash of its path."""
    h = zlib.crc32(f"{path.parent.name}/{path.name}".encode())
    ts = "ts" if h % 100 < timestamps else "nots"
    task = "translate" if multilingual and lang != "en" and (h // 100) % 100 < translate else "transcribe"
    return task, ts


def val_jobs(audio: Path, multilingual: bool, chunk: int = 3) -> list[tuple]:
    """Validation jobs in chunks of ``chunk`` clips, round-robin: every set's first clips come first."""
    sets = []
    for split in VAL_SPLITS:
        clips = sorted((audio / split).rglob("*.wav"))
        if clips:
            sets.append((f"val/{split}", "transcribe", "ts", "en", clips))
    for src in sorted(p for p in (audio / "heldout-lang").glob("*") if p.is_dir()):
        lang = language(src.name)
        if lang != "en" and not multilingual:
            continue
        clips = sorted(src.glob("*.wav"))
        for task in ("transcribe", "translate") if multilingual and lang != "en" else ("transcribe",):
            sets.append((f"val/{src.name}.{task}", task, "ts", lang, clips))
    rounds = max((len(s[-1]) for s in sets), default=0)
    return [(*s[:-1], f"v{n:03d}", s[-1][i : i + chunk]) for n, i in enumerate(range(0, rounds, chunk))
            for s in sets if i < len(s[-1])]


def train_jobs(audio: Path, chunk: int, timestamps: int, translate: int, multilingual: bool) -> list[tuple]:
    buckets: dict[tuple, list[Path]] = {}
    for split in ("train", "train-extra"):
        for src in sorted(p for p in (audio / split).glob("*") if p.is_dir()):
            lang = language(src.name)
            if lang != "en" and not multilingual:
                continue
            for clip in sorted(src.glob("*.wav")):
                task, ts = mode(clip, lang, timestamps, translate, multilingual)
                buckets.setdefault((f"{split}/{src.name}", task, ts, lang), []).append(clip)
    ranked, seen = [], {}
    for (name, task, ts, lang), clips in buckets.items():
        k = seen[name] = seen.get(name, -1) + 1  # the source's k-th decode mode
        for n, i in enumerate(range(0, len(clips), chunk)):
            # round n of the round-robin: every source's first mode, then their second ones...
            ranked.append(((n, k, list(seen).index(name)), (f"{name}.{task}.{ts}", task, ts, lang, f"{n:03d}",
                                                             clips[i : i + chunk])))
    return [job for _, job in sorted(ranked, key=lambda r: r[0])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("audio", type=Path, help="the --out folder of make_distill_audio.py")
    ap.add_argument("--chunk", type=int, default=40, help="training clips per job")
    ap.add_argument("--timestamps", type=int, default=70, help="percent of training clips decoded with timestamps")
    ap.add_argument("--translate", type=int, default=20,
                    help="percent of non-English training clips labelled by the translate task")
    ap.add_argument("--english-only", action="store_true", help="an English-only target (*.en)")
    ap.add_argument("--val-first", type=int, default=2, help="validation rounds before the training jobs")
    args = ap.parse_args()
    if not (args.audio / "train").is_dir():
        raise SystemExit(f"{args.audio}: no train/ folder (run scripts/make_distill_audio.py first)")
    multi = not args.english_only
    val = val_jobs(args.audio, multi)
    first = [job for job in val if int(job[4][1:]) < args.val_first]  # chunk ids v000, v001, ...
    later = [job for job in val if int(job[4][1:]) >= args.val_first]
    for out, task, ts, lang, cid, clips in first + train_jobs(
            args.audio, args.chunk, args.timestamps, args.translate, multi) + later:
        print("\t".join([out, task, ts, lang, cid, " ".join(str(c) for c in clips)]))


if __name__ == "__main__":
    main()
