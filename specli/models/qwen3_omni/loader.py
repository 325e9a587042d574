"""Find, verify and load a Qwen3-Omni directory (offline): the thinker alone, and its hooks into the
transcription loop.

A model is a local Hugging Face directory of ``Qwen3OmniMoeForConditionalGeneration`` (``config.json``,
``*.safetensors``, tokenizer files, the feature extractor's settings
(``preprocessor_config.json`` or transformers 5's ``processor_config.json``), a chat template), loaded with
``enable_audio_output=False`` so the talker and code2wav are never built: given as a path, a name under
``$SPECLI_MODELS_DIR``, or a hub id / short name already in the local Hugging Face cache. Nothing is
downloaded; missing files are a :class:`ModelLoadError` (exit 3) naming them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specli.errors import ModelLoadError, UsageError
from specli.io.audio import HOP_LENGTH, SAMPLE_RATE
from specli.models.audio_lm import AudioLMHooks, claims_dir, load_feature_extractor, load_hf_model, resolve_dir
from specli.models.aut import audio_positions, processor_features
from specli.models.qwen2 import Qwen2Dims, Qwen2Target
from specli.models.qwen3_asr.text import language_name
from specli.models.qwen3_omni.target import Qwen3OmniTarget
from specli.models.qwen3_omni.text import Qwen3OmniText, default_instruction
from specli.models.speech import WindowPrompt

MODEL_TYPE = "qwen3_omni_moe"
#: short names -> hub ids looked up in the local Hugging Face cache
NAMES = {"qwen3-omni": "Qwen/Qwen3-Omni-30B-A3B-Instruct", "qwen3-omni-instruct": "Qwen/Qwen3-Omni-30B-A3B-Instruct"}


def claims(name_or_dir: str) -> bool:
    """Whether ``name_or_dir`` names a Qwen3-Omni model (a short name, a hub id, or a directory whose
    ``config.json`` says ``qwen3_omni_moe``), known without loading it."""
    return claims_dir(name_or_dir, NAMES, "qwen3-omni", MODEL_TYPE)


def resolve(name_or_dir: str) -> Path:
    """The model directory: a path, ``$SPECLI_MODELS_DIR/<name>``, or a cached hub snapshot (never downloaded)."""
    return resolve_dir(name_or_dir, NAMES, "Qwen3-Omni")


def _feature_extractor(path: Path, n_mels: int):
    """The directory's feature extractor (Whisper's log-mel: 16 kHz, hop 160, the encoder's mel bins)."""
    from transformers import WhisperFeatureExtractor  # noqa: PLC0415 (heavy; not a specli module)

    fe = load_feature_extractor(path, WhisperFeatureExtractor)
    want = {"sampling_rate": SAMPLE_RATE, "hop_length": HOP_LENGTH, "feature_size": n_mels}
    bad = {k: getattr(fe, k, None) for k, v in want.items() if getattr(fe, k, None) != v}
    if bad:
        raise ModelLoadError(f"{path}: feature extractor does not fit the encoder: want {want}, got {bad}")
    return fe


@dataclass(frozen=True)
class Qwen3OmniModel:
    """A loaded Qwen3-Omni thinker: target, text side, feature extractor, and the directory it came from."""

    name: str
    path: Path
    target: Qwen3OmniTarget
    tokenizer: Qwen3OmniText
    feature_extractor: object  # the processor's WhisperFeatureExtractor

    def speech_hooks(self) -> Qwen3OmniHooks:
        return Qwen3OmniHooks(self)


@dataclass(frozen=True)
class Qwen3OmniHooks(AudioLMHooks):
    """The thinker's part of the window loop: the instruction (default: the cookbook's, naming the language
    when given) after the audio in one user turn."""

    def features(self, audio: np.ndarray) -> tuple[torch.Tensor, int]:
        """The processor's log-mel of the window alone, zero-padded to ``[1, n_mels, 3000]``, and its real
        frames (the encoder reads only those)."""
        return processor_features(self.model.feature_extractor, audio)

    def check_support(self, model: str, task: str, language: str | None) -> None:
        if task not in ("transcribe", "translate"):
            raise UsageError(f"model {model!r} cannot {task}")
        language_name(language)

    def window_prompt(self, p: WindowPrompt) -> list[int]:
        instruction = p.instruction or default_instruction(p.task, p.language)
        n_audio = max(1, audio_positions(p.frames, self.model.target.n_window))
        return self.model.tokenizer.prompt(instruction, n_audio)


def _lean_decoder(thinker: torch.nn.Module, dt: torch.dtype, dev: torch.device) -> Qwen2Target:
    """The lean decoder over the thinker's text model (sparse MoE blocks, its own untied ``lm_head``)."""
    text = thinker.config.text_config.to_dict()
    lm = thinker.model.language_model
    weights = {f"model.{k}": v for k, v in lm.state_dict().items()} | {"lm_head.weight": thinker.lm_head.weight.data}
    return Qwen2Target(Qwen2Dims.from_hf_config(text), weights, dt, device=dev)


def load_qwen3_omni(name_or_dir: str, dtype: str = "float32", compile_encoder: bool = False,
                    device: str | torch.device = "cpu") -> Qwen3OmniModel:
    """Resolve, verify and load the thinker of a Qwen3-Omni model: transformers' audio encoder, the lean MoE
    decoder over its text model, the tokenizer, chat template and feature extractor (no talker)."""
    from transformers import Qwen3OmniMoeForConditionalGeneration  # noqa: PLC0415 (heavy; not a specli module)

    path = resolve(name_or_dir)
    hf, dev, dt = load_hf_model(path, "Qwen3-Omni", MODEL_TYPE, Qwen3OmniMoeForConditionalGeneration, dtype, device,
                                enable_audio_output=False)
    thinker = hf.thinker.eval()
    fe = _feature_extractor(path, thinker.config.audio_config.num_mel_bins)
    audio_token = int(thinker.config.audio_token_id)
    thinker.model.audio_tower.to(dev)
    decoder = _lean_decoder(thinker, dt, dev)
    thinker.model.language_model = None  # the lean decoder replaces it (its weights are not kept twice)
    target = Qwen3OmniTarget(thinker.model, decoder, audio_token)
    return Qwen3OmniModel(name_or_dir, path, target, Qwen3OmniText(path, audio_token), fe)
