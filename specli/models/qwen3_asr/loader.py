"""Find, verify and load a Qwen3-ASR directory (offline), and its hooks into the transcription loop.

A model is a local Hugging Face directory of ``Qwen3ASRForConditionalGeneration`` (the ``-hf`` checkpoints:
``config.json``, ``*.safetensors``, tokenizer files, the feature extractor's settings
(``preprocessor_config.json`` or transformers 5's ``processor_config.json``), a chat template): given as a
path, a name under ``$SPECLI_MODELS_DIR``, or a hub id / short name already in the local Hugging Face cache.
Nothing is downloaded; missing files are a :class:`ModelLoadError` (exit 3) naming them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specli.errors import ModelLoadError, UsageError
from specli.io.audio import HOP_LENGTH, SAMPLE_RATE
from specli.models.audio_lm import AudioLMHooks, claims_dir, load_feature_extractor, load_hf_model, resolve_dir
from specli.models.aut import N_FRAMES, audio_positions, processor_features
from specli.models.qwen2 import Qwen2Dims, Qwen2Target
from specli.models.qwen3_asr.target import Qwen3ASRTarget
from specli.models.qwen3_asr.text import Qwen3ASRText, language_name
from specli.models.speech import WindowPrompt

MODEL_TYPE = "qwen3_asr"
#: short names -> hub ids looked up in the local Hugging Face cache
NAMES = {"qwen3-asr": "Qwen/Qwen3-ASR-1.7B-hf", "qwen3-asr-1.7b": "Qwen/Qwen3-ASR-1.7B-hf",
         "qwen3-asr-0.6b": "Qwen/Qwen3-ASR-0.6B-hf"}


def claims(name_or_dir: str) -> bool:
    """Whether ``name_or_dir`` names a Qwen3-ASR model (a short name, a hub id, or a directory whose
    ``config.json`` says ``qwen3_asr``), known without loading it."""
    return claims_dir(name_or_dir, NAMES, "qwen3-asr", MODEL_TYPE)


def resolve(name_or_dir: str) -> Path:
    """The model directory: a path, ``$SPECLI_MODELS_DIR/<name>``, or a cached hub snapshot (never downloaded)."""
    return resolve_dir(name_or_dir, NAMES, "Qwen3-ASR")


def _feature_extractor(path: Path, n_mels: int, n_window: int):
    """The directory's ``Qwen3ASRFeatureExtractor`` (16 kHz, hop 160, the encoder's mel bins; 30-s windows
    must be whole encoder chunks)."""
    from transformers import Qwen3ASRFeatureExtractor  # noqa: PLC0415 (heavy; not a specli module)

    fe = load_feature_extractor(path, Qwen3ASRFeatureExtractor)
    want = {"sampling_rate": SAMPLE_RATE, "hop_length": HOP_LENGTH, "feature_size": n_mels, "n_window": n_window}
    bad = {k: getattr(fe, k, None) for k, v in want.items() if getattr(fe, k, None) != v}
    if bad or N_FRAMES % (2 * n_window):
        raise ModelLoadError(f"{path}: feature extractor does not fit the encoder: want {want}, got {bad}")
    return fe


@dataclass(frozen=True)
class Qwen3ASRModel:
    """A loaded Qwen3-ASR model: target, text side, feature extractor, and the directory it came from."""

    name: str
    path: Path
    target: Qwen3ASRTarget
    tokenizer: Qwen3ASRText
    feature_extractor: object  # transformers' Qwen3ASRFeatureExtractor

    def speech_hooks(self) -> Qwen3ASRHooks:
        return Qwen3ASRHooks(self)


@dataclass(frozen=True)
class Qwen3ASRHooks(AudioLMHooks):
    """Qwen3-ASR's part of the window loop: the language is forced in the prompt when given, else the model
    names it in its own output (dropped from the text); the instruction is the system turn's context."""

    def features(self, audio: np.ndarray) -> tuple[torch.Tensor, int]:
        """The processor's log-mel of the window alone (clips under 0.5 s zero-padded, the mel padded to whole
        chunks), zero-padded to ``[1, n_mels, 3000]``, and its real frames."""
        return processor_features(self.model.feature_extractor, audio)

    def check_support(self, model: str, task: str, language: str | None) -> None:
        if task != "transcribe":
            raise UsageError(f"model {model!r} (Qwen3-ASR) only transcribes; it cannot {task}")
        language_name(language)

    def window_prompt(self, p: WindowPrompt) -> list[int]:
        n_audio = max(1, audio_positions(p.frames, self.model.target.n_window))
        return self.model.tokenizer.prompt(p.instruction, p.language, n_audio)


def load_qwen3_asr(name_or_dir: str, dtype: str = "float32", compile_encoder: bool = False,
                   device: str | torch.device = "cpu") -> Qwen3ASRModel:
    """Resolve, verify and load a Qwen3-ASR model: transformers' encoder and projector, the lean decoder over its
    Qwen3 language model (tied head: ``lm_head`` shares the embedding), tokenizer, chat template, features."""
    from transformers import Qwen3ASRForConditionalGeneration  # noqa: PLC0415 (heavy; not a specli module)

    path = resolve(name_or_dir)
    hf, dev, dt = load_hf_model(path, "Qwen3-ASR", MODEL_TYPE, Qwen3ASRForConditionalGeneration, dtype, device,
                                type_hint=" (a Qwen3-ASR -hf checkpoint)")
    audio_cfg = hf.config.audio_config
    fe = _feature_extractor(path, audio_cfg.num_mel_bins, audio_cfg.n_window)
    lm = hf.model.language_model
    weights = {f"model.{k}": v for k, v in lm.state_dict().items()} | {"lm_head.weight": hf.lm_head.weight.data}
    dims = Qwen2Dims.from_hf_config(hf.config.text_config.to_dict())
    decoder = Qwen2Target(dims, weights, dt, device=dev)
    target = Qwen3ASRTarget(hf.model.audio_tower.to(dev), hf.model.multi_modal_projector.to(dev), decoder,
                            int(hf.config.audio_token_id))
    return Qwen3ASRModel(name_or_dir, path, target, Qwen3ASRText(path, int(hf.config.audio_token_id)), fe)
