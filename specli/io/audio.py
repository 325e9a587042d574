"""Audio decoding, resampling and Whisper log-mel features.

Decoding goes through soundfile (libsndfile), resampling through soxr, and the
log-mel spectrogram reproduces OpenAI Whisper's ``log_mel_spectrogram`` in torch.
Every decoding failure raises :class:`specli.errors.AudioError` with a message of
the form ``"<path>: <reason>"``.
"""

from __future__ import annotations

import functools
import os
import re
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import numpy as np
import soundfile as sf
import soxr
import torch
import torch.nn.functional as F

from specli.errors import AudioError
from specli.io.fdcapture import LibraryStderr, quiet_stderr

__all__ = [
    "AUDIO_EXTENSIONS",
    "CHUNK_LENGTH",
    "HOP_LENGTH",
    "N_FFT",
    "N_FRAMES",
    "N_SAMPLES",
    "SAMPLE_RATE",
    "AudioStream",
    "audio_duration",
    "iter_audio_chunks",
    "load_audio",
    "log_mel_spectrogram",
    "mel_filters",
    "pad_or_trim",
    "window_features",
]

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples in a 30 s window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 frames in a 30 s window
RESAMPLE_QUALITY = "HQ"

#: Extensions (lower case, with dot) of containers the bundled libsndfile decodes.
#: Decoding itself sniffs the content; this set is for picking files out of folders.
AUDIO_EXTENSIONS: frozenset[str] = frozenset(
    {
        ".wav", ".wave", ".flac", ".ogg", ".oga", ".opus", ".mp3",
        ".aif", ".aiff", ".aifc", ".au", ".snd", ".caf", ".w64", ".rf64",
    }
)

PathLike = str | os.PathLike[str]
_ArrayT = TypeVar("_ArrayT", np.ndarray, torch.Tensor)
_OpenT = TypeVar("_OpenT")

_READ_BLOCK_FRAMES = 1 << 16  # input frames decoded per read
_MAX_WAV_CHUNKS = 256  # RIFF chunks walked looking for "data"
_WAV_SIZE_PLACEHOLDER = 0x7FFF0000  # sizes at or above this mean "unknown" (streamed)
_MP3_SHORTFALL = 0.05  # mp3 frame counts may be estimates; tolerate 5 % short
_SHORT_BYTES_TOLERATED = 1024  # a header size this much over the bytes present is a writer's slip, not a cut
# libsndfile's header log says "<chunk> : <declared> (should be <present>)" for a size the file does not match
_SIZE_MISMATCH = re.compile(r"^\s*([^:\n]+?)\s*:\s*(\d+) \(should be (\d+)\)", re.MULTILINE)
# what libsndfile's Ogg reader logs about a stream cut short (it decodes what is there without an error)
_OGG_CUT = {
    "Last page lacks an end-of-stream bit": "truncated Ogg file: its last page has no end-of-stream mark",
    "Junk after the last page": "truncated Ogg file: its last page is cut short",
}


def _error(path: PathLike, reason: str) -> AudioError:
    """Build an AudioError naming ``path``."""
    return AudioError(f"{os.fspath(path)}: {reason}")


def _sndfile_reason(exc: Exception, noise: LibraryStderr | None = None) -> str:
    """One-line reason from a soundfile exception, without the path it repeats.

    libsndfile reports content it cannot decode behind an '.mp3' name as 'File does not exist or is not
    a regular file (possibly a pipe?)' (the mp3 decoder gave up); the path was checked to be a regular
    file already, so that becomes 'not a decodable audio file', with the decoder's own message if any
    (what it printed on stderr, captured by :func:`quiet_stderr`).
    """
    detail = getattr(exc, "error_string", None) or str(exc)
    detail = " ".join(detail.split())
    if detail.startswith("Error : "):
        detail = detail[len("Error : ") :]
    detail = detail.rstrip(".") or type(exc).__name__
    if "possibly a pipe" in detail or detail == "Format not recognised":
        detail = "not a decodable audio file, no audio format recognised in its content"
    said = noise.first_line() if noise is not None else None
    return f"{detail}; decoder said: {said}" if said else detail


def _check_path(path: PathLike) -> None:
    """Fail early, with a clear reason, on paths libsndfile would only call 'System error'."""
    p = Path(path)
    try:
        if not p.exists():
            raise _error(path, "file not found")
        if p.is_dir():
            raise _error(path, "is a directory, not an audio file")
        if not p.is_file():
            raise _error(path, "not a regular file")
        if p.stat().st_size == 0:
            raise _error(path, "file is empty (0 bytes)")
    except OSError as exc:
        raise _error(path, f"cannot access file ({exc.strerror or exc})") from exc


def _wav_truncation(path: PathLike) -> str | None:
    """Return a reason if ``path`` is a RIFF/WAVE file whose data chunk is cut short.

    libsndfile silently shortens such files to the bytes present, so we compare the
    declared ``data`` size with the file size ourselves.
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(12)
            if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
                return None
            size = os.fstat(fh.fileno()).st_size
            pos = 12
            for _ in range(_MAX_WAV_CHUNKS):
                fh.seek(pos)
                header = fh.read(8)
                if len(header) < 8:
                    return None
                chunk_id = header[:4]
                (chunk_len,) = struct.unpack("<I", header[4:])
                if chunk_id == b"data":
                    available = size - pos - 8
                    if available < chunk_len < _WAV_SIZE_PLACEHOLDER:
                        return (
                            f"truncated WAV file: header declares {chunk_len} data bytes, "
                            f"only {available} present"
                        )
                    return None
                pos += 8 + chunk_len + (chunk_len & 1)
    except OSError as exc:
        raise _error(path, f"cannot read file ({exc.strerror or exc})") from exc
    return None


def _header_truncation(handle: sf.SoundFile) -> str | None:
    """Return a reason if the decoder's header log shows the file was cut short.

    For PCM containers (AIFF, AU, W64, RF64...) libsndfile shortens the frame count to the bytes present and
    only logs the mismatch; an Ogg stream cut short decodes to its complete pages, and its header frame count
    comes from the last page present, so decoded frames always equal it. The log is read once, at open.
    """
    log = handle.extra_info
    for label, declared, present in _SIZE_MISMATCH.findall(log):
        declared, present = int(declared), int(present)
        if present + _SHORT_BYTES_TOLERATED < declared < _WAV_SIZE_PLACEHOLDER:
            return f"truncated file: its header declares {declared} bytes for '{label}', only {present} present"
    return next((reason for said, reason in _OGG_CUT.items() if said in log), None)


def _sndfile_open(path: PathLike, opener: Callable[[str], _OpenT]) -> _OpenT:
    """``opener(path)`` (``sf.SoundFile`` or ``sf.info``) with the decoders' stderr captured, not shown;
    AudioError with the reason (and what the decoder said) when it fails."""
    with quiet_stderr() as noise:
        try:
            return opener(os.fspath(path))
        except (sf.LibsndfileError, RuntimeError, OSError) as exc:
            error = exc
    kind = "unsupported or corrupt audio file" if isinstance(error, sf.LibsndfileError) else "cannot open audio file"
    raise _error(path, f"{kind} ({_sndfile_reason(error, noise)})") from error


def _open_sound_file(path: PathLike) -> sf.SoundFile:
    """Open ``path`` for decoding, raising AudioError for anything unusable."""
    _check_path(path)
    truncation = _wav_truncation(path)
    if truncation is not None:
        raise _error(path, truncation)
    handle = _sndfile_open(path, sf.SoundFile)
    reason = _header_truncation(handle)
    if reason is None and (handle.frames <= 0 or handle.samplerate <= 0 or handle.channels <= 0):
        reason = "contains no audio samples (zero length)"
    if reason is not None:
        handle.close()
        raise _error(path, reason)
    return handle


def _short_read_reason(handle: sf.SoundFile, decoded: int) -> str | None:
    """Reason to reject a file that decoded to fewer frames than its header declares."""
    expected = handle.frames
    if decoded >= expected:
        return None
    if handle.format == "MP3" and decoded >= expected * (1.0 - _MP3_SHORTFALL):
        return None
    return f"truncated or corrupt audio: decoded {decoded} of {expected} frames"


def _decode_blocks(handle: sf.SoundFile, path: PathLike, block_frames: int) -> Iterator[np.ndarray]:
    """Yield mono float32 blocks of at most ``block_frames`` input frames."""
    decoded = 0
    while True:
        with quiet_stderr() as noise:
            try:
                block = handle.read(block_frames, dtype="float32", always_2d=True)
                error: Exception | None = None
            except (sf.LibsndfileError, RuntimeError, OSError) as exc:
                error = exc
        if error is not None:
            raise _error(path, f"decoding failed ({_sndfile_reason(error, noise)})") from error
        if block.shape[0] == 0:
            break
        mono = block[:, 0].copy() if block.shape[1] == 1 else block.mean(axis=1, dtype=np.float32)
        bad = np.flatnonzero(~np.isfinite(mono))
        if bad.size:  # float files can hold NaN / Inf, which every later step would turn into garbage
            at = (decoded + bad[0]) / handle.samplerate
            raise _error(path, f"non-finite samples (NaN or Inf), the first at {at:.3f} s")
        decoded += block.shape[0]
        yield mono
    reason = _short_read_reason(handle, decoded)
    if reason is not None:
        raise _error(path, reason)
    if decoded == 0:
        raise _error(path, "contains no audio samples (zero length)")


def _check_rate(sample_rate: int) -> None:
    """Reject non-positive target sample rates."""
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")


def load_audio(path: PathLike, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Decode ``path`` to mono float32 at ``sample_rate`` (soxr HQ resampling).

    Channels are averaged. Raises AudioError (message ``"<path>: <reason>"``) for a
    missing, empty, truncated, corrupt, unsupported or zero-length file.
    """
    _check_rate(sample_rate)
    with _open_sound_file(path) as handle:
        source_rate = handle.samplerate
        blocks = list(_decode_blocks(handle, path, _READ_BLOCK_FRAMES))
    audio = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
    if source_rate != sample_rate:
        audio = soxr.resample(audio, source_rate, sample_rate, quality=RESAMPLE_QUALITY)
    return np.ascontiguousarray(audio, dtype=np.float32)


def audio_duration(path: PathLike) -> float:
    """Duration of ``path`` in seconds from its header, without decoding it."""
    _check_path(path)
    info = _sndfile_open(path, sf.info)
    if info.samplerate <= 0:
        raise _error(path, "invalid sample rate in header")
    return info.frames / info.samplerate


class AudioStream:
    """Decode a long file as consecutive mono float32 chunks with flat memory use.

    The file is opened (and validated) on construction; iterating yields chunks of
    ``round(chunk_seconds * sample_rate)`` samples, the last one possibly shorter.
    Concatenated, the chunks equal :func:`load_audio` of the same file.
    """

    def __init__(
        self,
        path: PathLike,
        sample_rate: int = SAMPLE_RATE,
        chunk_seconds: float = float(CHUNK_LENGTH),
        block_frames: int = _READ_BLOCK_FRAMES,
    ) -> None:
        _check_rate(sample_rate)
        if chunk_seconds <= 0:
            raise ValueError(f"chunk_seconds must be positive, got {chunk_seconds}")
        if block_frames <= 0:
            raise ValueError(f"block_frames must be positive, got {block_frames}")
        self.path = path
        self.sample_rate = sample_rate
        self.chunk_samples = max(1, round(chunk_seconds * sample_rate))
        self.block_frames = block_frames
        self._handle: sf.SoundFile | None = _open_sound_file(path)
        self.source_rate: int = self._handle.samplerate
        self.channels: int = self._handle.channels
        self.duration: float = self._handle.frames / self._handle.samplerate

    def _resampled_blocks(self, handle: sf.SoundFile) -> Iterator[np.ndarray]:
        """Decoded blocks passed through a streaming resampler (if rates differ)."""
        blocks = _decode_blocks(handle, self.path, self.block_frames)
        if self.source_rate == self.sample_rate:
            yield from blocks
            return
        stream = soxr.ResampleStream(
            self.source_rate, self.sample_rate, 1, dtype="float32", quality=RESAMPLE_QUALITY
        )
        for block in blocks:
            out = stream.resample_chunk(block)
            if out.size:
                yield out
        tail = stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        if tail.size:
            yield tail

    def __iter__(self) -> Iterator[np.ndarray]:
        """Yield fixed-size chunks; the stream can be iterated once."""
        if self._handle is None:
            raise RuntimeError("AudioStream is closed or was already consumed")
        handle = self._handle
        pending: list[np.ndarray] = []
        pending_len = 0
        try:
            for block in self._resampled_blocks(handle):
                pending.append(block)
                pending_len += block.size
                while pending_len >= self.chunk_samples:
                    joined = np.concatenate(pending) if len(pending) > 1 else pending[0]
                    yield np.ascontiguousarray(joined[: self.chunk_samples])
                    rest = joined[self.chunk_samples :]
                    pending, pending_len = ([rest.copy()], rest.size) if rest.size else ([], 0)
            if pending_len:
                yield np.concatenate(pending) if len(pending) > 1 else pending[0]
        finally:
            self.close()

    def close(self) -> None:
        """Release the underlying file."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> AudioStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def iter_audio_chunks(
    path: PathLike,
    chunk_seconds: float = float(CHUNK_LENGTH),
    sample_rate: int = SAMPLE_RATE,
) -> Iterator[np.ndarray]:
    """Yield mono float32 chunks of ``chunk_seconds`` at ``sample_rate`` (last may be short).

    Validation errors surface as AudioError on the first ``next()``.
    """
    with AudioStream(path, sample_rate=sample_rate, chunk_seconds=chunk_seconds) as stream:
        yield from stream


# ---------------------------------------------------------------------------
# Log-mel features (Whisper)
# ---------------------------------------------------------------------------


def _hz_to_mel(freq: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz, logarithmic above."""
    freq = np.asarray(freq, dtype=np.float64)
    linear = 3.0 * freq / 200.0
    logarithmic = 15.0 + np.log(np.maximum(freq, 1e-10) / 1000.0) * (27.0 / np.log(6.4))
    return np.where(freq >= 1000.0, logarithmic, linear)


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_hz_to_mel`."""
    mels = np.asarray(mels, dtype=np.float64)
    linear = 200.0 * mels / 3.0
    logarithmic = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mels - 15.0))
    return np.where(mels >= 15.0, logarithmic, linear)


@functools.lru_cache(maxsize=8)
def _slaney_filters_np(sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    """Read-only Slaney-normalised mel filterbank ``[n_mels, n_fft // 2 + 1]`` (float32), ``fmin``-``fmax`` Hz."""
    fft_freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    mel_points = np.linspace(_hz_to_mel(np.array(fmin)), _hz_to_mel(np.array(fmax)), n_mels + 2)
    hz_points = _mel_to_hz(mel_points)
    widths = np.diff(hz_points)
    ramps = hz_points[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (hz_points[2:] - hz_points[:-2]))[:, None]
    weights = weights.astype(np.float32)
    weights.setflags(write=False)
    return weights


def mel_filters(n_mels: int = 80, device: torch.device | str | None = None) -> torch.Tensor:
    """Whisper's mel filterbank ``[n_mels, 201]`` (slaney scale and norm, 0-8 kHz), a fresh tensor."""
    if not isinstance(n_mels, int) or n_mels < 1:
        raise ValueError(f"n_mels must be a positive int, got {n_mels!r}")
    return torch.tensor(_slaney_filters_np(SAMPLE_RATE, N_FFT, n_mels, 0.0, 8000.0), device=device)


def _as_float_tensor(audio: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Convert 1-D floating audio to a float32 tensor (no copy when already float32)."""
    if isinstance(audio, torch.Tensor):
        tensor = audio
    else:
        array = np.asarray(audio)
        if not np.issubdtype(array.dtype, np.floating):
            raise TypeError(f"audio must be floating point in [-1, 1], got dtype {array.dtype}")
        tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    if not tensor.is_floating_point():
        raise TypeError(f"audio must be floating point in [-1, 1], got dtype {tensor.dtype}")
    if tensor.dim() != 1:
        raise ValueError(f"audio must be 1-D (mono samples), got shape {tuple(tensor.shape)}")
    return tensor.to(torch.float32)


def log_mel_spectrogram(
    audio: torch.Tensor | np.ndarray,
    n_mels: int = 80,
    padding: int = 0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Whisper log-mel spectrogram ``[n_mels, len(audio + padding) // 160]`` of 16 kHz mono audio.

    Periodic Hann window 400, hop 160, centred reflect-padded STFT, last frame
    dropped, power spectrum, slaney mel filterbank, log10 clamped at 1e-10, dynamic
    range limited to 8 (log10 units) below the maximum, then ``(x + 4) / 4``.
    """
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    samples = _as_float_tensor(audio)
    if device is not None:
        samples = samples.to(device)
    if padding:
        samples = F.pad(samples, (0, padding))
    if samples.shape[0] <= N_FFT // 2:
        raise ValueError(f"need more than {N_FFT // 2} samples, got {samples.shape[0]}")
    window = torch.hann_window(N_FFT, device=samples.device)
    stft = torch.stft(samples, N_FFT, HOP_LENGTH, window=window, return_complex=True)
    magnitudes = (stft[..., :-1].abs() ** 2).contiguous()
    mel_spec = mel_filters(n_mels, device=samples.device) @ magnitudes
    log_spec = torch.clamp(mel_spec, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def pad_or_trim(array: _ArrayT, length: int = N_SAMPLES, axis: int = -1) -> _ArrayT:
    """Zero-pad or trim ``array`` along ``axis`` to exactly ``length`` (numpy or torch)."""
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    if isinstance(array, torch.Tensor):
        size = array.shape[axis]
        if size > length:
            return array.narrow(axis, 0, length)
        if size < length:
            pad = [0] * (2 * array.dim())
            pad[2 * (array.dim() - 1 - axis % array.dim()) + 1] = length - size
            return F.pad(array, pad)
        return array
    size = array.shape[axis]
    if size > length:
        return np.take(array, np.arange(length), axis=axis)
    if size < length:
        widths = [(0, 0)] * array.ndim
        widths[axis] = (0, length - size)
        return np.pad(array, widths)
    return array


def window_features(
    audio_16k: torch.Tensor | np.ndarray,
    n_mels: int = 80,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Features ``[1, n_mels, 3000]`` of one ≤30 s window, as WhisperFeatureExtractor computes them.

    The audio is zero-padded (or trimmed) to 480000 samples before the STFT, so the
    dynamic-range clamp sees the padding exactly as the reference does.
    """
    samples = pad_or_trim(_as_float_tensor(audio_16k), N_SAMPLES)
    mel = log_mel_spectrogram(samples, n_mels=n_mels, device=device)
    return mel[:, :N_FRAMES].unsqueeze(0)
