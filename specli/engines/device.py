"""Where a model runs and in which numeric type: ``--device auto|cpu|cuda[:N]`` and ``dtype``.

``auto`` picks the first CUDA device when one is available, else the CPU. A ``dtype`` of ``auto``
is float32 on the CPU (the oneDNN fast path; bf16 is its own greedy reference there) and float16 on
CUDA (fp16 and bf16 are each their own greedy reference: outputs of one dtype are compared with
plain decoding in the same dtype).
"""

from __future__ import annotations

import re

import torch

from specli.errors import UsageError

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N")  # what --device accepts (N a CUDA device index)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)

_SPEC = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


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


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``dtype`` by name; ``auto`` is float32 on the CPU and float16 on CUDA."""
    if dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPE_CHOICES)}, not {dtype!r}")
    return DTYPES[dtype]


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
