"""Tests for specli.io.audio: decoding, errors, streaming and Whisper log-mel features."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from specli.io import audio as A
from specli.errors import AudioError

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
REAL_CLIPS = [
    SAMPLES / "en" / "sense_and_sensibility_01_austen_64kb-0870.wav",
    SAMPLES / "en" / "queue-youarenext.wav",
    SAMPLES / "fr" / "demo-thanks.wav",
]

# Tolerance against transformers.WhisperFeatureExtractor (its torch path: float32
# torch.stft, same ops). Measured max |diff| = 0.0 (bit-identical) with torch 2.13 /
# transformers 5.24, 80 and 128 mels, real clips and noise. 1e-4 leaves room for
# other BLAS/FFT back ends.
FEATURE_ATOL = 1e-4
# Against transformers' numpy float64 STFT path: measured max |diff| 2.1e-5.
NUMPY_REF_ATOL = 1e-4
# Mel filterbank vs transformers.audio_utils.mel_filter_bank (float64): measured 1.8e-9.
FILTER_ATOL = 1e-8


def _tone(freq: float, seconds: float, rate: int, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(seconds * rate))) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _peak_hz(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1.0 / rate)[np.argmax(spectrum)])


def _real_clip(path: Path) -> np.ndarray:
    if not path.exists():
        pytest.skip(f"sample clip missing: {path}")
    return A.load_audio(path)


@pytest.fixture(scope="module")
def extractors() -> dict[int, object]:
    transformers = pytest.importorskip("transformers")
    return {n: transformers.WhisperFeatureExtractor(feature_size=n) for n in (80, 128)}


def _signals() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1234)
    out = {str(p.name): _real_clip(p) for p in REAL_CLIPS}
    out["noise_7s"] = (0.1 * rng.standard_normal(7 * 16000)).astype(np.float32)
    out["noise_30s"] = (0.1 * rng.standard_normal(30 * 16000)).astype(np.float32)
    out["noise_quiet"] = (1e-4 * rng.standard_normal(3 * 16000)).astype(np.float32)
    return out


# --------------------------------------------------------------------------- features


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_match_transformers(n_mels: int) -> None:
    audio_utils = pytest.importorskip("transformers.audio_utils")
    ref = audio_utils.mel_filter_bank(
        num_frequency_bins=201, num_mel_filters=n_mels, min_frequency=0.0,
        max_frequency=8000.0, sampling_rate=16000, norm="slaney", mel_scale="slaney",
    )
    ours = A.mel_filters(n_mels)
    assert ours.shape == (n_mels, 201) and ours.dtype == torch.float32
    np.testing.assert_allclose(ours.numpy(), ref.T, rtol=0, atol=FILTER_ATOL)


def test_mel_filters_cache_is_not_mutable_through_result() -> None:
    first = A.mel_filters(80)
    first.zero_()
    assert A.mel_filters(80).abs().sum() > 0
    with pytest.raises(ValueError):
        A.mel_filters(0)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_window_features_match_whisper_feature_extractor(n_mels: int, extractors: dict) -> None:
    fe = extractors[n_mels]
    for name, signal in _signals().items():
        ref = fe(signal, sampling_rate=16000, return_tensors="pt").input_features
        ours = A.window_features(signal, n_mels)
        assert ours.shape == (1, n_mels, 3000) == ref.shape, name
        diff = (ours - ref).abs().max().item()
        assert diff <= FEATURE_ATOL, f"{name}: max abs diff {diff}"


def test_window_features_match_numpy_float64_reference(extractors: dict) -> None:
    fe = extractors[80]
    if not hasattr(fe, "_np_extract_fbank_features"):
        pytest.skip("transformers no longer exposes the numpy feature path")
    for name, signal in _signals().items():
        padded = A.pad_or_trim(signal, A.N_SAMPLES)[None].astype(np.float32)
        ref = fe._np_extract_fbank_features(padded, "cpu")
        diff = np.abs(A.window_features(signal, 80).numpy() - ref).max()
        assert diff <= NUMPY_REF_ATOL, f"{name}: max abs diff {diff}"


def test_log_mel_unpadded_matches_reference(extractors: dict) -> None:
    signal = _real_clip(REAL_CLIPS[0])
    ref = extractors[80](signal, sampling_rate=16000, padding="longest", return_tensors="pt")
    ours = A.log_mel_spectrogram(signal)
    assert ours.shape == (80, len(signal) // A.HOP_LENGTH)
    assert (ours - ref.input_features[0]).abs().max().item() <= FEATURE_ATOL


def test_log_mel_padding_and_input_types() -> None:
    signal = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1
    from_np = A.log_mel_spectrogram(signal, padding=A.N_SAMPLES)
    from_torch = A.log_mel_spectrogram(torch.from_numpy(signal), padding=A.N_SAMPLES)
    from_f64 = A.log_mel_spectrogram(signal.astype(np.float64), padding=A.N_SAMPLES)
    assert from_np.shape == (80, (16000 + A.N_SAMPLES) // A.HOP_LENGTH)
    assert torch.equal(from_np, from_torch) and torch.equal(from_np, from_f64)
    with pytest.raises(TypeError):
        A.log_mel_spectrogram(np.zeros(16000, dtype=np.int16))
    with pytest.raises(ValueError):
        A.log_mel_spectrogram(np.zeros((2, 16000), dtype=np.float32))
    with pytest.raises(ValueError):
        A.log_mel_spectrogram(np.zeros(100, dtype=np.float32))


def test_window_features_trims_long_audio() -> None:
    signal = np.random.default_rng(0).standard_normal(35 * 16000).astype(np.float32) * 0.1
    assert torch.equal(A.window_features(signal), A.window_features(signal[: A.N_SAMPLES]))


def test_pad_or_trim_numpy_and_torch() -> None:
    x = np.arange(10, dtype=np.float32)
    assert A.pad_or_trim(x, 4).tolist() == [0, 1, 2, 3]
    assert A.pad_or_trim(x, 12).tolist() == list(range(10)) + [0, 0]
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert A.pad_or_trim(t, 5).shape == (2, 5)
    assert A.pad_or_trim(t, 4, axis=0).shape == (4, 3)
    assert torch.equal(A.pad_or_trim(t, 2), t[:, :2])
    assert A.pad_or_trim(x, 10) is x


# --------------------------------------------------------------------------- decoding


def test_stereo_44k_is_downmixed_and_resampled(tmp_path: Path) -> None:
    left = _tone(440.0, 2.0, 44100, amplitude=0.5)
    path = tmp_path / "stereo.wav"
    sf.write(path, np.stack([left, np.zeros_like(left)], axis=1), 44100, subtype="FLOAT")
    audio = A.load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - 32000) <= 1
    assert abs(_peak_hz(audio, 16000) - 440.0) <= 2.0
    middle = audio[4000:-4000]
    assert abs(np.abs(middle).max() - 0.25) < 0.01  # mean of 0.5-amplitude tone and silence
    assert A.audio_duration(path) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("ext", "fmt", "subtype", "lossless"),
    [
        (".wav", "WAV", "PCM_16", True), (".flac", "FLAC", "PCM_16", True),
        (".mp3", "MP3", "MPEG_LAYER_III", False), (".ogg", "OGG", "VORBIS", False),
        (".oga", "OGG", "VORBIS", False), (".opus", "OGG", "OPUS", False),
        (".aiff", "AIFF", "PCM_16", True), (".aif", "AIFF", "PCM_16", True),
        (".au", "AU", "PCM_16", True), (".caf", "CAF", "PCM_16", True),
        (".w64", "W64", "PCM_16", True),
    ],
)
def test_format_round_trip(tmp_path: Path, ext: str, fmt: str, subtype: str, lossless: bool) -> None:
    assert ext in A.AUDIO_EXTENSIONS
    rate = 48000 if subtype == "OPUS" else 16000
    tone = _tone(440.0, 2.0, rate)
    path = tmp_path / f"tone{ext}"
    sf.write(path, tone, rate, format=fmt, subtype=subtype)
    audio = A.load_audio(path)
    assert abs(len(audio) - 32000) <= 1
    assert abs(_peak_hz(audio, 16000) - 440.0) <= 2.0
    if lossless:
        np.testing.assert_allclose(audio, tone, atol=1e-4)
    else:
        corr = np.corrcoef(audio[2000:-2000], _tone(440.0, 2.0, 16000)[2000:-2000])[0, 1]
        assert corr > 0.95


def test_real_clip_loads_at_16k() -> None:
    path = REAL_CLIPS[0]
    audio = _real_clip(path)
    assert len(audio) == sf.info(path).frames
    assert A.audio_duration(path) == pytest.approx(7.1, abs=0.01)


# --------------------------------------------------------------------------- errors


def _write_bad(tmp_path: Path, kind: str) -> Path:
    if kind == "missing":
        return tmp_path / "missing.wav"
    if kind == "directory":
        folder = tmp_path / "folder.wav"
        folder.mkdir()
        return folder
    if kind == "zero_byte":
        path = tmp_path / "empty.wav"
        path.write_bytes(b"")
        return path
    if kind == "truncated":
        full = tmp_path / "full.wav"
        sf.write(full, _tone(440.0, 1.0, 16000), 16000)
        path = tmp_path / "truncated.wav"
        path.write_bytes(full.read_bytes()[:100])
        return path
    if kind == "text":
        path = tmp_path / "x.wav"
        path.write_text("this is not audio\n" * 20)
        return path
    if kind == "unknown":
        path = tmp_path / "data.xyz"
        path.write_bytes(bytes(range(256)) * 8)
        return path
    if kind == "zero_length":
        path = tmp_path / "silent.wav"
        sf.write(path, np.zeros(0, dtype=np.float32), 16000)
        return path
    raise AssertionError(kind)


BAD_KINDS = {
    "missing": "not found",
    "directory": "directory",
    "zero_byte": "empty",
    "truncated": "truncated",
    "text": "unsupported or corrupt",
    "unknown": "unsupported or corrupt",
    "zero_length": "no audio",
}


@pytest.mark.parametrize("kind", sorted(BAD_KINDS))
def test_bad_inputs_raise_audio_error_naming_path(tmp_path: Path, kind: str) -> None:
    path = _write_bad(tmp_path, kind)
    with pytest.raises(AudioError) as info:
        A.load_audio(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert BAD_KINDS[kind] in message, message
    assert "\n" not in message
    with pytest.raises(AudioError, match="^" + str(path).replace(".", r"\.")):
        list(A.iter_audio_chunks(path))


@pytest.mark.parametrize("kind", ["missing", "zero_byte", "text", "unknown"])
def test_audio_duration_errors(tmp_path: Path, kind: str) -> None:
    path = _write_bad(tmp_path, kind)
    with pytest.raises(AudioError, match=BAD_KINDS[kind]):
        A.audio_duration(path)


def test_truncated_flac_raises(tmp_path: Path) -> None:
    full = tmp_path / "full.flac"
    noise = np.random.default_rng(0).standard_normal(48000).astype(np.float32) * 0.1
    sf.write(full, noise, 16000)
    path = tmp_path / "cut.flac"
    path.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    with pytest.raises(AudioError, match="cut.flac: "):
        A.load_audio(path)


def test_wav_with_unknown_length_placeholder_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "streamed.wav"
    sf.write(path, _tone(440.0, 1.0, 16000), 16000)
    data = bytearray(path.read_bytes())
    assert data[36:40] == b"data"
    data[40:44] = (0xFFFFFFFF).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    assert len(A.load_audio(path)) == 16000


# --------------------------------------------------------------------------- streaming


@pytest.mark.parametrize(("rate", "channels"), [(44100, 2), (16000, 1), (8000, 1)])
def test_stream_equals_load_audio(tmp_path: Path, rate: int, channels: int) -> None:
    rng = np.random.default_rng(rate)
    data = (0.1 * rng.standard_normal((int(rate * 12.3), channels))).astype(np.float32)
    path = tmp_path / f"long_{rate}.wav"
    sf.write(path, data, rate, subtype="FLOAT")
    chunks = list(A.iter_audio_chunks(path, chunk_seconds=5.0))
    assert all(len(c) == 80000 for c in chunks[:-1]) and 0 < len(chunks[-1]) <= 80000
    assert all(c.dtype == np.float32 and c.ndim == 1 for c in chunks)
    streamed = np.concatenate(chunks)
    whole = A.load_audio(path)
    assert len(streamed) == len(whole)
    # Same soxr settings on the same input: measured bit-identical; allow 1e-6.
    np.testing.assert_allclose(streamed, whole, rtol=0, atol=1e-6)


def test_audio_stream_metadata_and_single_use(tmp_path: Path) -> None:
    path = tmp_path / "a.wav"
    sf.write(path, np.zeros((44100, 2), dtype=np.float32), 44100)
    with A.AudioStream(path, chunk_seconds=0.25) as stream:
        assert (stream.source_rate, stream.channels) == (44100, 2)
        assert stream.duration == pytest.approx(1.0)
        assert sum(len(c) for c in stream) == 16000
        with pytest.raises(RuntimeError):
            list(stream)
    with pytest.raises(ValueError):
        A.AudioStream(path, chunk_seconds=0)


def test_stream_memory_is_flat(tmp_path: Path) -> None:
    rate, seconds = 44100, 120
    path = tmp_path / "two_minutes.wav"
    rng = np.random.default_rng(7)
    with sf.SoundFile(path, "w", rate, 1, subtype="PCM_16") as out:
        for _ in range(seconds):
            out.write((0.1 * rng.standard_normal(rate)).astype(np.float32))
    # Whole-file decoding would hold >= 120 s * 44100 * 4 B = 21 MB of float32.
    tracemalloc.start()
    try:
        total = sum(len(chunk) for chunk in A.iter_audio_chunks(path, chunk_seconds=5.0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == seconds * 16000
    assert peak < 5 * 1024 * 1024, f"peak traced memory {peak} bytes"


@pytest.mark.parametrize(
    ("ext", "fmt", "subtype"),
    [
        (".wav", "WAV", "PCM_16"), (".aiff", "AIFF", "PCM_16"), (".au", "AU", "PCM_16"), (".caf", "CAF", "PCM_16"),
        (".w64", "W64", "PCM_16"), (".rf64", "RF64", "PCM_16"), (".flac", "FLAC", "PCM_16"),
        (".ogg", "OGG", "VORBIS"), (".opus", "OGG", "OPUS"), (".mp3", "MP3", "MPEG_LAYER_III"),
    ],
)
@pytest.mark.parametrize("kept", [0.5, 0.9])
def test_every_container_cut_short_raises(tmp_path: Path, ext: str, fmt: str, subtype: str, kept: float) -> None:
    """Containers whose decoder shortens a cut file silently (AIFF, AU, W64, RF64, Ogg) are caught like WAV."""
    rate = 48000 if subtype == "OPUS" else 16000
    full = tmp_path / f"full{ext}"
    sf.write(full, _real_clip(REAL_CLIPS[0])[: rate * 3] if rate == 16000 else _tone(440.0, 3.0, rate), rate,
             format=fmt, subtype=subtype)
    assert len(A.load_audio(full)) == pytest.approx(48000, abs=1)
    cut = tmp_path / f"cut{ext}"
    cut.write_bytes(full.read_bytes()[: int(full.stat().st_size * kept)])
    with pytest.raises(AudioError, match=rf"cut{ext}: .*(truncated|malformed|lost sync)"):
        A.load_audio(cut)


def test_non_finite_samples_raise_with_where(tmp_path: Path) -> None:
    tone = _tone(440.0, 2.0, 16000)
    tone[24000] = np.nan
    tone[30000] = np.inf
    path = tmp_path / "nan.wav"
    sf.write(path, tone, 16000, subtype="FLOAT")
    with pytest.raises(AudioError, match=r"nan\.wav: non-finite samples \(NaN or Inf\), the first at 1\.500 s$"):
        A.load_audio(path)
