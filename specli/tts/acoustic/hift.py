"""HiFT vocoder (inference only): 80-bin mel at 50 frames/s -> 24 kHz audio, 480 samples per frame.

A port of CosyVoice's ``cosyvoice/hifigan/generator.py`` + ``f0_predictor.py`` (HiFTNet: a neural
source-filter excitation + an iSTFT HiFi-GAN), loading the official ``hift.pt``:

- CosyVoice2 ``HiFTGenerator`` with ``ConvRNNF0Predictor``: "same"-padded convolutions, transposed
  convolutions for upsampling.
- CosyVoice3 ``CausalHiFTGenerator`` with ``CausalConvRNNF0Predictor``: every convolution is causal
  (left-padded) except two look-ahead ones (F0 predictor input conv: 3 frames; ``conv_pre``: 4 frames),
  upsampling is nearest-neighbour + causal conv. With ``finalize=False`` the look-ahead convolutions use
  real frames instead of zero padding and the last frame of audio is held back, so the audio of a mel
  prefix is a prefix of the audio of any longer mel (what upstream's streaming relies on: it re-vocodes
  the whole mel so far and emits only the samples past what it already emitted).

Pipeline per call: F0 predictor (5 convs + ELU, linear, abs; float64 in CV3 as upstream, weight norm
folded in float64 too) -> F0 upsampled
x480 -> sine source (``SineGen2``: 9 harmonics, phase from the per-frame cumulative sum, voiced where
F0 > 10 Hz, additive noise; the per-frame phase is resampled to samples linearly in CV2 but with
'nearest' in CV3, so CV3's sines hold one value per frame, exactly as upstream) merged by
``tanh(linear)`` -> STFT(16, hop 4) of the source, fused at each
upsampling stage [8, 5, 3] through strided convs + Snake residual blocks -> ``conv_post`` -> magnitude
``exp`` / phase ``sin`` -> iSTFT -> clamp to +-0.99.

Randomness: upstream draws the source noise from the global RNG (CV2: Gaussian per call; CV3: a uniform
[0, 1) buffer fixed at construction). Here it comes from the caller's ``torch.Generator``, drawn in fixed
one-second blocks, so a seed gives the same audio and a prefix gets the same noise. Upstream's random
initial phase of the harmonics is not drawn: its own linear x1/480 resampling never reads the sample it
is added to, so it has no effect on the output.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specli.tts.acoustic.checkpoint import fold_weight_norm, load_strict, read_state_dict, strip_prefix
from specli.models.cosyvoice.layout import ModelKind

__all__ = ["HiFT", "HiFTConfig", "load_hift"]

_NOISE_BLOCK = 24000  # samples of source noise drawn per generator call (prefix-stable blocks)
_F0_LOOKAHEAD_KERNEL = 4  # CausalConvRNNF0Predictor's first conv: kernel 4, right-padded (3 frames ahead)


@dataclass(frozen=True)
class HiFTConfig:
    """HiFT generator shape (the yaml's ``hift:`` arguments); defaults are CosyVoice2/3's."""

    causal: bool  # CosyVoice3 CausalHiFTGenerator (True) or CosyVoice2 HiFTGenerator (False)
    in_channels: int = 80  # mel bins
    base_channels: int = 512  # channels after conv_pre; halved at each upsampling stage
    nb_harmonics: int = 8  # harmonics above F0 in the sine source
    sampling_rate: int = 24000  # output rate (22050 would be CosyVoice1's other sine generator)
    nsf_alpha: float = 0.1  # sine amplitude
    nsf_sigma: float = 0.003  # noise std in voiced regions
    nsf_voiced_threshold: float = 10.0  # F0 (Hz) above which a sample is voiced
    upsample_rates: tuple[int, ...] = (8, 5, 3)  # per-stage upsampling of the mel frame rate
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)  # per-stage upsampling kernels
    n_fft: int = 16  # iSTFT size
    hop_len: int = 4  # iSTFT hop
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)  # residual blocks averaged at each stage
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))  # their dilations
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)  # one source residual block per stage
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))  # dilations
    lrelu_slope: float = 0.1  # leaky ReLU slope before each upsampling
    audio_limit: float = 0.99  # output clamp
    conv_pre_look_right: int = 4  # causal only: frames conv_pre looks ahead
    f0_cond_channels: int = 512  # F0 predictor width
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # unread yaml keys

    def __post_init__(self) -> None:
        stages = len(self.upsample_rates)
        if stages == 0 or len(self.upsample_kernel_sizes) != stages:
            raise ValueError("upsample_rates and upsample_kernel_sizes must be non-empty and equally long")
        if len(self.source_resblock_kernel_sizes) != stages or len(self.source_resblock_dilation_sizes) != stages:
            raise ValueError("one source residual block per upsampling stage is needed")
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilation_sizes):
            raise ValueError("resblock kernel and dilation lists differ in length")
        if self.base_channels % (2 ** stages) or self.base_channels < 2 ** stages:
            raise ValueError(f"base_channels must be a positive multiple of {2 ** stages}")
        if self.sampling_rate == 22050:
            raise ValueError("sampling_rate 22050 selects CosyVoice1's sine generator, which is not ported")
        if min(self.upsample_rates) < 1 or self.n_fft < 2 or self.hop_len < 1 or self.conv_pre_look_right < 0:
            raise ValueError("rates, n_fft, hop_len must be positive and conv_pre_look_right >= 0")
        for rate, kernel in zip(self.upsample_rates, self.upsample_kernel_sizes):
            if (kernel - rate) % 2 and not self.causal:
                raise ValueError(f"upsampling kernel {kernel} and rate {rate} must differ by an even number")

    @classmethod
    def for_kind(cls, kind: ModelKind) -> HiFTConfig:
        """The published configuration of ``cosyvoice2`` or ``cosyvoice3``."""
        if kind not in ("cosyvoice2", "cosyvoice3"):
            raise ValueError(f"unknown CosyVoice kind {kind!r}")
        return cls(causal=kind == "cosyvoice3")

    @classmethod
    def from_yaml_node(cls, node: Any) -> HiFTConfig:
        """From the ``hift`` entry of :func:`specli.models.cosyvoice.yaml.read_hyperpyyaml`."""
        target = str(getattr(node, "target", ""))
        value = getattr(node, "value", None)
        if not isinstance(value, dict) or not target.endswith("HiFTGenerator"):
            raise ValueError(f"the yaml's hift entry is not a HiFTGenerator (got {target or type(node).__name__})")
        args = dict(value)
        f0 = args.pop("f0_predictor", None)
        istft = args.pop("istft_params", {}) or {}
        kwargs: dict[str, Any] = {"causal": target.endswith("CausalHiFTGenerator")}
        for name in ("in_channels", "base_channels", "nb_harmonics", "sampling_rate", "nsf_alpha", "nsf_sigma",
                     "nsf_voiced_threshold", "lrelu_slope", "audio_limit", "conv_pre_look_right"):
            if name in args:
                kwargs[name] = args.pop(name)
        for name in ("upsample_rates", "upsample_kernel_sizes", "resblock_kernel_sizes",
                     "source_resblock_kernel_sizes"):
            if name in args:
                kwargs[name] = tuple(args.pop(name))
        for name in ("resblock_dilation_sizes", "source_resblock_dilation_sizes"):
            if name in args:
                kwargs[name] = tuple(tuple(d) for d in args.pop(name))
        kwargs["n_fft"] = istft.get("n_fft", 16)
        kwargs["hop_len"] = istft.get("hop_len", 4)
        if f0 is not None and hasattr(f0, "get"):
            kwargs["f0_cond_channels"] = f0.get("cond_channels", 512)
        return cls(**kwargs, extra=args)

    @property
    def samples_per_frame(self) -> int:
        """Output samples per mel frame (480 at 24 kHz)."""
        return math.prod(self.upsample_rates) * self.hop_len

    @property
    def held_back_frames(self) -> int:
        """Causal ``finalize=False``: mel frames at the end whose audio is not produced yet (3 + 4 + 1)."""
        return _F0_LOOKAHEAD_KERNEL - 1 + self.conv_pre_look_right + 1


class _Conv(nn.Conv1d):
    """Conv1d with explicit (left, right) zero padding; ``lookahead=False`` drops the right padding."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1,
                 pad: tuple[int, int] = (0, 0)) -> None:
        super().__init__(cin, cout, kernel, stride=stride, dilation=dilation)
        self.pad = pad

    def forward(self, x: torch.Tensor, lookahead: bool = True) -> torch.Tensor:  # [B, C, T]
        left, right = self.pad
        return super().forward(F.pad(x, (left, right if lookahead else 0)))


def _same(cin: int, cout: int, kernel: int, dilation: int = 1) -> _Conv:
    pad = (kernel * dilation - dilation) // 2
    return _Conv(cin, cout, kernel, dilation=dilation, pad=(pad, pad))


def _causal(cin: int, cout: int, kernel: int, dilation: int = 1, look_ahead: bool = False) -> _Conv:
    pad = (kernel - 1) * dilation
    return _Conv(cin, cout, kernel, dilation=dilation, pad=(0, pad) if look_ahead else (pad, 0))


class _CausalUpsample(nn.Conv1d):
    """Nearest-neighbour upsampling by ``rate`` then a left-padded conv (CV3 ``CausalConv1dUpsample``)."""

    def __init__(self, cin: int, cout: int, kernel: int, rate: int) -> None:
        super().__init__(cin, cout, kernel)
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T] -> [B, C', T * rate]
        x = torch.repeat_interleave(x, self.rate, dim=2)
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class _Snake(nn.Module):
    """Snake activation ``x + sin(alpha x)^2 / alpha`` with a learned per-channel alpha."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        alpha = self.alpha[None, :, None]
        return x + (1.0 / (alpha + 1e-9)) * torch.sin(x * alpha).pow(2)


class _ResBlock(nn.Module):
    """HiFi-GAN/BigVGAN residual block: per dilation, Snake -> dilated conv -> Snake -> conv, residual."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...], causal: bool) -> None:
        super().__init__()
        conv = _causal if causal else _same
        self.convs1 = nn.ModuleList(conv(channels, channels, kernel, d) for d in dilations)
        self.convs2 = nn.ModuleList(conv(channels, channels, kernel, 1) for _ in dilations)
        self.activations1 = nn.ModuleList(_Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(_Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        for conv1, conv2, act1, act2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = x + conv2(act2(conv1(act1(x))))
        return x


class _F0Predictor(nn.Module):
    """``ConvRNNF0Predictor`` / ``CausalConvRNNF0Predictor``: 5 convs with ELU, a linear layer, abs."""

    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__()
        c, layers = cfg.f0_cond_channels, []
        for i in range(5):
            cin = cfg.in_channels if i == 0 else c
            if not cfg.causal:
                layers.append(_same(cin, c, 3))
            elif i == 0:
                layers.append(_causal(cin, c, _F0_LOOKAHEAD_KERNEL, look_ahead=True))
            else:
                layers.append(_causal(cin, c, 3))
            layers.append(nn.ELU())
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, 1)

    def forward(self, mel: torch.Tensor, finalize: bool = True) -> torch.Tensor:  # [B, 80, T] -> [B, T']
        x = self.condnet[0](mel, lookahead=finalize)
        for layer in self.condnet[1:]:
            x = layer(x)
        return self.classifier(x.transpose(1, 2)).squeeze(-1).abs()


class _Source(nn.Module):
    """``SourceModuleHnNSF`` with ``SineGen2``: harmonic sines (+ noise) merged by ``tanh(l_linear)``."""

    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.l_linear = nn.Linear(cfg.nb_harmonics + 1, 1)

    def forward(self, f0: torch.Tensor, generator: torch.Generator) -> torch.Tensor:  # [B, T] -> [B, 1, T * 480]
        cfg, scale = self.cfg, self.cfg.samples_per_frame
        harmonics = torch.arange(1, cfg.nb_harmonics + 2, device=f0.device, dtype=f0.dtype)
        rad = (f0[:, :, None] * harmonics / cfg.sampling_rate) % 1  # [B, T, H] cycles per sample, per frame
        phase = torch.cumsum(rad, dim=1) * 2 * math.pi  # x scale below: the phase reached at each frame's end
        mode = "nearest" if cfg.causal else "linear"  # CV3: one phase per frame (upstream's choice, kept)
        phase = F.interpolate(phase.transpose(1, 2) * scale, scale_factor=scale, mode=mode).transpose(1, 2)
        sines = torch.sin(phase) * cfg.nsf_alpha  # [B, L, H]
        uv = (torch.repeat_interleave(f0, scale, dim=1) > cfg.nsf_voiced_threshold).to(f0.dtype)[:, :, None]
        noise_amp = uv * cfg.nsf_sigma + (1 - uv) * cfg.nsf_alpha / 3
        noise = _draw_noise(sines.shape, generator, gaussian=not cfg.causal).to(sines)
        excitation = sines * uv + noise_amp * noise
        return torch.tanh(self.l_linear(excitation)).transpose(1, 2)


def _draw_noise(shape: torch.Size, generator: torch.Generator, gaussian: bool) -> torch.Tensor:
    """Noise ``shape`` = [B, L, H] drawn in fixed blocks of samples, so a shorter L gets a prefix of it."""
    batch, length, width = shape
    blocks = -(-length // _NOISE_BLOCK)
    draw = torch.randn if gaussian else torch.rand  # CV2: randn_like; CV3: a fixed torch.rand buffer
    parts = [draw(batch, _NOISE_BLOCK, width, generator=generator, device=generator.device) for _ in range(blocks)]
    if not parts:
        return torch.zeros(batch, 0, width, device=generator.device)
    return torch.cat(parts, dim=1)[:, :length]


class HiFT(nn.Module):
    """The HiFT generator; module names follow upstream so ``hift.pt`` keys load one to one."""

    source = None  # the Vocoder protocol's weights file: None, the model directory's hift.pt (pipeline.vocoder_file)

    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        base, causal, stages = cfg.base_channels, cfg.causal, len(cfg.upsample_rates)
        self.m_source = _Source(cfg)
        if causal:
            self.conv_pre = _causal(cfg.in_channels, base, cfg.conv_pre_look_right + 1, look_ahead=True)
        else:
            self.conv_pre = _same(cfg.in_channels, base, 7)
        self.ups = nn.ModuleList()
        for i, (rate, kernel) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes)):
            cin, cout = base // 2**i, base // 2 ** (i + 1)
            self.ups.append(_CausalUpsample(cin, cout, kernel, rate) if causal
                            else nn.ConvTranspose1d(cin, cout, kernel, rate, padding=(kernel - rate) // 2))
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        spec_channels = cfg.n_fft + 2
        down_rates = [math.prod(cfg.upsample_rates[i + 1:]) for i in range(stages)]  # [15, 3, 1]
        for i, (rate, kernel, dil) in enumerate(zip(down_rates, cfg.source_resblock_kernel_sizes,
                                                    cfg.source_resblock_dilation_sizes)):
            cout = base // 2 ** (i + 1)
            if rate == 1:
                self.source_downs.append(_Conv(spec_channels, cout, 1))
            else:
                pad = (rate - 1, 0) if causal else (rate // 2, rate // 2)
                self.source_downs.append(_Conv(spec_channels, cout, rate * 2, stride=rate, pad=pad))
            self.source_resblocks.append(_ResBlock(cout, kernel, tuple(dil), causal))
        self.resblocks = nn.ModuleList()
        for i in range(stages):
            for kernel, dil in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes):
                self.resblocks.append(_ResBlock(base // 2 ** (i + 1), kernel, tuple(dil), causal))
        last = base // 2**stages
        self.conv_post = _causal(last, spec_channels, 7) if causal else _same(last, spec_channels, 7)
        self.f0_predictor = _F0Predictor(cfg)
        # upstream: scipy's get_window("hann", n_fft, fftbins=True) (float64) cast to float32
        self.register_buffer("stft_window", torch.hann_window(cfg.n_fft, dtype=torch.float64).float(),
                             persistent=False)

    @property
    def sample_rate(self) -> int:
        return self.cfg.sampling_rate

    def _stft(self, source: torch.Tensor) -> torch.Tensor:  # [B, 1, L] -> [B, n_fft + 2, L / hop + 1]
        cfg = self.cfg
        spec = torch.stft(source[:, 0].float(), cfg.n_fft, cfg.hop_len, cfg.n_fft, window=self.stft_window,
                          return_complex=True)
        return torch.cat([spec.real, spec.imag], dim=1)

    def _istft(self, x: torch.Tensor) -> torch.Tensor:  # [B, n_fft + 2, F] -> [B, (F - 1) * hop]
        cfg, bins = self.cfg, self.cfg.n_fft // 2 + 1
        x = x.float()  # under bf16 autocast the convolutions' output: the spectrum is built in float32
        magnitude = torch.clamp(torch.exp(x[:, :bins]), max=1e2)
        phase = torch.sin(x[:, bins:])  # upstream's (redundant) sin
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        return torch.istft(spec, cfg.n_fft, cfg.hop_len, cfg.n_fft, window=self.stft_window)

    def _decode(self, mel: torch.Tensor, source: torch.Tensor, finalize: bool) -> torch.Tensor:
        cfg = self.cfg
        spec = self._stft(source)
        if finalize or not cfg.causal:
            x = self.conv_pre(mel)
        else:
            x = self.conv_pre(mel, lookahead=False)
            spec = spec[:, :, : spec.shape[2] - math.prod(cfg.upsample_rates) * cfg.conv_pre_look_right]
        kernels = len(cfg.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, cfg.lrelu_slope))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](spec))
            x = sum(self.resblocks[i * kernels + j](x) for j in range(kernels)) / kernels
        audio = self._istft(self.conv_post(F.leaky_relu(x)))
        if not finalize:
            audio = audio[:, : audio.shape[1] - cfg.samples_per_frame]
        return torch.clamp(audio, -cfg.audio_limit, cfg.audio_limit)

    @torch.inference_mode()
    def vocode(self, mel: torch.Tensor, generator: torch.Generator, finalize: bool = True) -> torch.Tensor:
        """Audio ``[B, T * 480]`` of ``mel [B, 80, T]``; ``finalize=False`` (causal only): ``[B, (T - 8) * 480]``.

        The output is float32 in [-0.99, 0.99] at :attr:`sample_rate`. ``generator`` supplies the source
        noise (same seed, same audio). With ``finalize=False`` the last :attr:`HiFTConfig.held_back_frames`
        frames only serve as look-ahead, and the result is a prefix of the audio of any longer mel.
        """
        cfg = self.cfg
        if mel.dim() != 3 or mel.shape[1] != cfg.in_channels:
            raise ValueError(f"mel must be [batch, {cfg.in_channels}, frames], got {tuple(mel.shape)}")
        if not finalize and not cfg.causal:
            raise ValueError("finalize=False needs the causal (CosyVoice3) HiFT")
        min_frames = 1 if finalize else cfg.held_back_frames + 1
        if mel.shape[2] < min_frames:
            raise ValueError(f"need at least {min_frames} mel frames, got {mel.shape[2]}")
        weight = self.conv_pre.weight
        mel = mel.to(device=weight.device, dtype=weight.dtype)
        f0_dtype = self.f0_predictor.classifier.weight.dtype  # float64 in CV3 (upstream: precision matters)
        with torch.autocast(mel.device.type, enabled=False):  # bf16 autocast: the f0 and the source stay exact
            f0 = self.f0_predictor(mel.to(f0_dtype), finalize=finalize).to(weight.dtype)  # [B, T']
            source = self.m_source(f0, generator)
        return self._decode(mel[:, :, : f0.shape[1]], source, finalize)


def load_hift(path: str | os.PathLike[str], config: HiFTConfig | ModelKind,
              device: torch.device | str = "cpu") -> HiFT:
    """Load ``hift.pt`` strictly (see :mod:`specli.tts.acoustic.checkpoint`) into an eval-mode :class:`HiFT`."""
    cfg = HiFTConfig.for_kind(config) if isinstance(config, str) else config
    raw = strip_prefix(read_state_dict(path), "generator.")
    model = HiFT(cfg)
    load_strict(model, fold_weight_norm(raw, path), path)
    if cfg.causal:
        model.f0_predictor.double()
        with torch.no_grad():
            for key, weight in _fold_f0_predictor_float64(raw).items():
                model.get_parameter(key).copy_(weight)
    model.eval().requires_grad_(False).to(device)
    return model


_WEIGHT_NORM_KEYS = ((".weight_g", ".weight_v"),
                     (".parametrizations.weight.original0", ".parametrizations.weight.original1"))


def _fold_f0_predictor_float64(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CV3: the F0 predictor's weight-normed conv weights ``g * v / ||v||`` computed in float64.

    Upstream moves the still weight-norm-parametrized predictor to float64 before use, so its weights are
    folded in float64; folding in float32 first moves F0 by ~1e-10 relative, enough to flip the float32
    rounding of some frames' F0, which the x480 phase cumsum turns into ~1e-4 of audio. Pairs are already
    checked by :func:`fold_weight_norm`; only the predictor's are refolded here."""
    out: dict[str, torch.Tensor] = {}
    for key in state:
        for g_suffix, v_suffix in _WEIGHT_NORM_KEYS:
            layer = key.removesuffix(g_suffix)
            if key.startswith("f0_predictor.") and key.endswith(g_suffix) and layer + v_suffix in state:
                g, v = state[key].double(), state[layer + v_suffix].double()  # [Cout, 1, 1], [Cout, Cin, K]
                norm = v.flatten(1).norm(dim=1).reshape(-1, *([1] * (v.dim() - 1)))
                out[layer + ".weight"] = v * (g.reshape(norm.shape) / norm)
    return out

