"""Would a W8A8 (int8 x int8) Whisper encoder be faster than the bf16 one on this CPU? (issue 45's last item)

Times the encoder's matrix products at whisper-base's shapes (1,500 frames a 30-s window; q/k/v as one GEMM, out,
fc1, fc2) in float32, bfloat16 (oneDNN: AMX where the CPU has it) and int8: ATen's ``torch._int_mm`` (int8 x int8 ->
int32, the GEMM alone, no quantization of the activations) and PyTorch's dynamic-quantized Linear on the oneDNN
engine (activations quantized per call, int32 accumulate, dequantized: what an int8 encoder layer would cost).
Medians of ``--repeat`` calls after warm-up, one process::

    python benchmarks/encoder_gemm_int8.py --threads 2

``_int_mm`` no faster than bf16 means a W8A8 encoder cannot pay on this CPU, whatever its fusions.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
import warnings

import torch

FRAMES = 1500  # a 30-s window's encoder positions
SHAPES = {"qkv": (512, 1536), "out": (512, 512), "fc1": (512, 2048), "fc2": (2048, 512)}  # whisper-base (K, N)


def _median_ms(fn, repeat: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _dynamic_int8(linear: torch.nn.Linear) -> torch.nn.Module:
    torch.backends.quantized.engine = "onednn"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notices
        return torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear},
                                                      dtype=torch.qint8)


@torch.inference_mode()
def row(name: str, k: int, n: int, repeat: int, gen: torch.Generator) -> str:
    x = torch.randn(FRAMES, k, generator=gen)
    linear = torch.nn.Linear(k, n)
    xb, lb = x.bfloat16(), torch.nn.Linear(k, n).bfloat16()
    xi = torch.randint(-127, 128, (FRAMES, k), dtype=torch.int8, generator=gen)
    wi = torch.randint(-127, 128, (k, n), dtype=torch.int8, generator=gen)
    q = _dynamic_int8(linear)
    fp32, bf16 = _median_ms(lambda: linear(x), repeat), _median_ms(lambda: lb(xb), repeat)
    mm, dyn = _median_ms(lambda: torch._int_mm(xi, wi), repeat), _median_ms(lambda: q(x), repeat)
    gflop = 2 * FRAMES * k * n / 1e9
    return (f"| {name} [{FRAMES}x{k}]x[{k}x{n}] | {fp32:.3f} | {bf16:.3f} ({gflop / bf16 * 1e3:.0f} GFLOP/s) | "
            f"{mm:.3f} | {dyn:.3f} | {bf16 / mm:.2f}x | {bf16 / dyn:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {platform.processor() or platform.machine()}; "
          f"oneDNN capability: {torch.backends.cpu.get_cpu_capability()}; medians in ms")
    print("| GEMM | fp32 | bf16 | int8 _int_mm | int8 dynamic (onednn) | bf16 / _int_mm | bf16 / dynamic |")
    print("|---|---|---|---|---|---|---|")
    for name, (k, n) in SHAPES.items():
        print(row(name, k, n, args.repeat, gen))


if __name__ == "__main__":
    main()
