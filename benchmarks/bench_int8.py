"""int8 kernels vs the float ones on this CPU (issue 26): what ``--dtype int8`` quantises, and what it keeps float.

* ``decoder``: one decode step's matrices (one row): oneDNN's packed bf16 ``Linear`` vs weight-only
  ``Int8Linear`` (ATen ``_weight_int8pack_mm``, bf16 kernel), and ``Int8Linear`` with float32 activations fed to
  its bf16 kernel (CPUs without native bf16) vs its float32 kernel.
* ``encoder``: the encoder's 1,500-row GEMMs: packed bf16 ``Linear`` vs ``DynamicInt8Linear`` (per-row dynamic
  activation int8, ``torch._int_mm``: oneDNN s8s8 with VNNI / AMX).
* ``e2e``: whisper-``--model`` greedy AR (or ``--preset``'s speculative decoding) on one clip, bfloat16 vs int8
  targets: the encoder call and the decoder's tokens per second.
* ``rows``: the weight-only kernel vs packed bf16 at 1-24 rows (speculative verification, batched decoding).

Median of ``--repeat`` timings after a warm-up, ``--threads`` threads::

    python benchmarks/bench_int8.py --threads 1
    python benchmarks/bench_int8.py --only e2e --model whisper-tiny.en --clip path/to.wav
    python benchmarks/bench_int8.py --only e2e --preset whisper-eagle-asr

The WER check (int8 vs fp32 on 30 held-out real clips) is ``specli bench`` with the presets of
``docs/benchmarks/dtype-int8/`` (see its README).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from specli.models.layers import DynamicInt8Linear, Int8Linear, Linear

REPO = Path(__file__).resolve().parent.parent
CLIP = Path("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0890.wav")
# (out, in) of whisper-base's matrices: attention projections, MLP up / down, the tied vocabulary projection
DECODER = [(512, 512), (2048, 512), (512, 2048), (51865, 512)]
ENCODER = [(512, 512), (2048, 512), (512, 2048)]


def timed(fn, repeat: int) -> float:
    """Median seconds of ``fn()`` over ``repeat`` calls after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def decoder_kernels(repeat: int) -> None:
    print("| decoder step (1 row) | bf16 Linear | int8 (bf16 act.) | int8, fp32 act. -> bf16 kernel | "
          "int8 fp32 kernel |")
    print("|---|---|---|---|---|")
    for out_f, in_f in DECODER:
        w = torch.randn(out_f, in_f) * 0.02
        xb, xf = torch.randn(1, in_f).bfloat16(), torch.randn(1, in_f)
        dense = Linear(w.bfloat16(), None)
        q8 = Int8Linear(w, None, torch.bfloat16)
        q8f = Int8Linear(w, None, torch.float32, kernel_dtype=torch.bfloat16)
        q8f32 = Int8Linear(w, None, torch.float32)
        cells = [timed(lambda f=f, x=x: f(x), repeat) * 1e6
                 for f, x in ((dense, xb), (q8, xb), (q8f, xf), (q8f32, xf))]
        print(f"| {out_f}x{in_f} | " + " | ".join(f"{c:.0f} us" for c in cells) + " |")


def encoder_kernels(repeat: int, rows: int = 1500) -> None:
    print(f"\n| encoder GEMM ({rows} rows) | bf16 Linear | fp32 Linear | dynamic int8 (VNNI) | max rel. error int8 |")
    print("|---|---|---|---|---|")
    for out_f, in_f in ENCODER:
        w = torch.randn(out_f, in_f) * 0.02
        x = torch.randn(rows, in_f)
        dense, dense32, dyn = Linear(w.bfloat16(), None), Linear(w, None), DynamicInt8Linear(w, None)
        xb = x.bfloat16()
        cells = [timed(lambda f=f, a=a: f(a), repeat) * 1e3 for f, a in ((dense, xb), (dense32, x), (dyn, x))]
        exact = x @ w.T
        err = float((dyn(x) - exact).abs().max() / exact.abs().max())
        print(f"| {out_f}x{in_f} | " + " | ".join(f"{c:.2f} ms" for c in cells) + f" | {err:.1e} |")


def row_counts(repeat: int) -> None:
    print("\n| rows | " + " | ".join(f"{o}x{i} bf16 / int8" for o, i in DECODER) + " |")
    print("|---|" + "---|" * len(DECODER))
    layers = [(Linear(w.bfloat16(), None), Int8Linear(w, None, torch.bfloat16))
              for w in (torch.randn(o, i) * 0.02 for o, i in DECODER)]
    for rows in (1, 2, 4, 8, 16, 24):
        cells = []
        for (dense, q8), (_, in_f) in zip(layers, DECODER):
            x = torch.randn(rows, in_f).bfloat16()
            cells.append(f"{timed(lambda: dense(x), repeat) * 1e6:.0f} / {timed(lambda: q8(x), repeat) * 1e6:.0f} us")
        print(f"| {rows} | " + " | ".join(cells) + " |")


def end_to_end(model: str, clip: Path, preset: str | None) -> None:
    from dataclasses import replace

    from specli.models.speech import DecodingOptions
    from specli.asr.strategies import build_decoder
    from specli.asr.windows import TranscribeOptions, transcribe_stream
    from specli.io.audio import iter_audio_chunks
    from specli.models.whisper.loader import load_whisper
    from specli.presets import load_preset

    p = None if preset is None else load_preset(preset)
    model = model if p is None else p.model
    print(f"\n| {model}, {clip.name}, greedy {preset or 'AR'} | encoder s/window | decode tokens/s | tokens | wall s |")
    print("|---|---|---|---|---|")
    opts = TranscribeOptions(language="en", decoding=DecodingOptions(temperatures=(0.0,)))
    for dtype in ("bfloat16", "int8"):
        whisper = load_whisper(model, dtype)
        kw = {} if p is None else {"decode": build_decoder(replace(p, dtype=dtype), whisper, "en")}
        transcribe_stream(whisper, iter_audio_chunks(clip), opts, **kw)  # warm-up
        best = None
        for _ in range(3):
            start = time.perf_counter()
            res = transcribe_stream(whisper, iter_audio_chunks(clip), opts, **kw)
            wall = time.perf_counter() - start
            if best is None or wall < best[0]:
                best = (wall, res.stats)
        wall, stats = best
        dec = stats.decode
        print(f"| {dtype} | {stats.encode_seconds / max(stats.windows, 1):.3f} | "
              f"{dec.tokens / max(dec.decode_seconds, 1e-9):.1f} | {dec.tokens} | {wall:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["decoder", "encoder", "rows", "e2e"], help="one table (default: all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--model", default="whisper-base")
    ap.add_argument("--clip", type=Path, default=CLIP)
    ap.add_argument("--preset", help="e2e: decode with this speculative preset (default: AR)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        if args.only in (None, "decoder"):
            decoder_kernels(args.repeat)
        if args.only in (None, "encoder"):
            encoder_kernels(max(3, args.repeat // 4))
        if args.only in (None, "rows"):
            row_counts(args.repeat)
    if args.only in (None, "e2e"):
        end_to_end(args.model, args.clip, args.preset)


if __name__ == "__main__":
    main()
