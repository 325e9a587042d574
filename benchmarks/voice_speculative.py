"""Speculative synthesis on specli-en: the drafters distilled from the voice's own LM (python -m scripts.voice drafters)
against plain decoding, on held-out sentences the drafters never saw, 2 threads, one process, interleaved.

1. Batch 1 (``specli bench``'s synthesis runner, one warm-up pass + ``--repeat`` measured passes, every sentence
   through every preset in turn): LLM tokens/s, acceptance length (tau) and acceptance per draft position, the
   LLM-stage speedup over AR and exactness (greedy presets: tokens identical to greedy AR). Samplers
   (``--samplers``): greedy (specli-en's default, the first: the AR baseline) and RAS.
2. Batch 8 (``Synthesizer.synthesize_batch``, continuous batching): LLM tokens/s and speedup over AR at batch 8
   (and at batch 1 through the same batched code path), interleaved by pass, under the first sampler.
3. Text to audio: AR and each drafter of the first sampler again with the flow and the vocoder (``specli bench
   --audio``): real-time factor of each stage and the end-to-end speedup over AR.

    python benchmarks/voice_speculative.py --drafters /work/voice/drafters --sentences 50 --threads 2 \
        --samplers greedy,ras --out docs/benchmarks/voice-speculative
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # scripts.voice, the voice's build

from scripts.voice.corpus.texts import sentences  # noqa: E402  (the corpus's held-out sentences)

from specli.bench.synthesis import SynthesisBenchOptions, run_synthesis_bench  # noqa: E402
from specli.models.cosyvoice.lm import load_cosyvoice  # noqa: E402
from specli.presets.synthesis import load_synthesis_preset  # noqa: E402
from specli.tts.pipeline import read_items  # noqa: E402
from specli.tts.synthesis import PresetOverrides, build_synthesizer  # noqa: E402

DRAFTERS = {"dspark": ("chain", 8, ""), "dspark-adaptive": ("adaptive", 8, ""), "dflash": ("chain", 3, ""),
            "eagle3": ("chain", 8, ""),
            "dspark-tree": ("dynamic-tree", 8, "tree_topk = 3\ntree_depth = 4\nmax_draft_rows = 1\n"),
            "dflash-tree": ("dynamic-tree", 8, "tree_topk = 3\ntree_depth = 3\nmax_draft_rows = 1\n"),
            "eagle3-tree": ("dynamic-tree", 8, "tree_topk = 3\ntree_depth = 4\nmax_draft_rows = 1\n")}
DRAFTERS.update({f"{name}-all-rows": (strategy, k, extra.replace("max_draft_rows = 1", "max_draft_rows = 0"))
                 for name, (strategy, k, extra) in list(DRAFTERS.items()) if name.endswith("-tree")})
# preset name -> (strategy, max draft, more TOML), the chains as the cosyvoice3-* presets, the trees as specli-en-dflash
# (DFlash's block of 4 drafts 3 positions, so its tree has 3 levels); *-all-rows: every batched row drafts


def write_presets(work: Path, voice: Path, drafters: Path, samplers: tuple[str, ...]) -> dict[str, Path]:
    """TOML presets over ``voice``: AR and pool under each sampler, each trained drafter found in ``drafters``."""
    out: dict[str, Path] = {}

    def preset(name: str, sampler: str, extra: str = "") -> None:
        path = work / f"{name}.toml"
        path.write_text(f'family = "cosyvoice"\nmodel = "{voice}"\nsampler = "{sampler}"\n{extra}')
        out[name] = path

    for sampler in samplers:
        preset(f"ar-{sampler}", sampler)
        preset(f"pool-{sampler}", sampler, 'strategy = "chain"\ndrafter = "pool"\nmax_draft = 8\n')
        for name, (strategy, k, extra) in DRAFTERS.items():
            kind = name.split("-")[0]
            if (drafters / kind / "config.json").is_file():
                preset(f"{name}-{sampler}", sampler, f'strategy = "{strategy}"\ndrafter = "{kind}"\n'
                       f'draft_dir = "{drafters / kind}"\nmax_draft = {k}\n{extra}')
    return out


def batched(presets: dict[str, Path], texts: Path, voice: Path, sizes: tuple[int, ...], repeat: int,
            sampler: str, only: tuple[str, ...] = ()) -> dict:
    """LLM-stage tokens/s of each ``sampler`` preset (or of ``only``) at each batch size (best of ``repeat``
    interleaved passes)."""
    requests = [it.request for it in read_items([str(texts)]) if it.request is not None]
    model = load_cosyvoice(str(voice), "float32")
    names = [n for n in presets if n.endswith(f"-{sampler}") and (not only or n in only)]
    best: dict[tuple[str, int], tuple[float, int]] = {}
    for _ in range(repeat + 1):  # the first pass warms up
        for size in sizes:
            for name in names:
                synth = build_synthesizer(load_synthesis_preset(str(presets[name])), model, PresetOverrides(seed=0))
                t0 = time.perf_counter()
                tokens = sum(len(res.tokens) for _, res in synth.synthesize_batch(requests, size))
                wall = time.perf_counter() - t0
                key = (name, size)
                if key not in best or wall < best[key][0]:
                    best[key] = (wall, tokens)
    rows = {}
    for (name, size), (wall, tokens) in best.items():
        base_wall, base_tokens = best[(f"ar-{sampler}", size)]
        rows.setdefault(name, {})[str(size)] = {
            "wall_seconds": wall, "tokens": tokens, "tokens_per_second": tokens / wall,
            "speedup_tokens_per_second": (tokens / wall) / (base_tokens / base_wall)}
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--voice", type=Path, default=REPO / "specli" / "voices" / "specli-en")
    ap.add_argument("--drafters", type=Path, required=True, help="dir with dspark/, dflash/, eagle3/ (trained)")
    ap.add_argument("--sentences", type=int, default=50, help="held-out sentences 0..N-1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--samplers", default="greedy,ras", help="comma-separated; the first is the baseline's (AR)")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: batch1, batched, audio")
    ap.add_argument("--audio-presets", default="", help="comma-separated presets for part 3 (default: every one of "
                    "the first sampler but the pool)")
    ap.add_argument("--audio-sentences", type=int, default=0, help="part 3 on the first N sentences (0: all)")
    ap.add_argument("--batched-presets", default="", help="comma-separated presets for part 2 (default: every one "
                    "of the first sampler; the AR baseline always)")
    ap.add_argument("--presets", default="", help="comma-separated presets for part 1 (default: every one; the AR "
                    "baseline always)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    work = Path(tempfile.mkdtemp(prefix="voice-spec-"))
    texts = work / "heldout.jsonl"
    rows = sentences("heldout")[: args.sentences]
    texts.write_text("".join(json.dumps({"id": sid, "text": text}) + "\n" for sid, text in rows))
    samplers = tuple(args.samplers.split(","))
    first = samplers[0]
    presets = write_presets(work, args.voice.resolve(), args.drafters.resolve(), samplers)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    asked = {n for flag in (args.presets, args.batched_presets, args.audio_presets) for n in flag.split(",") if n}
    if asked - set(presets):
        ap.error(f"no such preset: {', '.join(sorted(asked - set(presets)))} (made: {', '.join(presets)})")
    report: dict = {"voice": str(args.voice), "sentences": len(rows), "threads": args.threads,
                    "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
                    "presets": {k: v.read_text() for k, v in presets.items()}}
    if "batch1" not in skip:
        only = [f"ar-{first}"] + [n for n in args.presets.split(",") if n in presets and n != f"ar-{first}"]
        names = only if args.presets else list(presets)
        opts = SynthesisBenchOptions(tuple(str(presets[n]) for n in names), str(presets[f"ar-{first}"]), args.repeat)
        report["batch1"] = run_synthesis_bench([str(texts)], opts, log)
        report["batch1"].pop("runs")
    if "batched" not in skip:
        sizes = tuple(int(s) for s in args.batch_sizes.split(","))
        only = tuple(filter(None, args.batched_presets.split(",")))
        only = only and (f"ar-{first}", *only)
        report["batched"] = batched(presets, texts, args.voice, sizes, args.repeat, first, only)
    if "audio" not in skip:
        names = [n for n in presets if n.endswith(f"-{first}") and not n.startswith("pool")]
        names = [n for n in args.audio_presets.split(",") if n in presets] or names
        few = work / "audio.jsonl"
        few.write_text("".join(texts.read_text().splitlines(keepends=True)[: args.audio_sentences or None]))
        opts = SynthesisBenchOptions(tuple(str(presets[n]) for n in names), str(presets[f"ar-{first}"]), args.repeat,
                                     audio=True)
        report["audio"] = run_synthesis_bench([str(few)], opts, log)
        report["audio"].pop("runs")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"wrote {args.out / 'report.json'}")


if __name__ == "__main__":
    main()
