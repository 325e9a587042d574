"""CosyVoice prompt frontend: Kaldi fbank, prompt mel, ONNX speech tokenizer + CAM++, stored speakers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr
import torch
from acoustic_fixtures import campplus_weight, write_acoustic_dir, write_campplus, write_speech_tokenizer

from specli.tts.acoustic import Frontend, load_speakers
from specli.tts.acoustic.features import kaldi_fbank, prompt_mel, slaney_mel_filters, speaker_fbank, whisper_log_mel
from specli.io.audio import load_audio, log_mel_spectrogram, mel_filters
from specli.errors import AudioError, ModelLoadError, UsageError

CLIP = Path(__file__).resolve().parent.parent / "samples" / "en" / "queue-youarenext.wav"  # 16 kHz, 5.36 s
FLOAT32_EPS = float(np.finfo(np.float32).eps)


def _noise(n: int, seed: int = 0, scale: float = 0.3) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


# --- Kaldi fbank -------------------------------------------------------------------------------------------


def _numpy_fbank(x: np.ndarray, bins: int = 80, rate: int = 16000) -> np.ndarray:
    """Kaldi fbank written out step by step in float64 (torchaudio defaults, dither 0)."""
    size, shift, nfft = 400, 160, 512  # 25 ms, 10 ms, next power of two
    count = 1 + (len(x) - size) // shift  # snip_edges
    frames = np.stack([x[i * shift : i * shift + size] for i in range(count)]).astype(np.float64)
    frames -= frames.mean(axis=1, keepdims=True)  # remove_dc_offset
    frames -= 0.97 * np.concatenate([frames[:, :1], frames[:, :-1]], axis=1)  # preemphasis, x[-1] := x[0]
    n = np.arange(size)
    frames *= (0.5 - 0.5 * np.cos(2 * np.pi * n / (size - 1))) ** 0.85  # povey window
    power = np.abs(np.fft.rfft(frames, n=nfft)) ** 2  # [count, 257]

    def mel(f: np.ndarray | float) -> np.ndarray | float:
        return 1127.0 * np.log(1.0 + np.asarray(f) / 700.0)

    low, high = mel(20.0), mel(rate / 2)
    delta = (high - low) / (bins + 1)
    fft_mel = mel(np.arange(nfft // 2) * rate / nfft)
    banks = np.zeros((bins, nfft // 2 + 1))
    for b in range(bins):
        left, center, right = low + b * delta, low + (b + 1) * delta, low + (b + 2) * delta
        banks[b, : nfft // 2] = np.clip(np.minimum((fft_mel - left) / (center - left),
                                                   (right - fft_mel) / (right - center)), 0.0, None)
    return np.log(np.maximum(power @ banks.T, FLOAT32_EPS))


def test_fbank_hand_checked() -> None:
    x = _noise(2000, seed=3)
    ours = kaldi_fbank(torch.from_numpy(x)).double().numpy()
    assert ours.shape == (1 + (2000 - 400) // 160, 80)
    np.testing.assert_allclose(ours, _numpy_fbank(x), rtol=0, atol=2e-4)
    # a constant signal is all DC: removed per frame, so every bank sits at Kaldi's floor log(eps)
    flat = kaldi_fbank(torch.full((800,), 0.25))
    assert torch.equal(flat, torch.full((3, 80), math.log(FLOAT32_EPS), dtype=torch.float32))
    # a 1 kHz tone puts its energy in the bank centred nearest 1 kHz
    tone = np.sin(2 * np.pi * 1000 * np.arange(1600) / 16000).astype(np.float32)
    centers = [700 * (math.exp((1127 * math.log(1 + 20 / 700) + (b + 1) * (1127 * math.log(1 + 8000 / 700)
               - 1127 * math.log(1 + 20 / 700)) / 81) / 1127) - 1) for b in range(80)]
    peak = int(kaldi_fbank(torch.from_numpy(tone)).mean(0).argmax())
    assert abs(centers[peak] - 1000) == min(abs(c - 1000) for c in centers)


def test_fbank_frame_counts_and_mean_subtraction() -> None:
    assert kaldi_fbank(torch.zeros(399)).shape == (0, 80)
    assert kaldi_fbank(torch.zeros(559)).shape == (1, 80)
    assert kaldi_fbank(torch.zeros(560)).shape == (2, 80)
    feats = speaker_fbank(_noise(8000))
    torch.testing.assert_close(feats.mean(0), torch.zeros(80), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="shorter"):
        speaker_fbank(np.zeros(100, np.float32))


# --- mel features ------------------------------------------------------------------------------------------


def test_slaney_filters_match_whisper_filterbank() -> None:
    """Same construction as librosa.filters.mel; Whisper's bank (librosa, 16 kHz, n_fft 400) as the anchor."""
    for bins in (80, 128):
        assert torch.equal(slaney_mel_filters(16000, 400, bins, 0.0, 8000.0), mel_filters(bins))
    full, low = slaney_mel_filters(24000, 1920, 80, 0.0, None), slaney_mel_filters(24000, 1920, 80, 0.0, 8000.0)
    assert full.shape == low.shape == (80, 961)
    above = torch.arange(961) * 12.5 > 8000.0  # 12.5 Hz bins
    assert float(low[:, above].sum()) == 0.0 and float(full[:, above].sum()) > 0.0


@pytest.mark.parametrize("fmax", [8000.0, None])
def test_prompt_mel_hand_checked(fmax: float | None) -> None:
    x = _noise(24000 // 4 + 123, seed=5)  # 0.255 s
    ours = prompt_mel(x, fmax)
    frames = len(x) // 480
    assert ours.shape == (1, 80, frames)
    padded = np.pad(x.astype(np.float64), (720, 720), mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(1920) / 1920)  # periodic Hann
    spec = np.stack([np.fft.rfft(padded[i * 480 : i * 480 + 1920] * window) for i in range(frames)], axis=1)
    magnitude = np.sqrt(np.abs(spec) ** 2 + 1e-9)
    mel = slaney_mel_filters(24000, 1920, 80, 0.0, fmax).double().numpy() @ magnitude
    np.testing.assert_allclose(ours[0].double().numpy(), np.log(np.maximum(mel, 1e-5)), rtol=0, atol=1e-4)


def test_whisper_log_mel_is_specli_audio() -> None:
    x = _noise(16000)
    assert torch.equal(whisper_log_mel(x), log_mel_spectrogram(x, n_mels=128).unsqueeze(0))
    assert whisper_log_mel(x).shape == (1, 128, 100)


# --- frontend through tiny ONNX models ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_acoustic_dir(tmp_path_factory.mktemp("cv3"), "cosyvoice3")


def _expected_tokens(audio_16k: np.ndarray) -> np.ndarray:
    mel = whisper_log_mel(audio_16k)[0].numpy()
    return mel[:, ::4].argmax(axis=0) * 51


def test_prompt_through_tiny_models(model_dir: Path) -> None:
    frontend = Frontend.from_dir(model_dir)
    assert frontend.kind == "cosyvoice3" and frontend.spec.mel.fmax is None
    out = frontend.prompt(CLIP, "  And now the queue.  ")
    audio_16k = load_audio(CLIP, 16000)
    audio_24k = load_audio(CLIP, 24000)
    tokens = _expected_tokens(audio_16k)
    mel = prompt_mel(audio_24k, None).transpose(1, 2)
    n = min(mel.shape[1] // 2, tokens.size)
    assert n == 134 and out.speech_tokens.dtype == torch.int64
    assert out.speech_tokens.tolist() == [tokens[:n].tolist()]
    assert out.prompt_mel.shape == (1, 2 * n, 80)
    torch.testing.assert_close(out.prompt_mel, mel[:, : 2 * n], rtol=0, atol=1e-5)
    expected = speaker_fbank(audio_16k).max(0).values.numpy() @ campplus_weight()
    np.testing.assert_allclose(out.speaker_embedding.numpy()[0], expected, rtol=1e-4, atol=1e-4)
    assert out.speaker_embedding.shape == (1, 192) and out.prompt_text == "And now the queue."
    assert out.duration_s == pytest.approx(5.362, abs=1e-3)


def test_cosyvoice2_dir_and_resampled_prompt(tmp_path: Path) -> None:
    root = write_acoustic_dir(tmp_path / "cv2", "cosyvoice2")
    frontend = Frontend.from_dir(root)
    assert frontend.kind == "cosyvoice2" and frontend.spec.mel.fmax == 8000.0
    x48 = _noise(48000 * 2, seed=9)
    sf.write(tmp_path / "p48m.wav", x48, 48000, subtype="FLOAT")
    out = frontend.prompt(tmp_path / "p48m.wav", "text")
    n = out.speech_tokens.shape[1]
    assert n == 50 and out.prompt_mel.shape == (1, 2 * n, 80)
    a16 = soxr.resample(x48, 48000, 16000, quality="HQ")
    assert out.speech_tokens[0].tolist() == _expected_tokens(a16)[:n].tolist()
    a24 = soxr.resample(x48, 48000, 24000, quality="HQ")
    torch.testing.assert_close(out.prompt_mel, prompt_mel(a24, 8000.0).transpose(1, 2)[:, : 2 * n],
                               rtol=0, atol=1e-5)
    sf.write(tmp_path / "p48s.wav", np.stack([x48, x48], axis=1), 48000, subtype="FLOAT")  # stereo
    stereo = frontend.prompt(tmp_path / "p48s.wav", "text")
    assert torch.equal(stereo.speech_tokens, out.speech_tokens)
    torch.testing.assert_close(stereo.speaker_embedding, out.speaker_embedding)


_FEAT_YAML = """\
sample_rate: 24000
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: {n_fft}
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: {fmax}
    center: False
"""


def test_prompt_mel_settings_from_yaml(tmp_path: Path) -> None:
    root = write_acoustic_dir(tmp_path / "m", "cosyvoice3")
    (root / "cosyvoice3.yaml").write_text(_FEAT_YAML.format(n_fft=1920, fmax=8000))
    assert Frontend.from_dir(root).spec.mel.fmax == 8000.0
    (root / "cosyvoice3.yaml").write_text(_FEAT_YAML.format(n_fft=1920, fmax="null"))
    assert Frontend.from_dir(root).spec.mel.fmax is None
    (root / "cosyvoice3.yaml").write_text(_FEAT_YAML.format(n_fft=1024, fmax="null"))  # window 1920 > n_fft
    with pytest.raises(ModelLoadError, match=r"cosyvoice3\.yaml: unusable acoustic settings: .*win_size must equal"):
        Frontend.from_dir(root)
    (root / "cosyvoice3.yaml").write_text(_FEAT_YAML.format(n_fft=1920, fmax="13000"))  # above Nyquist
    with pytest.raises(ModelLoadError, match=r"cosyvoice3\.yaml: unusable acoustic settings: need 0 <= fmin"):
        Frontend.from_dir(root)
    voice = _FEAT_YAML.replace("24000", "22050").replace("480", "256").replace("1920", "1024")
    (root / "cosyvoice3.yaml").write_text(voice.format(n_fft=1024, fmax=8000))  # specli-en's mel: read, not assumed
    mel = Frontend.from_dir(root).spec.mel
    assert (mel.sample_rate, mel.n_fft, mel.hop, mel.fmax) == (22050, 1024, 256, 8000.0)


def test_bad_prompt_audio(model_dir: Path, tmp_path: Path) -> None:
    frontend = Frontend.from_dir(model_dir)
    sf.write(tmp_path / "long.wav", _noise(16000 * 31, scale=0.05), 16000)
    with pytest.raises(AudioError, match=r"long\.wav: prompt is 31\.0 s long; .* at most 30 s"):
        frontend.prompt(tmp_path / "long.wav", "x")
    sf.write(tmp_path / "edge.wav", _noise(16000 * 30, scale=0.05), 16000)
    assert frontend.prompt(tmp_path / "edge.wav", "x").speech_tokens.shape[1] == 750
    sf.write(tmp_path / "low.wav", _noise(8000), 8000)
    with pytest.raises(AudioError, match="8000 Hz is below 16000 Hz"):
        frontend.prompt(tmp_path / "low.wav", "x")
    (tmp_path / "junk.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk" * 4)
    with pytest.raises(AudioError, match="junk.wav"):
        frontend.prompt(tmp_path / "junk.wav", "x")
    with pytest.raises(AudioError, match="not found"):
        frontend.prompt(tmp_path / "absent.wav", "x")
    sf.write(tmp_path / "short.wav", _noise(160), 16000)
    with pytest.raises(AudioError, match="too short"):
        frontend.prompt(tmp_path / "short.wav", "x")


def test_bad_onnx_models(tmp_path: Path) -> None:
    root = write_acoustic_dir(tmp_path / "m", "cosyvoice3")
    tokenizer = root / "speech_tokenizer_v3.onnx"
    good = tokenizer.read_bytes()
    tokenizer.write_bytes(good[: len(good) // 2])
    with pytest.raises(ModelLoadError, match=r"speech_tokenizer_v3\.onnx: not a loadable ONNX model"):
        Frontend.from_dir(root)
    tokenizer.write_bytes(b"\x00garbage" * 50)
    with pytest.raises(ModelLoadError, match="not a loadable ONNX model"):
        Frontend.from_dir(root)
    write_campplus(tokenizer)  # a valid ONNX file with the wrong signature
    with pytest.raises(ModelLoadError, match=r"speech_tokenizer_v3\.onnx: unexpected model signature"):
        Frontend.from_dir(root)
    write_speech_tokenizer(tokenizer)
    write_speech_tokenizer(root / "campplus.onnx")
    with pytest.raises(ModelLoadError, match=r"campplus\.onnx: unexpected model signature"):
        Frontend.from_dir(root)
    (root / "campplus.onnx").unlink()
    with pytest.raises(ModelLoadError, match=r"campplus\.onnx: model file not found"):
        Frontend.from_dir(root)
    tokenizer.unlink()
    with pytest.raises(ModelLoadError, match="no speech_tokenizer_v2.onnx or speech_tokenizer_v3.onnx"):
        Frontend.from_dir(root)
    with pytest.raises(ModelLoadError, match="not found"):
        Frontend.from_dir(root, kind="cosyvoice2")
    with pytest.raises(ModelLoadError, match="model directory not found"):
        Frontend.from_dir(tmp_path / "absent")


# --- stored speakers -------------------------------------------------------------------------------------


def test_stored_speakers(tmp_path: Path) -> None:
    root = write_acoustic_dir(tmp_path / "m", "cosyvoice2")
    assert Frontend.from_dir(root).speakers == {}
    emb = torch.randn(1, 192)
    saved = {"flow_embedding": torch.randn(1, 192), "llm_embedding": torch.randn(1, 192),
             "flow_prompt_speech_token": torch.arange(5, dtype=torch.int32)[None],
             "prompt_speech_feat": torch.randn(1, 10, 80), "prompt_text": torch.tensor([[1, 2, 3]], dtype=torch.int32)}
    torch.save({"中文女": {"embedding": emb}, "alice": saved}, root / "spk2info.pt")
    frontend = Frontend.from_dir(root)
    assert sorted(frontend.speakers) == ["alice", "中文女"]
    sft = frontend.speaker("中文女")
    assert torch.equal(sft.embedding, emb) and sft.speech_tokens is None and sft.prompt_mel is None
    alice = frontend.speaker("alice")
    assert torch.equal(alice.embedding, saved["flow_embedding"])
    assert alice.speech_tokens is not None and alice.speech_tokens.dtype == torch.int64
    assert alice.prompt_mel is not None and alice.prompt_mel.shape == (1, 10, 80)
    with pytest.raises(UsageError, match="unknown speaker 'bob'; stored speakers: alice"):
        frontend.speaker("bob")


class _Payload:
    def __reduce__(self) -> tuple:
        return (print, ("unpickled!",))


def test_bad_speaker_files(tmp_path: Path) -> None:
    torch.save({"a": _Payload()}, tmp_path / "evil.pt")
    with pytest.raises(ModelLoadError, match=r"evil\.pt: unreadable speaker file"):
        load_speakers(tmp_path / "evil.pt")
    torch.save({"a": {"embedding": torch.zeros(1, 80)}}, tmp_path / "small.pt")
    with pytest.raises(ModelLoadError, match="speaker 'a' has no 192-value embedding"):
        load_speakers(tmp_path / "small.pt")
    torch.save({"a": {"embedding": torch.zeros(1, 192)}}, tmp_path / "ok.pt")
    data = (tmp_path / "ok.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelLoadError, match="unreadable speaker file"):
        load_speakers(tmp_path / "cut.pt")
