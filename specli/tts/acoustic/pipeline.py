"""Speech tokens -> mel -> audio for one CosyVoice model directory (the acoustic half of synthesis).

:class:`Vocalizer` holds the flow stage (``flow.pt``, :mod:`specli.tts.acoustic.flow`) and the HiFT vocoder
(``hift.pt``, :mod:`specli.tts.acoustic.hift`), both configured from the model's yaml, and opens the ONNX
frontend (:mod:`specli.tts.acoustic.frontend`) only when a voice prompt needs it. :meth:`Vocalizer.render`
does what upstream's ``token2wav`` does offline (``stream=False``): CosyVoice3 drops silent tokens after
5 in a row, the flow runs with full attention from the fixed noise, HiFT vocodes the whole mel (source
noise from the caller's generator: same seed, same samples), and the audio is resampled with soxr when
another rate is asked for. Stage times are measured for the real-time factors.
"""

from __future__ import annotations

import io
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import soundfile as sf
import soxr
import torch

from specli.tts.acoustic.cfm import NOISE_FRAMES, drop_silent_runs
from specli.tts.acoustic.flow import flow_config, flow_path, load_flow
from specli.tts.acoustic.frontend import Frontend, PromptInputs, StoredSpeaker
from specli.tts.acoustic.hift import HiFT, HiFTConfig, load_hift
from specli.io.audio import RESAMPLE_QUALITY
from specli.models.cosyvoice.layout import ModelKind
from specli.models.cosyvoice.yaml import read_hyperpyyaml
from specli.errors import ModelLoadError, SpecliError
from specli.io.atomic import write_atomic_with

__all__ = ["AudioFormat", "RenderError", "RenderedAudio", "VoicePrompt", "Vocalizer", "encode_audio",
           "write_audio_atomic"]

AudioFormat = Literal["wav", "flac"]
NATIVE_RATE = 24000  # CosyVoice2/3 output rate
SPEAKER_DIM = 192


class RenderError(SpecliError):
    """One utterance cannot be rendered (no speech tokens, longer than the flow's 300 s); the batch goes on."""

    exit_code = 1


@dataclass(frozen=True)
class VoicePrompt:
    """What the flow stage takes from a voice prompt (batch of one, CPU tensors)."""

    speech_tokens: torch.Tensor  # [1, P] int64 prompt speech tokens (may be empty)
    prompt_mel: torch.Tensor  # [1, 2P, 80] float32 prompt mel (empty when there are no tokens)
    embedding: torch.Tensor  # [1, 192] float32 x-vector (zeros: none)

    def __post_init__(self) -> None:
        tokens, mel = self.speech_tokens.shape[1], self.prompt_mel.shape[1]
        if mel != 2 * tokens:
            raise ValueError(f"prompt mel has {mel} frames for {tokens} prompt tokens (need exactly 2 per token)")

    @classmethod
    def none(cls) -> VoicePrompt:
        """No prompt: no prompt frames and a zero speaker embedding."""
        return cls(torch.zeros(1, 0, dtype=torch.int64), torch.zeros(1, 0, 80), torch.zeros(1, SPEAKER_DIM))

    @classmethod
    def from_prompt(cls, prompt: PromptInputs) -> VoicePrompt:
        return cls(prompt.speech_tokens, prompt.prompt_mel, prompt.speaker_embedding)

    @classmethod
    def from_speaker(cls, speaker: StoredSpeaker) -> VoicePrompt:
        """A stored speaker: its saved prompt tokens and mel when it has both, else the embedding alone."""
        tokens, mel = speaker.speech_tokens, speaker.prompt_mel
        if tokens is None or mel is None or mel.shape[-2] != 2 * tokens.shape[-1]:
            return cls(torch.zeros(1, 0, dtype=torch.int64), torch.zeros(1, 0, 80), speaker.embedding)
        return cls(tokens.reshape(1, -1), mel.reshape(1, -1, 80), speaker.embedding)


@dataclass(frozen=True)
class RenderedAudio:
    """Audio of one utterance and how long each acoustic stage took."""

    audio: np.ndarray  # [samples] float32 mono in [-1, 1] at sample_rate
    sample_rate: int  # Hz
    flow_tokens: int  # speech tokens given to the flow (after CosyVoice3's silence rule)
    mel_frames: int  # mel frames vocoded (2 per flow token)
    flow_seconds: float  # wall time of the flow stage
    vocoder_seconds: float  # wall time of HiFT (+ resampling)

    @property
    def duration(self) -> float:
        """Seconds of audio."""
        return self.audio.shape[0] / self.sample_rate


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Vocalizer:
    """Flow + HiFT (+ the prompt frontend on demand) of one CosyVoice model directory."""

    def __init__(self, kind: ModelKind, flow: torch.nn.Module, hift: HiFT, model_dir: Path | None = None,
                 device: torch.device | str = "cpu") -> None:
        self.kind, self.flow, self.hift = kind, flow, hift
        self.model_dir = model_dir
        self.device = torch.device(device)
        self._frontend: Frontend | None = None

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike[str], kind: ModelKind,
                 device: torch.device | str = "cpu") -> Vocalizer:
        """Load ``flow.pt`` and ``hift.pt`` of ``model_dir``, configured by its ``cosyvoice{2,3}.yaml``."""
        root = Path(model_dir)
        yaml_path = root / f"{kind}.yaml"
        cfg: dict = {}
        if yaml_path.is_file():
            try:
                cfg = read_hyperpyyaml(yaml_path)
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                raise ModelLoadError(f"{yaml_path}: unreadable model configuration ({exc})") from exc
        fcfg = flow_config(cfg.get("flow"), kind, yaml_path)
        flow = load_flow(flow_path(root), fcfg, device)
        hift_file = root / "hift.pt"
        if not hift_file.is_file():
            raise ModelLoadError(f"{hift_file}: vocoder checkpoint not found (audio output needs flow.pt and hift.pt)")
        try:
            hcfg = HiFTConfig.from_yaml_node(cfg["hift"]) if "hift" in cfg else HiFTConfig.for_kind(kind)
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(f"{yaml_path}: unusable hift settings: {exc}") from exc
        if hcfg.causal != (kind == "cosyvoice3") or hcfg.samples_per_frame * 50 != hcfg.sampling_rate:
            raise ModelLoadError(f"{yaml_path}: the hift entry does not fit a {kind} model at 50 mel frames/s")
        return cls(kind, flow, load_hift(hift_file, hcfg, device), root, device)

    @property
    def frontend(self) -> Frontend:
        """The prompt frontend (speech tokenizer + CAM++ ONNX models), opened on first use."""
        if self._frontend is None:
            if self.model_dir is None:
                raise ModelLoadError("no model directory to open the prompt frontend from")
            self._frontend = Frontend.from_dir(self.model_dir, self.kind, self.device)
        return self._frontend

    def flow_tokens(self, tokens: list[int]) -> list[int]:
        """The tokens the flow gets: CosyVoice3 drops silent tokens after 5 in a row (upstream ``llm_job``)."""
        return drop_silent_runs(tokens) if self.kind == "cosyvoice3" else [int(t) for t in tokens]

    def mel(self, tokens: list[int], prompt: VoicePrompt) -> torch.Tensor:
        """Mel ``[1, 80, 2 N]`` of ``N`` flow tokens after the prompt (offline: full attention)."""
        ids = torch.tensor([tokens], dtype=torch.int64, device=self.device)
        return self.flow.inference(ids, prompt.speech_tokens.to(self.device), prompt.prompt_mel.to(self.device),
                                   prompt.embedding.to(self.device))

    def render(self, tokens: list[int], prompt: VoicePrompt, generator: torch.Generator,
               sample_rate: int = NATIVE_RATE) -> RenderedAudio:
        """Audio of the LLM's ``tokens`` in ``prompt``'s voice; :class:`RenderError` when it cannot be."""
        kept = self.flow_tokens(tokens)
        if not kept:
            raise RenderError("no speech tokens to render (the LLM generated none)")
        frames = self.flow.token_mel_ratio * (prompt.speech_tokens.shape[1] + len(kept))
        if frames > NOISE_FRAMES:
            raise RenderError(f"too long for the flow stage: {frames} mel frames with the prompt "
                              f"(at most {NOISE_FRAMES}, 300 s)")
        t0 = time.perf_counter()
        mel = self.mel(kept, prompt)
        _sync(self.device)
        t1 = time.perf_counter()
        audio = self.hift.vocode(mel, generator)[0].float().cpu().numpy()
        if sample_rate != self.hift.sample_rate:
            audio = soxr.resample(audio, self.hift.sample_rate, sample_rate, quality=RESAMPLE_QUALITY)
        t2 = time.perf_counter()
        return RenderedAudio(np.ascontiguousarray(audio, dtype=np.float32), sample_rate, len(kept), mel.shape[2],
                             t1 - t0, t2 - t1)


def encode_audio(audio: np.ndarray, sample_rate: int, fmt: AudioFormat) -> bytes:
    """16-bit PCM ``wav`` or ``flac`` bytes of mono float audio (deterministic for the same samples)."""
    buf = io.BytesIO()
    sf.write(buf, np.clip(audio, -1.0, 1.0), sample_rate, format=fmt.upper(), subtype="PCM_16")
    return buf.getvalue()


def write_audio_atomic(path: Path, data: bytes) -> None:
    """``data`` to ``path`` through a hidden temporary file and a rename (never a half-written file)."""
    write_atomic_with(path, lambda fh: fh.write(data))
