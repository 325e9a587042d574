"""The speech tokenizer as torch modules that export to ONNX (the frontend contract of ``SpeechTokenizer``).

Graph: Whisper 128-bin log-mel ``[1, 128, T]`` (100 frames/s) + int32 ``[1]`` = T
  -> fixed 128 -> 80-bin log-mel conversion (:func:`conversion_matrix`, non-negative, NNLS between the two
     slaney filterbanks; undo Whisper's normalisation, matmul, log10 / clamp / normalise again)
  -> the first ``n_layers`` blocks of the whisper-base encoder (+ its final LayerNorm), 50 Hz
  -> linear interpolation to ``n = max(1, round(T * 22050 / (1024 * 100)))`` frames (21.53 Hz, 4 mel
     frames of hop 256 at 22.05 kHz per token), frame i read at encoder position ``(i + 0.5) * 1024 / 441``
  -> FSQ: Linear(512 * taps -> d) -> bounded tanh -> round -> mixed-radix index (int32 ``[1, n]``); with several
     tap layers (e.g. 4 and 6) their outputs are concatenated before the projection.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.optimize
import torch
import torch.nn as nn
import torch.nn.functional as F

WHISPER_BINS, ENCODER_BINS = 128, 80
TOKEN_HOP_22K = 1024  # samples at 22.05 kHz per token
MEL_FRAMES_PER_TOKEN = 4  # hop 256 at 22.05 kHz
RATE_22K = 22050
# encoder frames (50 Hz) per token: 1024 / 22050 s / 0.02 s
ENC_PER_TOKEN = TOKEN_HOP_22K * 50 / RATE_22K
ENCODER_DIM = 512  # whisper-base's width: one tap layer's features
LEVEL_PRESETS: dict[str, tuple[int, ...]] = {"3^8": (3,) * 8, "4^5": (4,) * 5, "3^6": (3,) * 6,
                                             "5^4": (5,) * 4, "8^3": (8,) * 3, "3^9": (3,) * 9,
                                             "3^10": (3,) * 10}


def tap_layers(layer: int | Sequence[int]) -> tuple[int, ...]:
    """A run's ``layer`` setting (one layer, or a list whose outputs are concatenated) as ascending taps."""
    taps = (layer,) if isinstance(layer, int) else tuple(int(t) for t in layer)
    if not taps or list(taps) != sorted(set(taps)) or taps[0] < 1:
        raise ValueError(f"tap layers must be distinct, ascending and >= 1: {layer!r}")
    return taps


def feature_dim(layer: int | Sequence[int]) -> int:
    """Width of the features the FSQ reads for a run's ``layer`` setting: ``512 * taps``."""
    return ENCODER_DIM * len(tap_layers(layer))


def n_tokens(mel_frames: int) -> int:
    """Tokens for a clip whose Whisper log-mel has ``mel_frames`` frames (100 frames/s)."""
    return max(1, round(mel_frames * RATE_22K / (TOKEN_HOP_22K * 100)))


def slaney_16k(n_mels: int) -> np.ndarray:
    """Whisper's filterbank ``[n_mels, 201]`` (slaney, 0-8 kHz, n_fft 400 at 16 kHz), float64."""
    from specli.io.audio import mel_filters  # public: Whisper's own filterbank
    return mel_filters(n_mels).double().numpy()


def conversion_matrix() -> np.ndarray:
    """Non-negative ``[80, 128]`` M with ``M @ F128 ~ F80`` (row-wise NNLS on the filterbanks), float32."""
    f128, f80 = slaney_16k(WHISPER_BINS), slaney_16k(ENCODER_BINS)
    rows = [scipy.optimize.nnls(f128.T, f80[i])[0] for i in range(ENCODER_BINS)]
    return np.stack(rows).astype(np.float32)


def convert_log_mel(x: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """Whisper-normalised log-mel ``[B, 128, T]`` -> ``[B, 80, T]`` (same normalisation, per-clip max)."""
    power = torch.pow(10.0, 4.0 * x - 4.0)
    log = torch.log10(torch.clamp(torch.matmul(matrix, power), min=1e-10))
    log = torch.maximum(log, log.amax(dim=(1, 2), keepdim=True) - 8.0)
    return (log + 4.0) / 4.0


class Block(nn.Module):
    """One pre-norm Whisper encoder block (HF names)."""

    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d, bias=False)
        self.v_proj, self.out_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.final_layer_norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.self_attn_layer_norm(x)
        dh = d // self.heads
        q, k, v = (p(h).reshape(b, t, self.heads, dh).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        att = torch.softmax(torch.matmul(q, k.transpose(2, 3)) * (dh ** -0.5), dim=-1)
        x = x + self.out_proj(torch.matmul(att, v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class Encoder(nn.Module):
    """The first ``n_layers`` whisper encoder blocks; returns the LayerNormed output of each tap layer."""

    def __init__(self, d: int = 512, heads: int = 8, ffn: int = 2048, n_layers: int = 6,
                 positions: int = 1500, taps: Sequence[int] | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(ENCODER_BINS, d, 3, padding=1)
        self.conv2 = nn.Conv1d(d, d, 3, stride=2, padding=1)
        self.register_buffer("embed_positions", torch.zeros(positions, d))
        self.layers = nn.ModuleList(Block(d, heads, ffn) for _ in range(n_layers))
        self.layer_norm = nn.LayerNorm(d)
        self.taps = tuple(taps) if taps else (n_layers,)

    def forward(self, mel80: torch.Tensor) -> list[torch.Tensor]:  # [1, 80, T] -> [[1, ceil(T/2), d]]
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel80)))).transpose(1, 2)
        x = x + self.embed_positions[: x.shape[1]]
        outs = []
        for i, layer in enumerate(self.layers, start=1):
            x = layer(x)
            if i in self.taps:
                outs.append(self.layer_norm(x))
        return outs


def load_encoder(n_layers: int, taps: Sequence[int] | None = None, name: str = "whisper-base") -> Encoder:
    """The bundled Whisper encoder's first ``n_layers`` blocks (weights from its model.safetensors)."""
    import json

    from safetensors.torch import load_file
    from specli.models.whisper.loader import load_whisper

    path = load_whisper(name, "float32").path
    cfg = json.loads((path / "config.json").read_text())
    enc = Encoder(cfg["d_model"], cfg["encoder_attention_heads"], cfg["encoder_ffn_dim"], n_layers,
                  cfg["max_source_positions"], taps)
    weights = load_file(str(path / "model.safetensors"))
    state = {k[len("model.encoder."):].replace(".self_attn.", ".").replace("embed_positions.weight",
                                                                          "embed_positions"): v
             for k, v in weights.items() if k.startswith("model.encoder.")}
    state = {k: v for k, v in state.items() if not k.startswith("layers.") or int(k.split(".")[1]) < n_layers}
    enc.load_state_dict(state, strict=True)
    return enc.eval()


def interpolate_tokens(h: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """``[1, A, d]`` at 50 Hz -> ``[1, n, d]`` at 21.53 Hz: linear interpolation at ``(i + 0.5) * 1024/441``."""
    a = h.shape[1]
    pos = (torch.arange(n.reshape(-1)[0], dtype=torch.float32) + 0.5) * ENC_PER_TOKEN
    last = torch.as_tensor(a - 1, dtype=torch.float32)
    pos = torch.minimum(pos, last)
    i0 = torch.floor(pos)
    w = (pos - i0).unsqueeze(-1)
    i1 = torch.minimum(i0 + 1.0, last)
    return h[:, i0.to(torch.int64)] * (1.0 - w) + h[:, i1.to(torch.int64)] * w


def n_tokens_graph(length: torch.Tensor) -> torch.Tensor:
    """:func:`n_tokens` in the graph (ONNX Round and torch.round both round half to even)."""
    n = torch.round(length.to(torch.float32) * (RATE_22K / (TOKEN_HOP_22K * 100)))
    return torch.clamp(n, min=1.0).to(torch.int64)


class FSQ(nn.Module):
    """Finite scalar quantisation (Mentzer et al. 2023): Linear(dim_in -> d), bound, round, mixed radix."""

    def __init__(self, levels: Sequence[int], dim_in: int = 512, eps: float = 1e-3) -> None:
        super().__init__()
        lv = torch.tensor(list(levels), dtype=torch.float32)
        self.levels = tuple(int(x) for x in levels)
        self.proj = nn.Linear(dim_in, len(levels))
        half_l = (lv - 1.0) * (1.0 + eps) / 2.0
        offset = torch.where(lv % 2 == 0, 0.5, 0.0)
        basis = torch.cumprod(torch.tensor([1, *self.levels[:-1]], dtype=torch.int64), 0)
        self.register_buffer("half_l", half_l)
        self.register_buffer("offset", offset)
        self.register_buffer("shift", torch.atanh(offset / half_l))
        self.register_buffer("half_width", torch.floor(lv / 2.0))
        self.register_buffer("basis", basis)

    @property
    def size(self) -> int:
        return math.prod(self.levels)

    def bound(self, z: torch.Tensor) -> torch.Tensor:
        return torch.tanh(z + self.shift) * self.half_l - self.offset

    def codes(self, x: torch.Tensor, quantise: bool = True) -> torch.Tensor:
        """Normalised codes in [-1, 1] (straight-through rounding when ``quantise``)."""
        b = self.bound(self.proj(x))
        if quantise:
            b = b + (torch.round(b) - b).detach()
        return b / self.half_width

    def indices(self, x: torch.Tensor) -> torch.Tensor:
        q = torch.round(self.bound(self.proj(x)))
        return ((q + self.half_width).to(torch.int64) * self.basis).sum(-1)

    def digits(self, idx: torch.Tensor) -> torch.Tensor:
        """Index -> integer code per dimension, ``[..., d]`` in ``[-half_width, ...]``."""
        lv = torch.tensor(self.levels, dtype=torch.int64, device=idx.device)
        return (idx.unsqueeze(-1) // self.basis) % lv - self.half_width.to(torch.int64)

    def codes_from_indices(self, idx: torch.Tensor) -> torch.Tensor:
        return self.digits(idx).to(torch.float32) / self.half_width


class FeatureGraph(nn.Module):
    """Training features: (log-mel 128, T) -> interpolated encoder outputs of the tap layers ``[1, n, d]``."""

    def __init__(self, encoder: Encoder, matrix: np.ndarray) -> None:
        super().__init__()
        self.encoder = encoder
        self.register_buffer("matrix", torch.from_numpy(np.asarray(matrix, dtype=np.float32)))

    def forward(self, feats: torch.Tensor, feats_length: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = n_tokens_graph(feats_length)
        outs = self.encoder(convert_log_mel(feats, self.matrix))
        return tuple(interpolate_tokens(h, n) for h in outs)


class TokenizerGraph(nn.Module):
    """The shipped tokenizer: (log-mel 128 ``[1, 128, T]``, int32 ``[1]``) -> int32 token ids ``[1, n]``; the FSQ
    reads the encoder's tap layers concatenated (one tap: that layer)."""

    def __init__(self, encoder: Encoder, matrix: np.ndarray, fsq: FSQ) -> None:
        super().__init__()
        self.features = FeatureGraph(encoder, matrix)
        self.fsq = fsq

    def forward(self, feats: torch.Tensor, feats_length: torch.Tensor) -> torch.Tensor:
        h = torch.cat(self.features(feats, feats_length), dim=-1)  # [1, n, 512 * taps]
        return self.fsq.indices(h).to(torch.int32)
