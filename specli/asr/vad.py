"""Voice activity detection (Silero VAD through onnxruntime) and transcription of speech only.

The Silero VAD v5 model ships as an ONNX file inside the ``silero-vad`` wheel; it is found on disk
without importing that package (its Python module imports torch and changes torch's thread count), so
only ``onnxruntime`` runs it. The speech-timestamp rules and option names follow faster-whisper's
``VadOptions`` (which follow Silero's ``get_speech_timestamps``), with faster-whisper's defaults.

With VAD on, a file is read fully, its speech chunks (each at most ``max_speech_duration_s``) are
concatenated and transcribed as one stream, and every time is mapped back to the original file.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import importlib.util
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specli.io.audio import SAMPLE_RATE
from specli.asr.fallback import AR, DecodeMethod
from specli.asr.windows import FileSteps, Segment, TranscribeOptions, run_alone, transcribe_steps
from specli.errors import ModelLoadError
from specli.models.speech import SpeechModel

FRAME_SAMPLES = 512  # samples per Silero frame at 16 kHz (32 ms)
CONTEXT_SAMPLES = 64  # trailing samples of the previous frame the v5 model sees before each frame
STATE_SHAPE = (2, 1, 128)  # recurrent state [2, batch, 128]
MODEL_FILE = "data/silero_vad.onnx"  # inside the silero_vad package directory
INSTALL_HINT = "install the 'vad' extra: pip install 'specli[vad]' (silero-vad, onnxruntime)"

Span = tuple[int, int]  # [start, end) in samples of the original 16 kHz audio


@dataclass(frozen=True)
class VadOptions:
    """faster-whisper's VadOptions semantics and defaults (Silero's get_speech_timestamps rules)."""

    threshold: float = 0.5  # a frame whose speech probability is >= this starts or continues speech
    neg_threshold: float | None = None  # in speech, frames below this count as silence (None: threshold - 0.15)
    min_speech_duration_ms: int = 250  # speech chunks this short or shorter are dropped
    max_speech_duration_s: float = 30.0  # longer chunks split at the last silence > 98 ms (else cut hard)
    min_silence_duration_ms: int = 2000  # silence this long ends a speech chunk
    speech_pad_ms: int = 400  # padding added on each side of every chunk (halved gaps when chunks are near)

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be within (0, 1), got {self.threshold}")
        if self.neg_threshold is not None and not 0.0 < self.neg_threshold <= self.threshold:
            raise ValueError(f"neg_threshold must be within (0, threshold], got {self.neg_threshold}")
        if self.min_speech_duration_ms < 0 or self.min_silence_duration_ms < 0 or self.speech_pad_ms < 0:
            raise ValueError("min_speech_duration_ms, min_silence_duration_ms and speech_pad_ms must be >= 0")
        max_samples = SAMPLE_RATE * self.max_speech_duration_s
        if not max_samples > FRAME_SAMPLES + 2 * self.speech_pad_ms * SAMPLE_RATE / 1000:
            raise ValueError("max_speech_duration_s must exceed one frame (32 ms) plus twice speech_pad_ms")

    @property
    def exit_threshold(self) -> float:
        """The threshold below which a frame ends speech (hysteresis)."""
        return self.neg_threshold if self.neg_threshold is not None else max(self.threshold - 0.15, 0.01)


# ---------------------------------------------------------------------------
# The ONNX model
# ---------------------------------------------------------------------------


def silero_model_path() -> Path:
    """Path of ``silero_vad.onnx`` in the installed ``silero-vad`` package, without importing it."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"Silero VAD model not found: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise ModelLoadError(f"{path}: Silero VAD model file missing from the silero-vad package")
    return path


class SileroVad:
    """Silero VAD v5 run with onnxruntime on the CPU: one speech probability per 512-sample frame."""

    def __init__(self, path: str | Path | None = None) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise ModelLoadError(f"onnxruntime is not installed: {INSTALL_HINT}") from exc
        self.path = Path(path) if path is not None else silero_model_path()
        so = ort.SessionOptions()
        so.log_severity_level = 3  # errors only: onnxruntime's warnings never reach stderr
        so.intra_op_num_threads = 1  # a 32-ms frame is far too small to share between threads
        so.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(str(self.path), so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's Fail / InvalidProtobuf / NoSuchFile derive from Exception only
            raise ModelLoadError(f"{self.path}: cannot load the Silero VAD model ({exc})") from exc
        inputs = {i.name for i in self.session.get_inputs()}
        outputs = [o.name for o in self.session.get_outputs()]
        if inputs != {"input", "state", "sr"} or len(outputs) != 2:
            raise ModelLoadError(f"{self.path}: not a Silero VAD v5 model (inputs {sorted(inputs)}, outputs {outputs})")
        self._outputs = outputs  # [probability [batch, 1], new state [2, batch, 128]]

    def probabilities(self, audio_16k: np.ndarray) -> np.ndarray:
        """Speech probability of each 512-sample frame ``[ceil(n / 512)]`` (last frame zero-padded)."""
        audio = np.ascontiguousarray(audio_16k, dtype=np.float32).reshape(-1)
        n_frames = math.ceil(audio.size / FRAME_SAMPLES)
        frames = np.zeros(n_frames * FRAME_SAMPLES + CONTEXT_SAMPLES, dtype=np.float32)
        frames[CONTEXT_SAMPLES : CONTEXT_SAMPLES + audio.size] = audio  # zero context before frame 0
        state = np.zeros(STATE_SHAPE, dtype=np.float32)
        sr = np.array(SAMPLE_RATE, dtype=np.int64)
        probs = np.empty(n_frames, dtype=np.float32)
        for i in range(n_frames):
            x = frames[None, i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES + CONTEXT_SAMPLES]  # [1, 64 + 512]
            out, state = self.session.run(self._outputs, {"input": x, "state": state, "sr": sr})
            probs[i] = out[0, 0]
        return probs


@functools.lru_cache(maxsize=2)
def load_vad(path: str | None = None) -> SileroVad:
    """The Silero VAD model, loaded once per process (per path)."""
    return SileroVad(path)


# ---------------------------------------------------------------------------
# Speech timestamps from frame probabilities
# ---------------------------------------------------------------------------


class _SpeechTracker:
    """Silero's hysteresis state machine over frame probabilities (sample positions in, spans out)."""

    def __init__(self, opts: VadOptions) -> None:
        pad = SAMPLE_RATE * opts.speech_pad_ms / 1000
        self.opts = opts
        self.min_silence = SAMPLE_RATE * opts.min_silence_duration_ms / 1000
        self.min_speech = SAMPLE_RATE * opts.min_speech_duration_ms / 1000
        self.max_speech = SAMPLE_RATE * opts.max_speech_duration_s - FRAME_SAMPLES - 2 * pad
        self.cut_silence = SAMPLE_RATE * 98 / 1000  # a silence this long is a place to split long speech
        self.spans: list[Span] = []
        self.start: int | None = None  # start of the current speech, None when not in speech
        self.silence_start: int | None = None  # start of the silence inside the current speech
        self.last_cut: int | None = None  # start of the latest silence > 98 ms in the current speech
        self.resume: int | None = None  # where speech came back after that silence

    def _close(self, end: int, keep_short: bool = True) -> None:
        if keep_short or end - self.start > self.min_speech:
            self.spans.append((self.start, end))
        self.start = self.silence_start = self.last_cut = self.resume = None

    def _split_long(self, pos: int) -> bool:
        """Split speech that reached the maximum length; True when ``pos``'s frame is consumed."""
        if self.last_cut is None:  # no pause to cut at: cut here, start afresh at the next frame
            self._close(pos)
            return True
        resume = self.resume if self.resume is not None and self.resume > self.last_cut else None
        self._close(self.last_cut)
        if resume is not None:  # speech came back after the pause: it opens the next chunk
            self.start = resume
        return False

    def step(self, pos: int, prob: float) -> None:
        """Feed the frame starting at sample ``pos``."""
        opts = self.opts
        if prob >= opts.threshold and self.silence_start is not None:
            self.silence_start = None
            if self.last_cut is not None and (self.resume is None or self.resume < self.last_cut):
                self.resume = pos
        if prob >= opts.threshold and self.start is None:
            self.start = pos
            return
        if self.start is not None and pos - self.start > self.max_speech and self._split_long(pos):
            return
        if prob < opts.exit_threshold and self.start is not None:
            if self.silence_start is None:
                self.silence_start = pos
            if pos - self.silence_start > self.cut_silence:
                self.last_cut, self.resume = self.silence_start, None
            if pos - self.silence_start >= self.min_silence:
                self._close(self.silence_start, keep_short=False)

    def finish(self, n_samples: int) -> list[Span]:
        if self.start is not None and n_samples - self.start > self.min_speech:
            self.spans.append((self.start, n_samples))
        return self.spans


def _pad(spans: list[Span], pad: int, n_samples: int) -> list[Span]:
    """Pad every span by ``pad`` samples each side; a gap shorter than two pads is split in half."""
    starts = [s for s, _ in spans]
    ends = [e for _, e in spans]
    for i in range(len(spans)):
        if i == 0:
            starts[0] = max(0, starts[0] - pad)
        if i + 1 < len(spans):
            gap = starts[i + 1] - ends[i]
            share = gap // 2 if gap < 2 * pad else pad
            ends[i] += share
            starts[i + 1] = max(0, starts[i + 1] - share)
        else:
            ends[i] = min(n_samples, ends[i] + pad)
    return list(zip(starts, ends))


def timestamps_from_probabilities(
    probs: Sequence[float], n_samples: int, opts: VadOptions = VadOptions()
) -> list[Span]:
    """Speech spans ``[(start, end), ...]`` in samples from per-frame probabilities of ``n_samples`` audio."""
    tracker = _SpeechTracker(opts)
    for i, p in enumerate(probs):
        tracker.step(i * FRAME_SAMPLES, float(p))
    spans = tracker.finish(n_samples)
    return _pad(spans, int(SAMPLE_RATE * opts.speech_pad_ms / 1000), n_samples)


def speech_timestamps(
    audio_16k: np.ndarray, opts: VadOptions = VadOptions(), model: SileroVad | None = None
) -> list[Span]:
    """Speech spans ``[(start_sample, end_sample), ...]`` of 16 kHz mono audio, in order, not overlapping."""
    audio = np.asarray(audio_16k, dtype=np.float32).reshape(-1)
    if audio.size == 0:
        return []
    probs = (model or load_vad()).probabilities(audio)
    return timestamps_from_probabilities(probs, audio.size, opts)


# ---------------------------------------------------------------------------
# Speech-only audio and the map back to file time
# ---------------------------------------------------------------------------


def collect_speech(audio_16k: np.ndarray, spans: Sequence[Span]) -> list[np.ndarray]:
    """The speech pieces of ``audio_16k`` (views), in order; concatenated they are the speech-only audio."""
    return [audio_16k[s:e] for s, e in spans]


class TimeMap:
    """Maps a time in the concatenated speech-only audio back to a time in the original file."""

    def __init__(self, spans: Sequence[Span], sample_rate: int = SAMPLE_RATE) -> None:
        self.spans = list(spans)
        self.sample_rate = sample_rate
        self._offsets: list[int] = []  # start of each span in the concatenated audio (samples)
        self._ends: list[int] = []  # end of each span in the concatenated audio (samples)
        total = 0
        for s, e in self.spans:
            self._offsets.append(total)
            total += e - s
            self._ends.append(total)

    @property
    def speech_seconds(self) -> float:
        return (self._ends[-1] if self._ends else 0) / self.sample_rate

    def span_index(self, t: float, is_end: bool = False) -> int:
        """Index of the span holding concatenated time ``t``; a boundary belongs to the later span for a
        start, to the earlier one for an end."""
        sample = t * self.sample_rate
        find = bisect.bisect_left if is_end else bisect.bisect_right
        return min(find(self._ends, sample), len(self._ends) - 1)

    def to_original(self, t: float, is_end: bool = False, index: int | None = None) -> float:
        """Original-file time (s, rounded to ms) of concatenated time ``t`` (in span ``index`` if given)."""
        if not self.spans:
            return t
        k = self.span_index(t, is_end) if index is None else index
        start, end = self.spans[k]
        sample = start + t * self.sample_rate - self._offsets[k]
        return round(min(max(sample, start), end) / self.sample_rate, 3)


def _remap_words(words, tmap: TimeMap, first: int, last: int):
    """Word timings mapped through the span holding each word's middle (a word never straddles a gap), one of the
    spans ``first..last`` of its segment (an instant word on the segment's closing boundary stays inside it)."""
    mapped = []
    for w in words:
        k = min(max(tmap.span_index((w.start + w.end) / 2), first), last)
        mapped.append(dataclasses.replace(w, start=tmap.to_original(w.start, index=k),
                                          end=tmap.to_original(w.end, is_end=True, index=k)))
    return type(words)(mapped) if isinstance(words, tuple) else mapped


def remap_segment(seg: Segment, tmap: TimeMap) -> Segment:
    """``seg`` with its start/end (and word timings, when it has them) in original-file time."""
    start = tmap.to_original(seg.start)
    end = max(start, tmap.to_original(seg.end, is_end=True))
    changes: dict = {"start": start, "end": end}
    words = seg.words
    if words:
        changes["words"] = _remap_words(words, tmap, tmap.span_index(seg.start), tmap.span_index(seg.end, is_end=True))
    return dataclasses.replace(seg, **changes)


def read_all(chunks: Iterable[np.ndarray]) -> np.ndarray:
    """The whole stream of 16 kHz ``chunks`` as one array ``[samples]`` (VAD reads a file fully)."""
    pieces = list(chunks)
    return np.concatenate(pieces) if len(pieces) > 1 else (pieces[0] if pieces else np.zeros(0, np.float32))


def speech_steps(
    model: SpeechModel,
    chunks: Iterable[np.ndarray],
    opts: TranscribeOptions,
    vad: VadOptions,
    decode: DecodeMethod = AR,
    on_window: Callable[[float], None] | None = None,
    vad_model: SileroVad | None = None,
) -> FileSteps:
    """Only the speech of ``chunks`` transcribed, as a step machine (:func:`transcribe_speech` runs it on its
    own; :func:`specli.asr.windows.transcribe_steps` over the speech spans)."""
    audio = read_all(chunks)
    spans = speech_timestamps(audio, vad, vad_model or load_vad())
    tmap = TimeMap(spans)
    cb = None if on_window is None else (lambda s: on_window(tmap.to_original(s, is_end=True)))
    result = yield from transcribe_steps(model, collect_speech(audio, spans), opts, decode=decode, on_window=cb)
    result.stats.audio_seconds = audio.size / SAMPLE_RATE
    if on_window is not None:
        on_window(audio.size / SAMPLE_RATE)
    return dataclasses.replace(result, segments=[remap_segment(s, tmap) for s in result.segments])


transcribe_speech = run_alone(speech_steps, "transcribe_speech", """\
Transcribe only the speech of 16 kHz mono ``chunks`` (read fully); times are the original file's.

Audio without speech gives a result without segments. ``stats.audio_seconds`` is the whole file.
Runs :func:`speech_steps` (same arguments), answering each request on its own.""")
