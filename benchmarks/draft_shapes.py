"""Draft shapes side by side: AR vs the confidence-adaptive chain vs the EAGLE-2 dynamic tree vs
SpecASR's two-pass sparse tree (and its old leaves-only form), on real speech, in one process.

Every configuration decodes every clip in turn (interleaved, so load on a shared machine hits them
alike), ``--rounds`` times; the report gives per configuration the acceptance length tau (tokens per
target forward of a verification step, bonus included), the decode-phase time (the decode loop: drafting
+ verification, prefill included; the encoder excluded) and its ratio to AR, the drafting share, and
whether every transcript was identical to AR's (it must be).

    python benchmarks/draft_shapes.py --threads 2 --clips 4 --rounds 2
    python benchmarks/draft_shapes.py --configs ar,eagle-adaptive,tree:d5k3n10,tree:d4k4n12
    python benchmarks/draft_shapes.py --dtype bfloat16 --configs adaptive:c60,adaptive:c70,adaptive:c80m8 \
        --audio /work/distill/audio/heldout-in/espeak/espeak-001[0-2].wav ...
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

from specli.io.audio import iter_audio_chunks
from specli.models.speech import DecodingOptions
from specli.asr.strategies import build_decoder
from specli.models.whisper.loader import load_whisper
from specli.asr.windows import TranscribeOptions, transcribe_stream
from specli.core.types import DecodeStats, accumulate
from specli.presets import preset_from_dict, read_preset_toml

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "en"
EAGLE_SPARSE = {"strategy": "sparse-tree", "confidence_threshold": 0.7, "tree_topk": 2, "tree_threshold": 0.6,
                "max_draft": 12}
CONFIGS = {  # name: (shipped preset, overrides)
    "ar": ("whisper-base-ar", {}),
    "eagle-chain3": ("whisper-eagle-asr-chain", {}),
    "eagle-adaptive": ("whisper-eagle-asr", {}),
    "eagle-float-head": ("whisper-eagle-asr", {"head_weights": "float"}),  # the head's matrices not int8
    "eagle-tree": ("whisper-eagle-asr-tree", {}),
    "eagle-sparse-2pass": ("whisper-eagle-asr", {**EAGLE_SPARSE, "branch_steps": 3}),
    "eagle-sparse-leaves": ("whisper-eagle-asr", {**EAGLE_SPARSE, "branch_steps": 0}),
    "tinyen-sparse-2pass": ("whisper-base-tinyen-sparse-tree", {}),
    "tinyen-sparse-leaves": ("whisper-base-tinyen-sparse-tree", {"branch_steps": 0}),
}
DEFAULT = "ar,eagle-adaptive,eagle-tree,eagle-sparse-2pass,eagle-sparse-leaves"
TREE = re.compile(r"^tree:d(\d+)k(\d+)n(\d+)(?:p(\d+))?$")  # ad-hoc dynamic tree: depth, topk, nodes, min path %
ADAPTIVE = re.compile(r"^adaptive:c(\d+)(?:m(\d+))?(?:s(\d+))?$")  # ad-hoc chain: confidence %, max draft, stop %


def preset_for(name: str):
    """The preset of configuration ``name``: a CONFIGS key, ``tree:dDkKnN[pP]`` or ``adaptive:cC[mM][sS]`` (the
    default EAGLE chain with confidence threshold C %, max draft M, stop_drafting_below S / 100)."""
    m, a = TREE.match(name), ADAPTIVE.match(name)
    if m:
        base, over = "whisper-eagle-asr-tree", {"tree_depth": int(m[1]), "tree_topk": int(m[2]),
                                                "max_draft": int(m[3]), "confidence_threshold": int(m[4] or 0) / 100}
    elif a:
        over = {"confidence_threshold": int(a[1]) / 100}
        if a[2]:
            over["max_draft"] = int(a[2])
        if a[3]:
            over["stop_drafting_below"] = int(a[3]) / 100
        base = "whisper-eagle-asr"
    else:
        base, over = CONFIGS[name]
    data = {k: v for k, v in read_preset_toml(base)[1].items() if k != "description"}
    return preset_from_dict(name, {**data, **over})


def run(model, clip: Path, decode=None) -> tuple[list, DecodeStats]:
    opts = TranscribeOptions(language="en", decoding=DecodingOptions(temperatures=(0.0,)))
    res = transcribe_stream(model, iter_audio_chunks(clip), opts, **({} if decode is None else {"decode": decode}))
    return [s.tokens for s in res.segments], res.stats.decode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=DEFAULT,
                    help=f"comma-separated: {', '.join(CONFIGS)}, tree:dDkKnN[pP] (P: min path probability, %%) "
                         "or adaptive:cC[mM][sS] (confidence %%, max draft, stop_drafting_below %%)")
    ap.add_argument("--clips", type=int, default=4, help="first N clips of samples/en (without --audio)")
    ap.add_argument("--audio", type=Path, nargs="+", help="clips to decode instead of samples/en")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="the target's dtype")
    ap.add_argument("--rounds", type=int, default=2, help="passes over the clips (the first also warms up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    names = args.configs.split(",")
    if "ar" not in names:
        names.insert(0, "ar")
    presets = {n: preset_for(n) for n in names}
    model = load_whisper("whisper-base", args.dtype)
    decoders = {n: (None if p.draft.strategy == "ar" else build_decoder(p, model, "en")) for n, p in presets.items()}
    clips = args.audio or sorted(SAMPLES.glob("*.wav"))[: args.clips]
    stats = {n: DecodeStats() for n in names}
    ref: dict[Path, list] = {}
    mismatches = {n: 0 for n in names}
    for rnd in range(args.rounds):
        for clip in clips:
            for n in names:
                tokens, st = run(model, clip, decoders[n])
                print(f"round {rnd + 1} {clip.name} {n}: tau {st.acceptance_length:.2f}, "
                      f"decode {st.decode_seconds:.2f} s", file=sys.stderr, flush=True)
                ref.setdefault(clip, tokens)
                mismatches[n] += tokens != ref[clip]
                if rnd or args.rounds == 1:  # the first round warms up (kernels, caches) unless it is the only one
                    accumulate(stats[n], st)
    ar = stats["ar"].decode_seconds
    rows = []
    for n in names:
        s = stats[n]
        rows.append({"config": n, "tau": round(s.acceptance_length, 3) if n != "ar" else 1.0,
                     "decode_s": round(s.decode_seconds, 3), "speedup_vs_ar": round(ar / s.decode_seconds, 3),
                     "draft_share": round(s.draft_seconds / s.decode_seconds, 3), "tokens": s.tokens,
                     "target_forwards": s.target_forwards,
                     "drafted_per_step": round(s.drafted / max(s.verify_steps, 1), 2),
                     "identical_to_ar": mismatches[n] == 0})
    print(f"{'config':24} {'tau':>6} {'decode s':>9} {'x AR':>6} {'draft %':>8} {'nodes/step':>10} identical")
    for r in rows:
        print(f"{r['config']:24} {r['tau']:6.2f} {r['decode_s']:9.2f} {r['speedup_vs_ar']:6.2f} "
              f"{100 * r['draft_share']:7.1f}% {r['drafted_per_step']:10.1f} {r['identical_to_ar']}")
    print(f"{len(clips)} clips x {args.rounds} round(s), {args.threads} threads, whisper-base {args.dtype}",
          file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
