"""Where a model runs and in which numeric type: ``--device auto|cpu|cuda[:N]`` and ``dtype``.

``auto`` picks the first CUDA device when one is available, else the CPU. A ``dtype`` of ``auto``
is float16 on CUDA; on the CPU it is bfloat16 where the CPU computes bf16 natively (AVX512-BF16 or
AMX-BF16, which oneDNN uses: whisper-base AR runs about 2x faster than in float32 at the same WER) and
float32 elsewhere (emulated bf16 is slower than float32). fp16 and bf16 are each their own greedy
reference: a speculative output is identical to plain greedy decoding in the same dtype, not to float32.

``int8`` (CPU only, asked for by name) is weight-only int8: a Whisper decoder's matrices and its tied vocabulary
projection int8 with per-output-channel scales, activations and the encoder in :func:`activation_dtype` (bfloat16
on native-bf16 CPUs). It is its own reference too. ``auto`` never picks it: its kernel is faster than bf16 at one
row (an AR decode step: whisper-base 1.2x, tiny.en 1.75x decoder tokens/s) but slower from about 4 rows, which
speculative verification and batched decoding score (``benchmarks/bench_int8.py``, ``docs/benchmarks/dtype-int8``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from pathlib import Path

import torch

from specli.errors import UsageError

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N")  # what --device accepts (N a CUDA device index)
# int8: weight-only int8 (torch.int8 names it; activations in activation_dtype), CPU only
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int8": torch.int8}
DTYPE_CHOICES = ("auto", *DTYPES)

_SPEC = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
#: /proc/cpuinfo flags of native bf16 arithmetic that oneDNN uses (AVX512-BF16 dot products, AMX tiles).
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
CPUINFO = Path("/proc/cpuinfo")


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """The ``torch.device`` for ``auto``, ``cpu``, ``cuda`` or ``cuda:N``; :class:`UsageError` when CUDA
    is asked for but not available, or the index does not exist."""
    if isinstance(spec, torch.device):
        spec = str(spec)
    if not _SPEC.match(spec):
        raise UsageError(f"device must be auto, cpu, cuda or cuda:N, not {spec!r}")
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(spec)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"device {spec!r} asked for, but torch sees no CUDA device "
                             f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"device {spec!r}: only {torch.cuda.device_count()} CUDA device(s)")
    return dev


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of the first processor in ``cpuinfo`` (the text of Linux's /proc/cpuinfo)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def has_native_bf16(flags: Iterable[str]) -> bool:
    """True when ``flags`` (CPU feature flags) include native bf16 arithmetic: AVX512-BF16 or AMX-BF16."""
    return not NATIVE_BF16_FLAGS.isdisjoint(flags)


@functools.cache
def cpu_native_bf16() -> bool:
    """This machine's CPU computes bf16 natively and torch has oneDNN to use it (read once)."""
    try:
        flags = cpu_flags(CPUINFO.read_text(encoding="utf-8", errors="replace"))
    except OSError:  # no /proc (macOS, Windows): no way to tell, float32 is the safe choice
        return False
    return has_native_bf16(flags) and torch.backends.mkldnn.is_available()


def auto_dtype(device: torch.device, native_bf16: bool | None = None) -> torch.dtype:
    """What ``dtype = "auto"`` is on ``device``: float16 on CUDA; on the CPU bfloat16 when it has native
    bf16 (``native_bf16``; None = this machine's, :func:`cpu_native_bf16`), else float32."""
    if device.type == "cuda":
        return torch.float16
    if native_bf16 is None:
        native_bf16 = cpu_native_bf16()
    return torch.bfloat16 if native_bf16 else torch.float32


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``dtype`` by name; ``auto`` is :func:`auto_dtype` (float16 on CUDA, bf16 or float32 on the CPU).
    :class:`UsageError` for ``int8`` off the CPU (its kernel is ATen's CPU one)."""
    if dtype == "auto":
        return auto_dtype(device)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPE_CHOICES)}, not {dtype!r}")
    if DTYPES[dtype] == torch.int8 and device.type != "cpu":
        raise UsageError(f"dtype 'int8' (weight-only int8) runs on the CPU only, not on {device}")
    return DTYPES[dtype]


def activation_dtype(dtype: torch.dtype, native_bf16: bool | None = None) -> torch.dtype:
    """What a model of numeric type ``dtype`` computes its activations in: ``dtype`` itself, except for int8
    (weight-only): bfloat16 where the CPU has native bf16 (``native_bf16``; None = this machine's), else
    float32. Its int8 kernel reads bf16 activations either way (widened by a shift, no native bf16 needed): the
    kernel's own float32 variant measured 8-30x slower (``benchmarks/bench_int8.py``)."""
    if dtype != torch.int8:
        return dtype
    if native_bf16 is None:
        native_bf16 = cpu_native_bf16()
    return torch.bfloat16 if native_bf16 else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    """The name :func:`resolve_dtype` takes for ``dtype``."""
    return next(name for name, d in DTYPES.items() if d == dtype)


def host_to_device(data, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``data`` (numbers or nested lists built on the host) as a tensor on ``device``.

    To CUDA it goes through pinned memory without blocking: a plain ``torch.tensor(data, device="cuda")``
    copies from pageable memory and waits for the GPU's queue to drain, a hidden host round trip.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return torch.tensor(data, dtype=dtype, device=device)
    return torch.tensor(data, dtype=dtype, device="cpu").pin_memory().to(device, non_blocking=True)
