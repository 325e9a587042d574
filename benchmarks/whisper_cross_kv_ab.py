"""A batch-8 bf16 Whisper decode step with the window's cross-attention K/V stored in bfloat16 (now) against the
same step over float32 copies of them (the storage before issue 45's step 3; ``layers.cross_attention`` computes in
the K/V's dtype, so the float32 side is the old step exactly), in ONE process on one target, interleaved with
the order flipped every repeat; prints medians, after/before, the K/V bytes a row and each side's greedy tokens.
The rows are the first windows of the bundled clips (en, es, fr; the first ``--batch``), encoded once::

    OMP_NUM_THREADS=1 python benchmarks/whisper_cross_kv_ab.py --repeat 40
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from specli.asr.strategies import load_engine
from specli.io.audio import load_audio, window_features
from specli.presets import load_preset

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
PROMPT = [50258, 50259, 50359]  # <|startoftranscript|><|en|><|transcribe|>


def _steps(target, state, n: int) -> tuple[float, list[list[int]]]:
    """Wall of ``n`` greedy one-token steps after the prompt (the cache cropped back after), and the tokens."""
    rows = state.audio_features.shape[0]
    tok = torch.tensor([PROMPT] * rows)
    tok = target.score(state, tok).logits[:, -1].argmax(-1, keepdim=True)  # [rows, 1]
    out: list[list[int]] = [[] for _ in range(rows)]
    t0 = time.perf_counter()
    for _ in range(n):
        tok = target.score(state, tok).logits[:, -1].argmax(-1, keepdim=True)
        for r, t in enumerate(tok.tolist()):
            out[r].append(t[0])
    wall = time.perf_counter() - t0
    state.cache.crop(0)
    return wall / n, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10, help="one-token steps a timed run")
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_engine(load_preset("whisper-base-ar"), dtype="bfloat16").model.target
    clips = sorted(SAMPLES.glob("*/*.wav"))[: args.batch]
    with torch.inference_mode():
        feats = torch.cat([target.encode(window_features(load_audio(c))) for c in clips])
    bf16 = target.start(feats)
    f32 = target.start(feats)
    f32 = replace(f32, cross_kv=tuple(tuple(t.float() for t in kv) for kv in f32.cross_kv))
    sides = {"before (fp32 K/V)": f32, "after (bf16 K/V)": bf16}
    times: dict[str, list[float]] = {s: [] for s in sides}
    tokens = {}
    with torch.inference_mode():
        for rep in range(args.repeat):
            for name in list(sides)[:: 1 if rep % 2 else -1]:
                wall, tokens[name] = _steps(target, sides[name], args.steps)
                times[name].append(wall)
    for name, state in sides.items():
        kv = sum(t[0].numel() * t.element_size() for pair in state.cross_kv for t in pair)
        print(f"{name}: median {statistics.median(times[name]) * 1e3:.2f} ms a batch-{args.batch} step, "
              f"cross K/V {kv / 2**20:.1f} MiB a row")
    before, after = (statistics.median(times[s]) for s in sides)
    same = [a == b for a, b in zip(*tokens.values())]
    print(f"after/before {after / before:.3f}; rows with the same {args.steps} greedy tokens: {sum(same)}/{len(same)}")
    for clip, ok, a, b in zip(clips, same, *tokens.values()):
        if not ok:
            print(f"  {clip.parent.name}/{clip.name}: {a} vs {b}")


if __name__ == "__main__":
    main()
