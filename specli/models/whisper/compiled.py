"""Optional ``torch.compile`` of the Whisper encoder (``--compile-encoder``).

The eager encoder (``WhisperTarget.encode``) runs its matrices through oneDNN-packed weights held
outside any ``nn.Module``; inductor cannot lower those. This module rebuilds the same computation
over plain weights registered as frozen parameters, so inductor (with ``freezing``: weights are
constants, packed by inductor itself) compiles the whole encoder into one graph. Compilation costs
tens of seconds once per process and per input shape (always ``[1, n_mels, 3000]`` here); it is paid
at load by a warm-up call and reported (``CompiledEncoder.compile_seconds``). Outputs match the eager
encoder to ~1e-5 in fp32 (tests); whether it pays depends on the CPU — measure with
``benchmarks/bench_target.py --compile``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from specli.models.whisper.convert import WhisperDims
from specli.models.whisper.encoder import EncoderBlock, WhisperEncoder


class EncoderSource(Protocol):
    """What compiling reads of a Whisper target (``WhisperTarget``, whose module imports this one)."""

    dims: WhisperDims  # the encoder's heads and its input's size (n_mels, audio_ctx)
    encoder: WhisperEncoder  # the eager encoder, whose weights are copied
    compute_dtype: torch.dtype  # the warm-up input's dtype
    device: torch.device  # where the warm-up input lives


def _frozen(x: torch.Tensor | None) -> nn.Parameter | None:
    return None if x is None else nn.Parameter(x.detach().clone(), requires_grad=False)


class _EncoderLayer(nn.Module):
    def __init__(self, blk: EncoderBlock) -> None:
        super().__init__()
        self.qkv_w, self.qkv_b = (_frozen(t) for t in blk.qkv_weight())  # q, k, v as one GEMM
        self.o_w, self.o_b = _frozen(blk.out.weight), _frozen(blk.out.bias)
        self.fc1_w, self.fc1_b = _frozen(blk.fc1.weight), _frozen(blk.fc1.bias)
        self.fc2_w, self.fc2_b = _frozen(blk.fc2.weight), _frozen(blk.fc2.bias)
        self.ln1_w, self.ln1_b = _frozen(blk.self_ln[0]), _frozen(blk.self_ln[1])
        self.ln2_w, self.ln2_b = _frozen(blk.final_ln[0]), _frozen(blk.final_ln[1])

    def forward(self, x: torch.Tensor, heads: int) -> torch.Tensor:  # [B, A, d] -> [B, A, d]
        b, n, d = x.shape
        h = F.layer_norm(x, (d,), self.ln1_w, self.ln1_b)
        q, k, v = F.linear(h, self.qkv_w, self.qkv_b).view(b, n, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        x = x + F.linear(att, self.o_w, self.o_b)
        h = F.layer_norm(x, (d,), self.ln2_w, self.ln2_b)
        return x + F.linear(F.gelu(F.linear(h, self.fc1_w, self.fc1_b)), self.fc2_w, self.fc2_b)


class EncoderModule(nn.Module):
    """The target's encoder over plain frozen weights: ``mel [B, n_mels, 3000] -> [B, audio_ctx, d]``."""

    def __init__(self, target: EncoderSource) -> None:
        super().__init__()
        self.heads = target.dims.encoder_heads
        enc = target.encoder
        self.conv1_w, self.conv1_b = (_frozen(t) for t in enc.conv1)
        self.conv2_w, self.conv2_b = (_frozen(t) for t in enc.conv2)
        self.pos = _frozen(enc.pos)
        self.layers = nn.ModuleList(_EncoderLayer(blk) for blk in enc.blocks)
        self.ln_w, self.ln_b = (_frozen(t) for t in enc.ln)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = F.gelu(F.conv1d(mel, self.conv1_w, self.conv1_b, padding=1))
        x = F.gelu(F.conv1d(x, self.conv2_w, self.conv2_b, stride=2, padding=1))
        x = x.transpose(1, 2) + self.pos[: x.shape[2]]
        for layer in self.layers:
            x = layer(x, self.heads)
        return F.layer_norm(x, (x.shape[-1],), self.ln_w, self.ln_b)


@dataclass(frozen=True)
class CompiledEncoder:
    """A compiled encoder and what compiling it cost."""

    fn: Callable[[torch.Tensor], torch.Tensor]  # mel [1, n_mels, 3000] -> [1, audio_ctx, d]
    compile_seconds: float  # wall time of the warm-up call that compiled it


def compile_encoder(target: EncoderSource) -> CompiledEncoder:
    """Compile ``target``'s encoder with inductor (weights frozen as constants) and warm it up."""
    module = EncoderModule(target).eval()
    # freezing: weights are constants, which inductor packs for its own kernels (this compile only)
    fn = torch.compile(module, dynamic=False, options={"freezing": True})
    mel = torch.zeros(1, target.dims.n_mels, 2 * target.dims.audio_ctx, dtype=target.compute_dtype,
                      device=target.device)
    start = time.perf_counter()
    with torch.inference_mode():
        fn(mel)
    return CompiledEncoder(fn, time.perf_counter() - start)
