"""Decode throughput of ragged batched decoding (core/batched.py) at several batch sizes.

Real clips' first windows (encoded once, outside the timing) are decoded greedily with timestamp rules,
``2 x batch`` rows per batch size through :func:`specli.core.batched.decode_all` (continuous
batching: a row joins when one leaves), without and/or with a drafter (n-gram pool per row, or the
batched EAGLE head). Tokens/s counts every emitted
token (eot included) over the decode wall time; batch 1 through ``greedy_decode`` is printed as the
reference. Run:

    python benchmarks/bench_batched_decode.py --model whisper-base --threads 2 --batch-sizes 1 4 8 --max-new 40 \
        --drafters none eagle
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from specli.io.audio import N_SAMPLES, load_audio, window_features
from specli.core.batched import RowJob, decode_all
from specli.core.drafters.batched import PerRowDrafters
from specli.asr.drafters.eagle_head import load_head
from specli.asr.drafters.eagle_batched import BatchedEagleDrafter
from specli.core.drafters.ngram import NgramDrafter, NgramPool
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob, Probe
from specli.core.speculative import SpecOptions
from specli.models.whisper.loader import load_whisper
from specli.models.whisper.rules import WhisperLogitRules

CLIPS = sorted((Path(__file__).resolve().parent.parent / "samples" / "en").glob("*.wav"))


def _drafter(kind: str, model, batch: int):
    if kind.startswith("eagle"):
        dtype = torch.bfloat16 if kind == "eagle-bf16" else torch.float32
        return BatchedEagleDrafter(load_head(f"{model.name}-eagle", model.target), batch, dtype=dtype)
    if kind == "pool":
        pool = NgramPool(4)
        return PerRowDrafters(lambda: NgramDrafter(pool, model.special.eot))
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="whisper-base")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--max-new", type=int, default=40, help="most tokens a row decodes")
    ap.add_argument("--drafters", choices=["none", "pool", "eagle", "eagle-bf16"], nargs="+", default=["none"],
                    help="decode each batch size with each (interleaved: the same machine load)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_whisper(args.model)
    target, sp = model.target, model.special
    mels = torch.cat([window_features(load_audio(c)[:N_SAMPLES], target.dims.n_mels) for c in CLIPS])
    enc = target.encode(mels)  # [clips, 1500, d]
    rules = WhisperLogitRules.for_model(sp, timestamps=True)
    prompt = sp.prompt("en" if sp.multilingual else None, timestamps=True)

    def job(i: int) -> RowJob:
        c = i % enc.shape[0]
        return RowJob(i, enc[c : c + 1], DecodeJob(tuple(prompt), rules, sp.eot, args.max_new,
                                                   probe=Probe(prompt.index(sp.sot), sp.no_speech)))

    t0, tokens = time.perf_counter(), 0
    for i in range(4):
        j = job(i)
        tokens += greedy_decode(target, target.start(j.context), j.job).stats.tokens
    print(f"{args.model} threads={args.threads} max_new={args.max_new}")
    print(f"greedy_decode batch 1: {tokens / (time.perf_counter() - t0):7.1f} tokens/s")
    for b in args.batch_sizes:
        jobs = [job(i) for i in range(2 * b)]
        for kind in args.drafters:
            drafter = _drafter(kind, model, b)
            t0 = time.perf_counter()
            results = list(decode_all(target, jobs, b, drafter=drafter, options=SpecOptions(max_draft=6)))
            wall = time.perf_counter() - t0
            tokens = sum(r.stats.tokens for _k, r in results)
            steps = sum(r.stats.verify_steps for _k, r in results)
            print(f"decode_all batch {b:2d} drafter {kind:10s}: {tokens / wall:7.1f} tokens/s ({len(results)} rows, "
                  f"{tokens} tokens, {wall:.2f} s, {tokens / steps:.2f} tokens a row-step)")


if __name__ == "__main__":
    main()
