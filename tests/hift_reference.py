"""A readable transcription of CosyVoice's HiFT vocoder inference, in plain torch, for reference tests.

Transcribed (not imported: upstream is not a package and needs torchaudio/scipy) from FunAudioLLM/CosyVoice
at commit ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40:

- ``cosyvoice/hifigan/f0_predictor.py``: ``ConvRNNF0Predictor`` (CosyVoice2), ``CausalConvRNNF0Predictor`` (3)
- ``cosyvoice/hifigan/generator.py``: ``ResBlock``, ``SineGen2``, ``SourceModuleHnNSF``, ``HiFTGenerator``
  (``_stft``, ``_istft``, ``decode``, ``inference``) and ``CausalHiFTGenerator`` (``decode``, ``inference``)
- ``cosyvoice/transformer/convolution.py``: ``CausalConv1d``, ``CausalConv1dDownSample``,
  ``CausalConv1dUpsample``; ``cosyvoice/transformer/activation.py``: ``Snake``;
  ``cosyvoice/utils/common.py``: ``get_padding``

It is deliberately written apart from ``specli.tts.acoustic.hift`` (functional code over the raw state dict,
upstream's operation order, upstream's names) so that a test comparing the two compares two readings of
upstream. The only departures from upstream, all to make a comparison deterministic or dependency-free:

- the random tensors are arguments: ``noise`` [B, L, H] is what ``SineGen2`` multiplies by ``noise_amp``
  (CosyVoice2: ``torch.randn_like``; CosyVoice3: its fixed ``torch.rand`` buffer ``sine_waves[:, :L]``),
  and ``rand_ini`` [B, H] is the random initial phase added to the first sample (CosyVoice2: a fresh
  ``torch.rand``; CosyVoice3: its fixed ``rand_ini`` buffer; upstream zeroes column 0 in both);
- numpy/scipy are replaced by torch (``np.prod``, ``np.pi``, ``scipy.signal.get_window``);
- weight norm: upstream keeps ``weight_norm`` parametrizations at inference (``CosyVoiceModel.load`` only
  calls ``load_state_dict``), so each weight is ``torch._weight_norm(v, g, 0)`` computed in the dtype the
  module runs in (float64 for CosyVoice3's F0 predictor, which upstream moves to float64 before use).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["UpstreamHiFTArgs", "UpstreamWeights", "decode", "f0_predictor", "forward_module", "hann_window",
           "inference", "resblock", "snake", "source_from_f0", "source_module"]

Trace = dict[str, torch.Tensor]


@dataclass(frozen=True)
class UpstreamHiFTArgs:
    """``HiFTGenerator`` / ``CausalHiFTGenerator`` constructor arguments (the yaml's ``hift:`` node); the
    defaults are ``examples/libritts/cosyvoice{2,3}/conf/cosyvoice{2,3}.yaml``'s. Channel counts are read
    from the weights."""

    causal: bool  # CausalHiFTGenerator + CausalConvRNNF0Predictor (CosyVoice3)
    sampling_rate: int = 24000
    nb_harmonics: int = 8
    nsf_alpha: float = 0.1  # SineGen2.sine_amp
    nsf_sigma: float = 0.003  # SineGen2.noise_std
    nsf_voiced_threshold: float = 10
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    n_fft: int = 16  # istft_params["n_fft"]
    hop_len: int = 4  # istft_params["hop_len"]
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    conv_pre_look_right: int = 4  # CausalHiFTGenerator only

    @property
    def upsample_scale(self) -> int:
        """``np.prod(upsample_rates) * istft_params["hop_len"]``: samples per mel frame (480)."""
        return math.prod(self.upsample_rates) * self.hop_len


class UpstreamWeights:
    """A ``hift.pt`` state dict read as upstream's loaded modules see it (``generator.`` prefix dropped as
    ``CosyVoiceModel.load`` does; ``weight_g``/``weight_v`` are what torch's compat hook loads into
    ``parametrizations.weight.original0``/``original1``)."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = {k.replace("generator.", ""): v.float() for k, v in state.items()}  # float32 modules
        self._folded: dict[tuple[str, torch.dtype], torch.Tensor] = {}  # what every forward would recompute

    def weight(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """``name.weight`` as the module computes it in ``dtype`` (weight norm: ``torch._weight_norm``)."""
        s = self.state
        if f"{name}.weight" in s:
            return s[f"{name}.weight"].to(dtype)
        if f"{name}.weight_g" in s:
            g, v = s[f"{name}.weight_g"], s[f"{name}.weight_v"]
        else:
            g = s[f"{name}.parametrizations.weight.original0"]
            v = s[f"{name}.parametrizations.weight.original1"]
        if (name, dtype) not in self._folded:  # torch.nn.utils.parametrizations._WeightNorm.forward
            self._folded[name, dtype] = torch._weight_norm(v.to(dtype), g.to(dtype), 0)
        return self._folded[name, dtype]

    def bias(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        return self.state[f"{name}.bias"].to(dtype)

    def param(self, key: str, dtype: torch.dtype) -> torch.Tensor:
        return self.state[key].to(dtype)


# --- convolutions (torch.nn.Conv1d / ConvTranspose1d and cosyvoice/transformer/convolution.py) ------------


def conv1d(w: UpstreamWeights, name: str, x: torch.Tensor, stride: int = 1, padding: int = 0,
           dilation: int = 1) -> torch.Tensor:  # [B, Cin, T] -> [B, Cout, T']
    """``weight_norm(nn.Conv1d(...))`` with zero ``padding`` on both sides."""
    return F.conv1d(x, w.weight(name, x.dtype), w.bias(name, x.dtype), stride, padding, dilation)


def causal_padding(kernel: int, dilation: int = 1) -> int:
    """``CausalConv1d.causal_padding``: ``int((k * d - d) / 2) * 2 + (k + 1) % 2``."""
    return int((kernel * dilation - dilation) / 2) * 2 + (kernel + 1) % 2


def causal_conv1d(w: UpstreamWeights, name: str, x: torch.Tensor, dilation: int = 1, causal_type: str = "left",
                  cache: torch.Tensor | None = None) -> torch.Tensor:  # [B, Cin, T] -> [B, Cout, T]
    """``CausalConv1d.forward``: ``cache`` (zeros when absent) concatenated left or right, then a plain conv."""
    pad = causal_padding(_kernel(w, name), dilation)
    if cache is None:
        cache = torch.zeros(x.shape[0], x.shape[1], pad).to(x)
    x = torch.concat([cache, x], dim=2) if causal_type == "left" else torch.concat([x, cache], dim=2)
    return conv1d(w, name, x, dilation=dilation)


def _kernel(w: UpstreamWeights, name: str) -> int:
    for suffix in (".weight", ".weight_v", ".parametrizations.weight.original1"):
        if name + suffix in w.state:
            return int(w.state[name + suffix].shape[-1])
    raise KeyError(name)


def causal_downsample(w: UpstreamWeights, name: str, x: torch.Tensor, stride: int) -> torch.Tensor:
    """``CausalConv1dDownSample.forward``: left zero pad ``stride - 1``, strided conv."""  # [B, C, T] -> [B, C', T / s]
    x = F.pad(x, (stride - 1, 0), value=0.0)
    return conv1d(w, name, x, stride=stride)


def causal_upsample(w: UpstreamWeights, name: str, x: torch.Tensor, rate: int) -> torch.Tensor:
    """``CausalConv1dUpsample.forward``: ``nn.Upsample(nearest)``, left zero pad ``k - 1``, conv."""
    x = F.interpolate(x, scale_factor=rate, mode="nearest")  # [B, C, T * rate]
    x = F.pad(x, (_kernel(w, name) - 1, 0), value=0.0)
    return conv1d(w, name, x)


# --- Snake, ResBlock ----------------------------------------------------------------------------------------


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:  # [B, C, T], alpha [C]
    """``Snake.forward`` (alpha_logscale=False): ``x + 1 / (alpha + 1e-9) * sin(x * alpha) ** 2``."""
    alpha = alpha.unsqueeze(0).unsqueeze(-1)
    return x + (1.0 / (alpha + 0.000000001)) * pow(torch.sin(x * alpha), 2)


def resblock(w: UpstreamWeights, name: str, x: torch.Tensor, dilations: tuple[int, ...],
             causal: bool) -> torch.Tensor:  # [B, C, T]
    """``ResBlock.forward``: per dilation Snake -> conv (dilated) -> Snake -> conv, added to ``x``."""
    kernel = _kernel(w, f"{name}.convs1.0")
    for idx, dilation in enumerate(dilations):
        xt = snake(x, w.param(f"{name}.activations1.{idx}.alpha", x.dtype))
        if causal:
            xt = causal_conv1d(w, f"{name}.convs1.{idx}", xt, dilation=dilation)
        else:  # get_padding(kernel, dilation)
            xt = conv1d(w, f"{name}.convs1.{idx}", xt, padding=int((kernel * dilation - dilation) / 2),
                        dilation=dilation)
        xt = snake(xt, w.param(f"{name}.activations2.{idx}.alpha", x.dtype))
        if causal:
            xt = causal_conv1d(w, f"{name}.convs2.{idx}", xt)
        else:
            xt = conv1d(w, f"{name}.convs2.{idx}", xt, padding=int((kernel - 1) / 2))
        x = xt + x
    return x


# --- F0 predictor ---------------------------------------------------------------------------------------------


def f0_predictor(w: UpstreamWeights, mel: torch.Tensor, causal: bool, finalize: bool = True) -> torch.Tensor:
    """``ConvRNNF0Predictor.forward`` / ``CausalConvRNNF0Predictor.forward``; runs in ``mel.dtype``.

    mel [B, 80, T] -> F0 [B, T] (CosyVoice3 with ``finalize=False``: [B, T - 3], the first conv's
    look-ahead taken from the last 3 frames instead of zeros)."""
    x = mel
    for i in range(5):
        name = f"f0_predictor.condnet.{2 * i}"
        if not causal:
            x = conv1d(w, name, x, padding=1)
        elif i > 0:
            x = causal_conv1d(w, name, x, causal_type="left")
        elif finalize:
            x = causal_conv1d(w, name, x, causal_type="right")
        else:
            pad = causal_padding(_kernel(w, name))
            x = causal_conv1d(w, name, x[:, :, :-pad], causal_type="right", cache=x[:, :, -pad:])
        x = F.elu(x)  # nn.ELU()
    x = x.transpose(1, 2)
    out = F.linear(x, w.param("f0_predictor.classifier.weight", x.dtype), w.bias("f0_predictor.classifier", x.dtype))
    return torch.abs(out.squeeze(-1))


# --- SineGen2 + SourceModuleHnNSF -----------------------------------------------------------------------------


def _f02sine(f0_values: torch.Tensor, rand_ini: torch.Tensor, args: UpstreamHiFTArgs) -> torch.Tensor:
    """``SineGen2._f02sine`` (flag_for_pulse=False): f0_values [B, L, H] (per sample) -> sines [B, L, H]."""
    rad_values = (f0_values / args.sampling_rate) % 1
    rad_values[:, 0, :] = rad_values[:, 0, :] + rand_ini  # initial phase noise (no noise for the fundamental)
    scale = args.upsample_scale
    rad_values = F.interpolate(rad_values.transpose(1, 2), scale_factor=1 / scale, mode="linear").transpose(1, 2)
    phase = torch.cumsum(rad_values, dim=1) * 2 * math.pi  # [B, T, H] at the frame rate
    mode = "nearest" if args.causal else "linear"
    phase = F.interpolate(phase.transpose(1, 2) * scale, scale_factor=scale, mode=mode).transpose(1, 2)
    return torch.sin(phase)


def sine_gen2(f0: torch.Tensor, noise: torch.Tensor, rand_ini: torch.Tensor,
              args: UpstreamHiFTArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """``SineGen2.forward``: f0 [B, L, 1] per sample -> (sine_waves [B, L, H], uv [B, L, 1]).

    ``noise`` [B, L, H] stands for ``torch.randn_like(sine_waves)`` (CosyVoice2) or the fixed uniform buffer
    ``self.sine_waves[:, :L]`` (CosyVoice3)."""
    harmonics = torch.tensor([[list(range(1, args.nb_harmonics + 2))]], dtype=torch.float32)  # FloatTensor
    fn = torch.multiply(f0, harmonics.to(f0.device))
    sine_waves = _f02sine(fn, rand_ini, args) * args.nsf_alpha
    uv = (f0 > args.nsf_voiced_threshold).type(torch.float32)  # _f02uv
    noise_amp = uv * args.nsf_sigma + (1 - uv) * args.nsf_alpha / 3
    noise = noise_amp * noise
    sine_waves = sine_waves * uv + noise
    return sine_waves, uv


def source_module(w: UpstreamWeights, f0: torch.Tensor, noise: torch.Tensor, rand_ini: torch.Tensor,
                  args: UpstreamHiFTArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """``SourceModuleHnNSF.forward`` (its unused noise branch left out): f0 [B, L, 1] ->
    (sine_merge [B, L, 1], the harmonics + noise it merged [B, L, H])."""
    sine_wavs, _ = sine_gen2(f0, noise, rand_ini, args)
    merged = F.linear(sine_wavs, w.param("m_source.l_linear.weight", sine_wavs.dtype),
                      w.bias("m_source.l_linear", sine_wavs.dtype))
    return torch.tanh(merged), sine_wavs


# --- STFT / iSTFT -------------------------------------------------------------------------------------------


def hann_window(n_fft: int) -> torch.Tensor:
    """``scipy.signal.get_window("hann", n_fft, fftbins=True).astype(np.float32)``: scipy's
    ``general_cosine`` over ``linspace(-pi, pi, n_fft + 1)`` (periodic: last point dropped), in float64."""
    fac = torch.linspace(-math.pi, math.pi, n_fft + 1, dtype=torch.float64)
    window = torch.zeros(n_fft + 1, dtype=torch.float64)
    for k, a in enumerate((0.5, 0.5)):  # general_hamming(alpha=0.5) = general_cosine([alpha, 1 - alpha])
        window += a * torch.cos(k * fac)
    return window[:n_fft].to(torch.float32)


def stft(x: torch.Tensor, args: UpstreamHiFTArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """``HiFTGenerator._stft``: x [B, L] -> (real, imag) [B, n_fft / 2 + 1, L / hop + 1]."""
    spec = torch.stft(x, args.n_fft, args.hop_len, args.n_fft, window=hann_window(args.n_fft).to(x.device),
                      return_complex=True)
    spec = torch.view_as_real(spec)  # [B, F, TT, 2]
    return spec[..., 0], spec[..., 1]


def istft(magnitude: torch.Tensor, phase: torch.Tensor, args: UpstreamHiFTArgs) -> torch.Tensor:
    """``HiFTGenerator._istft``: [B, n_fft / 2 + 1, F] twice -> [B, (F - 1) * hop]."""
    magnitude = torch.clip(magnitude, max=1e2)
    real = magnitude * torch.cos(phase)
    img = magnitude * torch.sin(phase)
    return torch.istft(torch.complex(real, img), args.n_fft, args.hop_len, args.n_fft,
                       window=hann_window(args.n_fft).to(magnitude.device))


# --- the generator's modules -------------------------------------------------------------------------------


def conv_pre(w: UpstreamWeights, mel: torch.Tensor, args: UpstreamHiFTArgs, finalize: bool = True) -> torch.Tensor:
    """``self.conv_pre``: CosyVoice2 ``Conv1d(k=7, padding=3)``; CosyVoice3 ``CausalConv1d(k=look_right + 1,
    causal_type='right')``, fed ``(x[..., :-look_right], x[..., -look_right:])`` when not finalizing."""
    if not args.causal:
        return conv1d(w, "conv_pre", mel, padding=3)  # [B, 80, T] -> [B, base, T]
    if finalize:
        return causal_conv1d(w, "conv_pre", mel, causal_type="right")
    right = args.conv_pre_look_right  # [B, 80, T] -> [B, base, T - right]
    return causal_conv1d(w, "conv_pre", mel[:, :, :-right], causal_type="right", cache=mel[:, :, -right:])


def upsample(w: UpstreamWeights, i: int, x: torch.Tensor, args: UpstreamHiFTArgs) -> torch.Tensor:
    """``self.ups[i]``: CosyVoice2 ``ConvTranspose1d(k, u, padding=(k - u) // 2)``; CosyVoice3
    ``CausalConv1dUpsample(k, u)``."""  # [B, C, T] -> [B, C / 2, T * u]
    rate, kernel = args.upsample_rates[i], args.upsample_kernel_sizes[i]
    if args.causal:
        return causal_upsample(w, f"ups.{i}", x, rate)
    return F.conv_transpose1d(x, w.weight(f"ups.{i}", x.dtype), w.bias(f"ups.{i}", x.dtype), stride=rate,
                              padding=(kernel - rate) // 2)


def source_down(w: UpstreamWeights, i: int, s_stft: torch.Tensor, args: UpstreamHiFTArgs) -> torch.Tensor:
    """``self.source_downs[i]``, u = ``np.cumprod([1] + upsample_rates[::-1][:-1])[::-1][i]``: a 1x1 conv when
    u == 1, else CosyVoice2 ``Conv1d(2u, stride u, padding u // 2)`` / CosyVoice3 ``CausalConv1dDownSample``."""
    u = math.prod(args.upsample_rates[i + 1:])  # [B, n_fft + 2, F] -> [B, C_i, F / u]
    name = f"source_downs.{i}"
    if u == 1:
        return causal_conv1d(w, name, s_stft) if args.causal else conv1d(w, name, s_stft)
    if args.causal:
        return causal_downsample(w, name, s_stft, u)
    return conv1d(w, name, s_stft, stride=u, padding=u // 2)


def conv_post(w: UpstreamWeights, x: torch.Tensor, args: UpstreamHiFTArgs) -> torch.Tensor:
    """``self.conv_post``: ``Conv1d(k=7, padding=3)`` / ``CausalConv1d(k=7, causal_type='left')``."""
    return causal_conv1d(w, "conv_post", x) if args.causal else conv1d(w, "conv_post", x, padding=3)


def forward_module(w: UpstreamWeights, name: str, x: torch.Tensor, args: UpstreamHiFTArgs,
                   finalize: bool = True) -> torch.Tensor:
    """The upstream submodule called ``name`` (``conv_pre``, ``ups.i``, ``source_downs.i``,
    ``source_resblocks.i``, ``resblocks.n``, ``conv_post``) applied to ``x``."""
    kind, _, index = name.partition(".")
    if name == "conv_pre":
        return conv_pre(w, x, args, finalize)
    if name == "conv_post":
        return conv_post(w, x, args)
    if kind == "ups":
        return upsample(w, int(index), x, args)
    if kind == "source_downs":
        return source_down(w, int(index), x, args)
    if kind == "source_resblocks":
        return resblock(w, name, x, args.source_resblock_dilation_sizes[int(index)], args.causal)
    if kind == "resblocks":
        dilations = args.resblock_dilation_sizes[int(index) % len(args.resblock_kernel_sizes)]
        return resblock(w, name, x, dilations, args.causal)
    raise KeyError(name)


# --- the generator's decode / inference ---------------------------------------------------------------------


def _stages(w: UpstreamWeights, x: torch.Tensor, s_stft: torch.Tensor, args: UpstreamHiFTArgs,
            trace: Trace) -> torch.Tensor:  # [B, base, T] -> [B, base / 2 ** stages, T * prod(rates) + 1]
    """The upsampling loop, the same in ``HiFTGenerator.decode`` and ``CausalHiFTGenerator.decode``."""
    num_kernels = len(args.resblock_kernel_sizes)
    for i in range(len(args.upsample_rates)):
        x = F.leaky_relu(x, args.lrelu_slope)
        x = trace[f"ups.{i}"] = upsample(w, i, x, args)
        if i == len(args.upsample_rates) - 1:
            x = F.pad(x, (1, 0), mode="reflect")  # self.reflection_pad = nn.ReflectionPad1d((1, 0))
        # fusion
        si = trace[f"source_downs.{i}"] = source_down(w, i, s_stft, args)
        si = trace[f"source_resblocks.{i}"] = forward_module(w, f"source_resblocks.{i}", si, args)
        x = x + si
        xs = None
        for j in range(num_kernels):
            name = f"resblocks.{i * num_kernels + j}"
            out = trace[name] = forward_module(w, name, x, args)
            xs = out if xs is None else xs + out  # upstream: xs += self.resblocks[...](x)
        x = xs / num_kernels
    return x


def decode(w: UpstreamWeights, mel: torch.Tensor, s: torch.Tensor, args: UpstreamHiFTArgs,
           finalize: bool = True, trace: Trace | None = None) -> torch.Tensor:
    """``HiFTGenerator.decode`` / ``CausalHiFTGenerator.decode``: mel [B, 80, T], source s [B, 1, T * 480]
    -> audio [B, T * 480] (CosyVoice3 ``finalize=False``: mel's last ``conv_pre_look_right`` frames are
    conv_pre's look-ahead only, and the last frame of audio is dropped: [B, (T - look_right - 1) * 480])."""
    trace = {} if trace is None else trace
    s_stft_real, s_stft_imag = stft(s.squeeze(1), args)
    x = conv_pre(w, mel, args, finalize)
    if args.causal and not finalize:
        cut = int(math.prod(args.upsample_rates) * args.conv_pre_look_right)
        s_stft_real, s_stft_imag = s_stft_real[:, :, :-cut], s_stft_imag[:, :, :-cut]
    s_stft = torch.cat([s_stft_real, s_stft_imag], dim=1)  # [B, n_fft + 2, F]
    trace["s_stft"], trace["conv_pre"] = s_stft, x
    x = _stages(w, x, s_stft, args, trace)
    x = F.leaky_relu(x)  # default slope 0.01
    x = trace["conv_post"] = conv_post(w, x, args)
    bins = args.n_fft // 2 + 1
    magnitude = torch.exp(x[:, :bins, :])
    phase = torch.sin(x[:, bins:, :])  # "actually, sin is redundancy"
    x = istft(magnitude, phase, args)
    if args.causal and not finalize:
        x = x[:, :-int(math.prod(args.upsample_rates) * args.hop_len)]
    x = trace["audio"] = torch.clamp(x, -args.audio_limit, args.audio_limit)
    return x


def source_from_f0(w: UpstreamWeights, f0: torch.Tensor, noise: torch.Tensor, rand_ini: torch.Tensor,
                   args: UpstreamHiFTArgs, trace: Trace | None = None) -> torch.Tensor:
    """The ``inference`` lines "f0->source": F0 [B, T] -> s [B, 1, T * 480]."""
    trace = {} if trace is None else trace
    s = F.interpolate(f0[:, None], scale_factor=float(args.upsample_scale), mode="nearest")  # self.f0_upsamp
    s = s.transpose(1, 2)  # bs,n,t: [B, L, 1]
    s, trace["sine_waves"] = source_module(w, s, noise[:, : s.shape[1]], rand_ini, args)
    s = trace["m_source"] = s.transpose(1, 2)  # [B, 1, L]
    return s


def inference(w: UpstreamWeights, mel: torch.Tensor, noise: torch.Tensor, rand_ini: torch.Tensor,
              args: UpstreamHiFTArgs, finalize: bool = True, trace: Trace | None = None,
              f0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``HiFTGenerator.inference`` (no ``cache_source``) / ``CausalHiFTGenerator.inference``:
    mel [B, 80, T] float32 -> (audio [B, T * 480], source s [B, 1, T' * 480]).

    ``noise`` [B, >= T' * 480, H] and ``rand_ini`` [B, H]: see the module docstring. ``trace`` receives the
    F0 (``f0_predictor``, in the predictor's dtype), the harmonics + noise (``sine_waves``), the source
    (``m_source``) and every decode stage. ``f0`` [B, T'] (float32), when given, replaces the predicted F0
    for the later stages (a test's teacher forcing: the float32 phase cumsum turns one ulp of F0 into
    ~1e-3 rad), the prediction is still traced."""
    trace = {} if trace is None else trace
    if args.causal:  # "f0_predictor precision is crucial for causal inference": float64
        trace["f0_predictor"] = f0_predictor(w, mel.to(torch.float64), causal=True, finalize=finalize)
    else:
        trace["f0_predictor"] = f0_predictor(w, mel, causal=False)
    f0 = trace["f0_predictor"].to(mel) if f0 is None else f0
    s = source_from_f0(w, f0, noise, rand_ini, args, trace)
    if args.causal and not finalize:
        mel = mel[:, :, :-causal_padding(_kernel(w, "f0_predictor.condnet.0"))]
    return decode(w, mel, s, args, finalize, trace), s
