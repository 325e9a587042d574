"""CosyVoice zero-shot prompt frontend: prompt wav -> speech tokens, speaker embedding, prompt mel.

As upstream ``cosyvoice/cli/frontend.py`` (``_extract_speech_token``, ``_extract_spk_embedding``,
``_extract_speech_feat``, ``frontend_zero_shot``), from the official model directory:

- ``speech_tokenizer_v2.onnx`` (CosyVoice2) / ``speech_tokenizer_v3.onnx`` (CosyVoice3), run with
  onnxruntime on the 128-bin Whisper log-mel of the 16 kHz prompt (at most 30 s) and its frame count
  -> prompt speech tokens at 25 Hz. The CUDA provider is used when ``device`` is CUDA and
  ``onnxruntime-gpu`` offers it (as upstream, CAM++ always runs on the CPU).
- ``campplus.onnx`` on the mean-subtracted 80-bin Kaldi fbank of the 16 kHz prompt -> 192-d embedding.
- the 24 kHz prompt mel (Matcha ``mel_spectrogram``, the yaml's ``feat_extractor``), truncated together
  with the tokens so that it has exactly two frames per token.
- ``spk2info.pt`` stored speakers, read with ``torch.load(weights_only=True)`` (no arbitrary unpickling).

The prompt wav is decoded once (:mod:`specli.io.audio`) and resampled to 16 and 24 kHz with soxr.
Text normalisation and tokenisation are not done here; the transcript is passed through.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soxr
import torch

from specli.tts.acoustic.checkpoint import safe_torch_load
from specli.tts.acoustic.features import prompt_mel, speaker_fbank, whisper_log_mel
from specli.tts.acoustic.spec import SPEAKER_DIM, AcousticSpec, acoustic_spec
from specli.io.audio import RESAMPLE_QUALITY, AudioStream, load_audio
from specli.models.cosyvoice.layout import ModelKind
from specli.models.cosyvoice.yaml import read_hyperpyyaml
from specli.errors import AudioError, ModelLoadError, UsageError

__all__ = ["MAX_PROMPT_SECONDS", "Frontend", "PromptInputs", "StoredSpeaker", "load_speakers", "read_acoustic_spec"]

MAX_PROMPT_SECONDS = 30.0  # the speech tokenizer's limit (upstream asserts it)
MIN_PROMPT_RATE = 16000  # upstream's load_wav refuses prompts recorded below 16 kHz
SPEECH_TOKEN_SIZE = 6561  # speech codes 0..6560 (3^8 FSQ)
TOKENIZER_FILES: dict[str, str] = {"cosyvoice2": "speech_tokenizer_v2.onnx", "cosyvoice3": "speech_tokenizer_v3.onnx"}
INSTALL_HINT = "install the 'tts' extra: pip install 'specli[tts]' (onnxruntime; onnxruntime-gpu for CUDA)"
PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class PromptInputs:
    """What the LLM and flow stages take from a zero-shot prompt (batch of one, CPU tensors)."""

    speech_tokens: torch.Tensor  # [1, N] int64 prompt speech tokens (25 Hz official, the model's token rate)
    speaker_embedding: torch.Tensor  # [1, 192] float32 CAM++ x-vector (flow stage only; zeros without CAM++)
    prompt_mel: torch.Tensor  # [1, ratio N, n_mels] float32 log-mel, exactly token_mel_ratio frames per token
    prompt_text: str  # the prompt's transcript as given (stripped)
    duration_s: float  # prompt length in seconds


@dataclass(frozen=True)
class StoredSpeaker:
    """One ``spk2info.pt`` entry: an SFT speaker (embedding only) or a saved zero-shot prompt."""

    embedding: torch.Tensor  # [1, 192] float32
    speech_tokens: torch.Tensor | None  # [1, N] int64 (saved zero-shot prompts only)
    prompt_mel: torch.Tensor | None  # [1, 2N, 80] float32 (saved zero-shot prompts only)
    prompt_text_tokens: torch.Tensor | None  # [1, M] int64 text-token ids of the prompt transcript


def _onnxruntime() -> Any:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise ModelLoadError(f"onnxruntime is not installed: {INSTALL_HINT}") from exc
    return ort


def _describe(args: Sequence[Any]) -> str:
    return ", ".join(f"{a.name}: {a.type} {list(a.shape)}" for a in args) or "nothing"


class _OnnxModel:
    """An onnxruntime session over one model file, with load and run failures as ModelLoadError."""

    def __init__(self, path: PathLike, cuda_device: int | None) -> None:
        ort = _onnxruntime()
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelLoadError(f"{self.path}: model file not found")
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only; nothing from onnxruntime reaches stderr otherwise
        options.intra_op_num_threads = max(1, torch.get_num_threads())
        providers: list[Any] = ["CPUExecutionProvider"]
        if cuda_device is not None and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": cuda_device}))
        try:
            self.session = ort.InferenceSession(str(self.path), options, providers=providers)
        except Exception as exc:  # onnxruntime's InvalidProtobuf / Fail / NoSuchFile derive from Exception only
            detail = " ".join(str(exc).split())[:300]
            raise ModelLoadError(f"{self.path}: not a loadable ONNX model ({detail})") from exc
        self.inputs = self.session.get_inputs()
        self.outputs = self.session.get_outputs()

    def check(self, ok: bool, expected: str) -> None:
        """Reject a model whose signature is not the one the frontend feeds."""
        if not ok:
            raise ModelLoadError(f"{self.path}: unexpected model signature: expected {expected}; found inputs "
                                 f"({_describe(self.inputs)}) and outputs ({_describe(self.outputs)})")

    def run(self, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        try:
            return np.asarray(self.session.run([self.outputs[0].name], dict(feeds))[0])
        except Exception as exc:  # onnxruntime's run errors derive from Exception only
            detail = " ".join(str(exc).split())[:300]
            raise ModelLoadError(f"{self.path}: the model failed to run ({detail})") from exc


def _static(dim: Any, size: int) -> bool:
    """True when an ONNX dim is symbolic/unknown or equals ``size``."""
    return not isinstance(dim, int) or dim == size


class SpeechTokenizer:
    """``speech_tokenizer_v{2,3}.onnx``: Whisper log-mel ``[1, n_mels, T]`` + its length -> speech token ids."""

    def __init__(self, path: PathLike, cuda_device: int | None = None, n_mels: int = 128,
                 vocab: int = SPEECH_TOKEN_SIZE) -> None:
        self.model = m = _OnnxModel(path, cuda_device)
        self.n_mels, self.vocab = n_mels, vocab
        ok = (len(m.inputs) == 2 and m.inputs[0].type == "tensor(float)" and len(m.inputs[0].shape) == 3
              and _static(m.inputs[0].shape[1], n_mels) and m.inputs[1].type == "tensor(int32)"
              and len(m.outputs) >= 1 and "int" in m.outputs[0].type)
        m.check(ok, f"inputs (float32 [1, {n_mels}, T], int32 [1]) and an integer token output")

    def __call__(self, mel: torch.Tensor) -> torch.Tensor:  # [1, n_mels, T] -> [1, N] int64
        feeds = {self.model.inputs[0].name: mel.detach().cpu().numpy().astype(np.float32),
                 self.model.inputs[1].name: np.array([mel.shape[2]], dtype=np.int32)}
        tokens = self.model.run(feeds).reshape(-1).astype(np.int64)
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab):
            raise ModelLoadError(f"{self.model.path}: produced speech token {int(tokens.max())} outside "
                                 f"0..{self.vocab - 1}")
        return torch.from_numpy(tokens).unsqueeze(0)


class SpeakerEncoder:
    """``campplus.onnx``: mean-subtracted fbank ``[1, T, 80]`` -> speaker embedding ``[1, dim]``."""

    def __init__(self, path: PathLike, dim: int = 192) -> None:
        self.model = m = _OnnxModel(path, cuda_device=None)
        self.dim = dim
        ok = (len(m.inputs) == 1 and m.inputs[0].type == "tensor(float)" and len(m.inputs[0].shape) == 3
              and _static(m.inputs[0].shape[2], 80) and len(m.outputs) >= 1 and m.outputs[0].type == "tensor(float)")
        m.check(ok, "one float32 [1, T, 80] input and a float32 embedding output")

    def __call__(self, fbank: torch.Tensor) -> torch.Tensor:  # [T, 80] -> [1, dim]
        out = self.model.run({self.model.inputs[0].name: fbank.unsqueeze(0).cpu().numpy().astype(np.float32)})
        if out.size != self.dim:
            raise ModelLoadError(f"{self.model.path}: embedding has {out.size} values, expected {self.dim}")
        return torch.from_numpy(out.reshape(1, self.dim).astype(np.float32))


def _tensor(entry: Any, key: str, dtype: torch.dtype) -> torch.Tensor | None:
    value = entry.get(key) if isinstance(entry, Mapping) else None
    return value.to(dtype) if isinstance(value, torch.Tensor) else None


def load_speakers(path: PathLike, dim: int = 192) -> dict[str, StoredSpeaker]:
    """Read ``spk2info.pt`` ({speaker id: {'embedding' | 'flow_embedding', ...}}) without unpickling objects."""
    raw = safe_torch_load(path, "speaker file")
    if not isinstance(raw, Mapping):
        raise ModelLoadError(f"{os.fspath(path)}: expected a mapping of speaker ids, got {type(raw).__name__}")
    speakers: dict[str, StoredSpeaker] = {}
    for spk_id, entry in raw.items():
        emb = _tensor(entry, "flow_embedding", torch.float32)  # a saved zero-shot prompt
        if emb is None:
            emb = _tensor(entry, "embedding", torch.float32)  # an SFT speaker
        if emb is None or emb.numel() != dim:
            raise ModelLoadError(f"{os.fspath(path)}: speaker {spk_id!r} has no {dim}-value embedding")
        speakers[str(spk_id)] = StoredSpeaker(
            emb.reshape(1, dim),
            _tensor(entry, "flow_prompt_speech_token", torch.int64),
            _tensor(entry, "prompt_speech_feat", torch.float32),
            _tensor(entry, "prompt_text", torch.int64),
        )
    return speakers


class Frontend:
    """Prompt processing for one CosyVoice model directory; see the module docstring."""

    def __init__(self, kind: ModelKind, tokenizer: SpeechTokenizer, speaker_encoder: SpeakerEncoder | None,
                 spec: AcousticSpec, speakers_path: Path | None = None) -> None:
        self.kind = kind
        self.tokenizer = tokenizer
        self.speaker_encoder = speaker_encoder
        self.spec = spec  # the prompt mel's settings, frames per token, the tokenizer's input bins
        self.speakers_path = speakers_path
        self._speakers: dict[str, StoredSpeaker] | None = None

    @classmethod
    def from_dir(cls, model_dir: PathLike, kind: ModelKind | None = None,
                 device: torch.device | str = "cpu") -> Frontend:
        """Open the ONNX models of ``model_dir``; ``kind`` defaults to the tokenizer file present (v3 first)."""
        root = Path(model_dir)
        if not root.is_dir():
            raise ModelLoadError(f"{root}: model directory not found")
        if kind is None:
            found = [k for k in ("cosyvoice3", "cosyvoice2") if (root / TOKENIZER_FILES[k]).is_file()]
            if not found:
                raise ModelLoadError(f"{root}: no {' or '.join(TOKENIZER_FILES.values())} in the model directory")
            kind = found[0]  # type: ignore[assignment]
        if kind not in TOKENIZER_FILES:
            raise ValueError(f"unknown CosyVoice kind {kind!r}")
        spec = read_acoustic_spec(root / f"{kind}.yaml", kind)
        dev = torch.device(device)
        cuda_device = (dev.index or 0) if dev.type == "cuda" else None
        tokenizer = SpeechTokenizer(root / TOKENIZER_FILES[kind], cuda_device, spec.tokenizer_mels,
                                    spec.speech_token_size)
        encoder = SpeakerEncoder(root / "campplus.onnx") if spec.speaker_encoder else None
        speakers = root / "spk2info.pt"
        return cls(kind, tokenizer, encoder, spec, speakers if speakers.is_file() else None)

    @property
    def speakers(self) -> dict[str, StoredSpeaker]:
        """Stored speakers of ``spk2info.pt`` (empty when the directory has none); read on first use."""
        if self._speakers is None:
            self._speakers = {} if self.speakers_path is None else load_speakers(self.speakers_path)
        return self._speakers

    def speaker(self, spk_id: str) -> StoredSpeaker:
        """One stored speaker; an unknown id is a UsageError listing some known ones."""
        known = self.speakers
        if spk_id not in known:
            names = ", ".join(sorted(known)[:10]) or "none (no spk2info.pt)"
            raise UsageError(f"unknown speaker {spk_id!r}; stored speakers: {names}")
        return known[spk_id]

    def prompt(self, wav_path: PathLike, prompt_text: str) -> PromptInputs:
        """Tokens, embedding and mel of a prompt recording (<= 30 s, >= 16 kHz); bad audio is an AudioError."""
        audio_16k, audio_mel = _load_prompt(wav_path, self.spec.mel.sample_rate)
        return self.prompt_from_audio(audio_16k, audio_mel, prompt_text, wav_path)

    def prompt_from_audio(self, audio_16k: np.ndarray, audio_mel: np.ndarray, prompt_text: str,
                          name: PathLike = "<prompt>") -> PromptInputs:
        """:meth:`prompt` on already decoded mono float32 audio at 16 kHz and at the mel's rate."""
        mel_spec, ratio = self.spec.mel, self.spec.token_mel_ratio
        seconds = audio_16k.shape[0] / 16000
        if seconds > MAX_PROMPT_SECONDS:
            raise AudioError(f"{os.fspath(name)}: prompt is {seconds:.1f} s long; the speech tokenizer takes at "
                             f"most {MAX_PROMPT_SECONDS:.0f} s")
        if audio_16k.shape[0] < 400 or audio_mel.shape[0] < 2 * mel_spec.hop:
            raise AudioError(f"{os.fspath(name)}: prompt is too short ({seconds * 1000:.0f} ms)")
        tokens = self.tokenizer(whisper_log_mel(audio_16k, self.spec.tokenizer_mels))  # [1, N]
        embedding = (self.speaker_encoder(speaker_fbank(audio_16k)) if self.speaker_encoder is not None
                     else torch.zeros(1, SPEAKER_DIM))  # [1, 192]
        mel = prompt_mel(audio_mel, mel_spec.fmax, mel_spec.n_fft, mel_spec.hop, mel_spec.n_mels,
                         mel_spec.sample_rate, mel_spec.fmin).transpose(1, 2)  # [1, F, n_mels]
        token_len = min(mel.shape[1] // ratio, tokens.shape[1])
        if token_len == 0:
            raise AudioError(f"{os.fspath(name)}: prompt is too short to yield a speech token")
        return PromptInputs(tokens[:, :token_len].contiguous(), embedding, mel[:, : ratio * token_len].contiguous(),
                            prompt_text.strip(), seconds)


def read_acoustic_spec(yaml_path: Path, kind: ModelKind) -> AcousticSpec:
    """The acoustic spec of a model's yaml; the official one of ``kind`` when there is no yaml."""
    if not yaml_path.is_file():
        return acoustic_spec({}, kind, yaml_path)
    try:
        cfg = read_hyperpyyaml(yaml_path)
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{yaml_path}: unreadable model configuration ({exc})") from exc
    return acoustic_spec(cfg, kind, yaml_path)


def _load_prompt(path: PathLike, mel_rate: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode ``path`` once and resample to 16 kHz and to ``mel_rate``; reject > 30 s and < 16 kHz first."""
    with AudioStream(path) as stream:
        rate, duration = stream.source_rate, stream.duration
    if duration > MAX_PROMPT_SECONDS:
        raise AudioError(f"{os.fspath(path)}: prompt is {duration:.1f} s long; the speech tokenizer takes at "
                         f"most {MAX_PROMPT_SECONDS:.0f} s")
    if rate < MIN_PROMPT_RATE:
        raise AudioError(f"{os.fspath(path)}: prompt sample rate {rate} Hz is below {MIN_PROMPT_RATE} Hz")
    audio = load_audio(path, sample_rate=rate)
    resampled = [audio if rate == target else soxr.resample(audio, rate, target, quality=RESAMPLE_QUALITY)
                 for target in (16000, mel_rate)]
    return tuple(np.ascontiguousarray(a, dtype=np.float32) for a in resampled)  # type: ignore[return-value]
