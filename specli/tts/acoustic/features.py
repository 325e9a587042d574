"""Acoustic features of the CosyVoice frontend, in torch (no torchaudio, no librosa).

- :func:`kaldi_fbank`: Kaldi log-mel filterbank as ``torchaudio.compliance.kaldi.fbank`` computes it with
  its defaults (25 ms povey window every 10 ms, snip edges, DC offset removed per frame, preemphasis
  0.97, 512-point power spectrum, Kaldi mel banks 20 Hz..Nyquist, log floored at float32 epsilon) and
  CosyVoice's arguments (80 bins, dither 0). :func:`speaker_fbank` adds the mean subtraction over time
  that CosyVoice applies before CAM++.
- :func:`whisper_log_mel`: the speech tokenizer's input, 128-bin Whisper log-mel of 16 kHz audio; it is
  :func:`specli.io.audio.log_mel_spectrogram` (openai-whisper's function: no padding to 30 s).
- :func:`prompt_mel`: the flow stage's prompt features, Matcha-TTS ``mel_spectrogram`` at 24 kHz (reflect
  padding ``(n_fft - hop) / 2``, uncentred STFT with a periodic Hann window, magnitude
  ``sqrt(|X|^2 + 1e-9)``, librosa-style slaney mel filterbank, ``log(clamp(x, 1e-5))``).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F

from specli.io.audio import _slaney_filters_np, log_mel_spectrogram

__all__ = [
    "FBANK_BINS",
    "PROMPT_MEL_BINS",
    "kaldi_fbank",
    "kaldi_mel_banks",
    "prompt_mel",
    "slaney_mel_filters",
    "speaker_fbank",
    "whisper_log_mel",
]

FBANK_BINS = 80  # CAM++ input bins
PROMPT_MEL_BINS = 80  # flow / vocoder mel bins
_KALDI_EPS = float(torch.finfo(torch.float32).eps)  # Kaldi's log floor (numeric_limits<float>::epsilon)


def _mel_scale_kaldi(freq: torch.Tensor | float) -> torch.Tensor | float:
    """Kaldi's (HTK) mel scale ``1127 ln(1 + f / 700)``."""
    if isinstance(freq, torch.Tensor):
        return 1127.0 * (1.0 + freq / 700.0).log()
    return 1127.0 * math.log(1.0 + freq / 700.0)


@functools.lru_cache(maxsize=8)
def _kaldi_mel_banks_cached(num_bins: int, padded: int, sample_rate: float, low: float, high: float) -> torch.Tensor:
    nyquist = 0.5 * sample_rate
    high = high + nyquist if high <= 0.0 else high
    if not (0.0 <= low < nyquist and 0.0 < high <= nyquist and low < high):
        raise ValueError(f"bad mel band edges low={low} high={high} for nyquist {nyquist}")
    mel_low, mel_high = _mel_scale_kaldi(low), _mel_scale_kaldi(high)
    delta = (mel_high - mel_low) / (num_bins + 1)
    index = torch.arange(num_bins, device="cpu").unsqueeze(1)  # [bins, 1]
    left = mel_low + index * delta
    center = mel_low + (index + 1.0) * delta
    right = mel_low + (index + 2.0) * delta
    fft_mel = _mel_scale_kaldi((sample_rate / padded) * torch.arange(padded // 2, device="cpu")).unsqueeze(0)
    up = (fft_mel - left) / (center - left)
    down = (right - fft_mel) / (right - center)
    banks = torch.clamp(torch.minimum(up, down), min=0.0)  # [bins, padded / 2]
    return F.pad(banks, (0, 1))  # the Nyquist bin gets no weight, as in Kaldi


def kaldi_mel_banks(num_bins: int, padded_window: int, sample_rate: float,
                    low_freq: float = 20.0, high_freq: float = 0.0) -> torch.Tensor:
    """Kaldi triangular mel banks ``[num_bins, padded_window // 2 + 1]`` (``high_freq <= 0``: offset from Nyquist)."""
    if num_bins <= 3 or padded_window % 2:
        raise ValueError("need more than 3 bins and an even padded window")
    return _kaldi_mel_banks_cached(num_bins, padded_window, float(sample_rate), float(low_freq),
                                   float(high_freq)).clone()


def _as_mono(waveform: torch.Tensor | np.ndarray) -> torch.Tensor:
    """A float32 1-D tensor from mono audio ``[T]`` or ``[1, T]``."""
    tensor = torch.as_tensor(waveform)
    if tensor.dim() == 2 and tensor.shape[0] == 1:
        tensor = tensor[0]
    if tensor.dim() != 1:
        raise ValueError(f"expected mono audio [T] or [1, T], got shape {tuple(tensor.shape)}")
    if not tensor.is_floating_point():
        raise TypeError(f"audio must be floating point, got {tensor.dtype}")
    return tensor.to(torch.float32)


def kaldi_fbank(
    waveform: torch.Tensor | np.ndarray,  # [T] or [1, T], float, not rescaled to int16 range
    num_mel_bins: int = FBANK_BINS,
    sample_rate: int = 16000,
    frame_length_ms: float = 25.0,
    frame_shift_ms: float = 10.0,
    preemphasis: float = 0.97,
    low_freq: float = 20.0,
    high_freq: float = 0.0,
) -> torch.Tensor:
    """Kaldi log-mel filterbank ``[frames, num_mel_bins]`` (dither 0, snip edges; empty when too short)."""
    samples = _as_mono(waveform)
    size = int(sample_rate * frame_length_ms * 0.001)
    shift = int(sample_rate * frame_shift_ms * 0.001)
    padded = 1 << (size - 1).bit_length()  # round_to_power_of_two
    if samples.shape[0] < size:
        return samples.new_zeros(0, num_mel_bins)
    frames = samples.unfold(0, size, shift)  # [m, size]
    frames = frames - frames.mean(dim=1, keepdim=True)  # remove_dc_offset
    previous = torch.cat([frames[:, :1], frames[:, :-1]], dim=1)  # x[max(0, j - 1)]
    frames = frames - preemphasis * previous
    window = torch.hann_window(size, periodic=False, dtype=frames.dtype, device=frames.device).pow(0.85)
    frames = F.pad(frames * window, (0, padded - size))
    power = torch.fft.rfft(frames).abs().pow(2.0)  # [m, padded / 2 + 1]
    banks = kaldi_mel_banks(num_mel_bins, padded, sample_rate, low_freq, high_freq).to(power)
    energies = power @ banks.T
    return torch.clamp(energies, min=_KALDI_EPS).log()


def speaker_fbank(waveform_16k: torch.Tensor | np.ndarray) -> torch.Tensor:
    """CAM++ input: 80-bin Kaldi fbank of 16 kHz audio minus its mean over time, ``[frames, 80]``."""
    feats = kaldi_fbank(waveform_16k, num_mel_bins=FBANK_BINS, sample_rate=16000)
    if feats.shape[0] == 0:
        raise ValueError("audio shorter than one 25 ms fbank frame")
    return feats - feats.mean(dim=0, keepdim=True)


def whisper_log_mel(waveform_16k: torch.Tensor | np.ndarray, n_mels: int = 128) -> torch.Tensor:
    """Speech-tokenizer input ``[1, n_mels, frames]``: Whisper log-mel of the whole clip (100 frames/s)."""
    return log_mel_spectrogram(_as_mono(waveform_16k), n_mels=n_mels).unsqueeze(0)


def slaney_mel_filters(sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0,
                       fmax: float | None = None) -> torch.Tensor:
    """librosa's default mel filterbank ``[n_mels, n_fft // 2 + 1]`` (slaney scale and area norm)."""
    top = sample_rate / 2 if fmax is None else float(fmax)
    if not 0.0 <= fmin < top <= sample_rate / 2:
        raise ValueError(f"need 0 <= fmin < fmax <= {sample_rate / 2}, got {fmin}, {top}")
    return torch.from_numpy(_slaney_filters_np(sample_rate, n_fft, n_mels, float(fmin), top).copy())


def prompt_mel(
    waveform_24k: torch.Tensor | np.ndarray,  # [T] or [1, T]
    fmax: float | None,
    n_fft: int = 1920,
    hop: int = 480,
    n_mels: int = PROMPT_MEL_BINS,
    sample_rate: int = 24000,
    fmin: float = 0.0,
) -> torch.Tensor:
    """Matcha ``mel_spectrogram(center=False)`` ``[1, n_mels, frames]``, ``frames = len // hop``.

    ``fmax`` is the yaml's ``feat_extractor.fmax``: 8000 in CosyVoice2, ``null`` (Nyquist) in CosyVoice3.
    """
    samples = _as_mono(waveform_24k)
    pad = (n_fft - hop) // 2
    if samples.shape[0] <= pad:
        raise ValueError(f"audio too short for the prompt mel: {samples.shape[0]} samples, need > {pad}")
    padded = F.pad(samples[None, None], (pad, pad), mode="reflect")[0, 0]
    window = torch.hann_window(n_fft, device=samples.device)
    spec = torch.stft(padded, n_fft, hop_length=hop, win_length=n_fft, window=window, center=False,
                      normalized=False, onesided=True, return_complex=True)
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)  # [n_fft / 2 + 1, frames]
    mel = slaney_mel_filters(sample_rate, n_fft, n_mels, fmin, fmax).to(magnitude) @ magnitude
    return torch.clamp(mel, min=1e-5).log().unsqueeze(0)
