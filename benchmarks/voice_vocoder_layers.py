"""Where specli-en's vocoder spends its time: each convolution group of HiFi-GAN V1 (the shipped universal generator)
timed on one mel, in float32 and in bf16 (the stage's autocast), with its multiply-adds counted from the shapes, so
the achieved GFLOP/s can be set beside the CPU's peak. Not a test:

    python benchmarks/voice_vocoder_layers.py --frames 384 --threads 2 --repeat 3
    python benchmarks/voice_vocoder_layers.py --kernels 3,7      # V1 without its kernel-11 blocks (scripts.voice vocoder)

A group is (kind, input channels, kernel): ``conv 128 11`` sums every kernel-11 convolution of the 128-channel
stage. The times are wall seconds around each call (``--repeat`` calls after a warm-up at the same length, the
fastest kept); the total includes the leaky ReLUs and adds between them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts.voice, the voice's build

import specli.tts.acoustic.hifigan as hifigan  # noqa: E402
from specli.bench.runner import machine_info  # noqa: E402

from scripts.voice.vocoder import student_of  # noqa: E402

Group = tuple[str, int, int]  # (conv / convT, input channels, kernel)


def _timed(kind: str, fn: Callable, times: dict[Group, float], macs: dict[Group, float]) -> Callable:
    def call(mod: torch.nn.Module, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        start = time.perf_counter()
        y = fn(mod, x, *args, **kwargs)
        key = (kind, int(x.shape[1]), int(mod.kernel_size[0]))
        times[key] = times.get(key, 0.0) + time.perf_counter() - start
        # a convolution: every output sample sums C_in x K products; a transposed one: every input sample
        # scatters C_in x C_out x K of them (y's channels are C_out)
        frames = x.shape[-1] if kind == "convT" else y.shape[-1]
        per = x.shape[1] * y.shape[1] * mod.kernel_size[0]
        macs[key] = macs.get(key, 0.0) + float(frames * per * x.shape[0])
        return y
    return call


def profile(model: hifigan.HifiGan, mel: torch.Tensor, bf16: bool, repeat: int) -> dict:
    """The fastest of ``repeat`` vocodings of ``mel``: total seconds and each group's seconds and multiply-adds."""
    best: dict | None = None
    conv, conv_t = hifigan._conv, hifigan._conv_transpose
    try:
        for i in range(repeat + 1):  # the first builds oneDNN's kernels for this length
            times: dict[Group, float] = {}
            macs: dict[Group, float] = {}
            hifigan._conv = _timed("conv", conv, times, macs)
            hifigan._conv_transpose = _timed("convT", conv_t, times, macs)
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                start = time.perf_counter()
                model.vocode(mel)
                total = time.perf_counter() - start
            if i and (best is None or total < best["total_s"]):
                best = {"total_s": total, "times": times, "macs": macs}
    finally:
        hifigan._conv, hifigan._conv_transpose = conv, conv_t
    assert best is not None
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=384, help="mel frames (a bucket length: no padding added)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kernels", default=None, help="time V1 keeping only these block kernels a stage (e.g. 3,7)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = hifigan.load_hifigan(buckets=True).eval()
    if args.kernels:
        model = student_of(model, tuple(int(k) for k in args.kernels.split(","))).eval().requires_grad_(False)
    mel = torch.randn(1, 80, args.frames, generator=torch.Generator().manual_seed(0)) - 6.0  # [1, 80, frames]
    audio_s = args.frames * model.cfg.hop_size / model.sample_rate
    report = {"frames": args.frames, "kernels": list(model.cfg.resblock_kernel_sizes), "audio_s": round(audio_s, 3), "machine": machine_info(args.threads),
              "torch": torch.__version__, "dtypes": {}}
    for name, bf16 in (("float32", False), ("bfloat16", True)):
        run = profile(model, mel, bf16, args.repeat)
        gmac = sum(run["macs"].values()) / 1e9
        report["dtypes"][name] = {
            "seconds": round(run["total_s"], 4), "rtf": round(run["total_s"] / audio_s, 4),
            "gmac": round(gmac, 2), "gflops": round(2 * gmac / run["total_s"], 1),
            "conv_share": round(sum(run["times"].values()) / run["total_s"], 3),
            "groups": {" ".join(map(str, k)): {"ms": round(v * 1e3, 1),
                                                "gflops": round(2 * run["macs"][k] / v / 1e9, 1)}
                       for k, v in sorted(run["times"].items(), key=lambda kv: -kv[1])}}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"{args.frames} frames ({audio_s:.2f} s of audio), kernels {report['kernels']}, {args.threads} thread(s), "
          f"{report['machine']['cpu']}")
    for name, row in report["dtypes"].items():
        print(f"\n{name}: {row['seconds']:.3f} s (RTF {row['rtf']:.3f}), {row['gmac']:.1f} GMAC, "
              f"{row['gflops']:.0f} GFLOP/s overall, convolutions {row['conv_share']:.0%} of the time")
        for group, g in row["groups"].items():
            print(f"  {group:<14} {g['ms']:8.1f} ms {g['gflops']:7.0f} GFLOP/s")


if __name__ == "__main__":
    main()
