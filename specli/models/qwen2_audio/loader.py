"""Find, verify and load a Qwen2-Audio directory (offline), and its hooks into the transcription loop.

A model is a local Hugging Face directory of ``Qwen2AudioForConditionalGeneration`` (``config.json``,
``*.safetensors``, tokenizer files, the feature extractor's settings (``preprocessor_config.json``, or the
``feature_extractor`` entry of transformers 5's ``processor_config.json``), a chat template for the Instruct model):
given as a path, a name under ``$SPECLI_MODELS_DIR``, or a hub id / short name already in the local Hugging
Face cache. Nothing is downloaded; missing files are a :class:`ModelLoadError` (exit 3) naming them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specli.errors import ModelLoadError, UsageError
from specli.io.audio import HOP_LENGTH, N_FFT, SAMPLE_RATE, window_features
from specli.models.audio_lm import AudioLMHooks, claims_dir, feature_extractor_settings, load_hf_model, resolve_dir
from specli.models.qwen2 import Qwen2Dims, Qwen2Target
from specli.models.qwen2_audio.target import N_FRAMES, Qwen2AudioTarget, audio_positions
from specli.models.qwen2_audio.text import Qwen2AudioText, default_instruction
from specli.models.speech import WindowPrompt

MODEL_TYPE = "qwen2_audio"
#: short names -> hub ids looked up in the local Hugging Face cache
NAMES = {"qwen2-audio": "Qwen/Qwen2-Audio-7B-Instruct", "qwen2-audio-instruct": "Qwen/Qwen2-Audio-7B-Instruct",
         "qwen2-audio-base": "Qwen/Qwen2-Audio-7B"}


def claims(name_or_dir: str) -> bool:
    """Whether ``name_or_dir`` names a Qwen2-Audio model (a short name, a hub id, or a directory whose
    ``config.json`` says ``qwen2_audio``), known without loading it."""
    return claims_dir(name_or_dir, NAMES, "qwen2-audio", MODEL_TYPE)


def resolve(name_or_dir: str) -> Path:
    """The model directory: a path, ``$SPECLI_MODELS_DIR/<name>``, or a cached hub snapshot (never downloaded)."""
    return resolve_dir(name_or_dir, NAMES, "Qwen2-Audio")


def _check_features(path: Path, n_mels: int) -> None:
    """The feature extractor must be Whisper's log-mel (so specli's own computes it): 16 kHz, n_fft 400,
    hop 160, 30-s chunks, the tower's mel bins (settings read by :func:`feature_extractor_settings`)."""
    cfg, file = feature_extractor_settings(path)
    want = {"sampling_rate": SAMPLE_RATE, "n_fft": N_FFT, "hop_length": HOP_LENGTH, "chunk_length": 30,
            "feature_size": n_mels}
    bad = {k: cfg.get(k) for k, v in want.items() if cfg.get(k, v) != v}
    if cfg.get("feature_extractor_type", "WhisperFeatureExtractor") != "WhisperFeatureExtractor" or bad:
        raise ModelLoadError(f"{file}: not Whisper's log-mel features {want} ({bad})")


@dataclass(frozen=True)
class Qwen2AudioModel:
    """A loaded Qwen2-Audio model: target, text side, and the directory it came from."""

    name: str
    path: Path
    target: Qwen2AudioTarget
    tokenizer: Qwen2AudioText
    n_mels: int

    def speech_hooks(self) -> Qwen2AudioHooks:
        return Qwen2AudioHooks(self)


@dataclass(frozen=True)
class Qwen2AudioHooks(AudioLMHooks):
    """Qwen2-Audio's part of the window loop (:class:`specli.models.speech.SpeechHooks`): no timestamp tokens
    (a window is one segment spanning it), no language detection (the language tag is given or left out)."""

    model: Qwen2AudioModel

    def features(self, audio: np.ndarray) -> tuple[torch.Tensor, int]:
        """Log-mel ``[1, n_mels, 3000]`` and real frames, as WhisperFeatureExtractor's features and
        attention mask (``ceil(samples / 160)`` frames)."""
        return window_features(audio, self.model.n_mels), min(N_FRAMES, math.ceil(len(audio) / HOP_LENGTH))

    def check_support(self, model: str, task: str, language: str | None) -> None:
        if task not in ("transcribe", "translate"):
            raise UsageError(f"model {model!r} cannot {task}")

    def window_prompt(self, p: WindowPrompt) -> list[int]:
        instruction = p.instruction or default_instruction(p.task, p.language)
        return self.model.tokenizer.prompt(instruction, max(1, audio_positions(p.frames)))


def load_qwen2_audio(name_or_dir: str, dtype: str = "float32", compile_encoder: bool = False,
                     device: str | torch.device = "cpu") -> Qwen2AudioModel:
    """Resolve, verify and load a Qwen2-Audio model: transformers' audio tower and projector, the lean decoder
    over its language model (untied head: ``lm_head``), the tokenizer and chat template."""
    from transformers import Qwen2AudioForConditionalGeneration  # noqa: PLC0415 (heavy; not a specli module)

    path = resolve(name_or_dir)
    hf, dev, dt = load_hf_model(path, "Qwen2-Audio", MODEL_TYPE, Qwen2AudioForConditionalGeneration, dtype,
                                device)
    n_mels = hf.config.audio_config.num_mel_bins
    _check_features(path, n_mels)
    lm = hf.model.language_model
    weights = {f"model.{k}": v for k, v in lm.state_dict().items()} | {"lm_head.weight": hf.lm_head.weight.data}
    dims = Qwen2Dims.from_hf_config(hf.config.text_config.to_dict())
    decoder = Qwen2Target(dims, weights, dt, device=dev)
    target = Qwen2AudioTarget(hf.model.audio_tower.to(dev), hf.model.multi_modal_projector.to(dev), decoder,
                              int(hf.config.audio_token_id))
    return Qwen2AudioModel(name_or_dir, path, target, Qwen2AudioText(path), n_mels)
