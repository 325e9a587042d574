"""Shared fixtures: real bundled Whisper models (converted once into a per-session cache) and clips."""

from __future__ import annotations

import os
from pathlib import Path

# Triton kernels run on the CPU through the interpreter; must be set before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
EN_CLIPS = sorted((SAMPLES / "en").glob("*.wav"))
ES_CLIPS = sorted((SAMPLES / "es").glob("*.wav"))
FR_CLIPS = sorted((SAMPLES / "fr").glob("*.wav"))

# Two intra-op threads unless OMP_NUM_THREADS says otherwise (`OMP_NUM_THREADS=1 python -m pytest` really
# runs at one thread: numeric tolerances must hold at 1 and 2).
_OMP = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
torch.set_num_threads(int(_OMP) if _OMP.isdigit() and int(_OMP) > 0 else 2)


@pytest.fixture(scope="session")
def whisper_models():
    """Loaded bundled models by name, loaded on first use."""
    from specli.models.whisper.loader import load_whisper

    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = load_whisper(name)
        return cache[name]

    return get


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module: on a shared 2-core machine a second thread mostly waits at
    barriers (decoder steps measured 4-6x slower with 2 threads than with 1 while other processes ran)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
