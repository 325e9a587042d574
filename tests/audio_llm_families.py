"""The audio-LLM families as test fixtures (test_audio_llm_contract runs its contract over ``FAMILIES``; each family's
own file tests its quirks): how to write a tiny random checkpoint in the layout transformers saves, load it with
specli and with transformers, and make one window's decode job. A new family is one entry of ``FAMILIES``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import soundfile as sf
import torch

from conftest import EN_CLIPS
from specli.models.speech import WindowPrompt


@dataclass(frozen=True)
class Family:
    """One audio-LLM family's tiny checkpoint and its transformers reference."""

    write: Callable[[Path], Path]  # writes a tiny random checkpoint directory, returns it
    load: Callable[[str, str], object]  # specli's loader: (directory or name, dtype) -> SpeechModel
    reference: Callable[[Path], torch.nn.Module]  # transformers' model of the directory (eval, float32)
    vocab: int  # rows of the LM head
    mask_arg: str  # the name of transformers' audio-frame mask argument
    forward_attention_mask: bool  # whether transformers' forward takes an explicit attention mask for logits
    spec_language: str | None  # the language of the windows the speculative tests decode
    missing: tuple[str, ...]  # files removed from a copy besides model.safetensors; each error names one
    missing_messages: tuple[str, ...]  # what the error for the broken copy names
    nowhere: Callable[[Path], str]  # a model that does not exist (a path under tmp or a name)
    nowhere_message: str  # what its error says


def _qwen2_audio(path: Path) -> Path:
    from qwen2_audio_fixtures import write_tiny_qwen2_audio

    return write_tiny_qwen2_audio(path)


def _qwen3_asr(path: Path) -> Path:
    from qwen3_asr_fixtures import write_tiny_qwen3_asr

    return write_tiny_qwen3_asr(path)


def _qwen3_omni(path: Path) -> Path:
    from qwen3_omni_fixtures import write_tiny_qwen3_omni

    return write_tiny_qwen3_omni(path)


def _load(module: str, fn: str):
    def load(where: str, dtype: str):
        import importlib

        return getattr(importlib.import_module(module), fn)(where, dtype)

    return load


def _hf_qwen2_audio(path: Path):
    from transformers import Qwen2AudioForConditionalGeneration

    return Qwen2AudioForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()


def _hf_qwen3_asr(path: Path):
    from transformers import Qwen3ASRForConditionalGeneration

    return Qwen3ASRForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()


def _hf_qwen3_omni(path: Path):
    """The thinker (enable_audio_output=False: the talker is never built)."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    hf = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32,
                                                              enable_audio_output=False).eval()
    assert not hasattr(hf, "talker")
    return hf.thinker


_PROCESSOR_MSG = "preprocessor_config.json (or processor_config.json with a feature_extractor entry)"
FAMILIES = {
    "qwen2-audio": Family(_qwen2_audio, _load("specli.models.qwen2_audio.loader", "load_qwen2_audio"),
                          _hf_qwen2_audio, 264, "feature_attention_mask", False, "en",
                          # processor_config.json: the feature extractor's settings (transformers >= 5)
                          ("processor_config.json",), ("model.safetensors", _PROCESSOR_MSG),
                          lambda tmp: str(tmp / "nowhere"), "not found"),
    "qwen3-asr": Family(_qwen3_asr, _load("specli.models.qwen3_asr.loader", "load_qwen3_asr"), _hf_qwen3_asr, 264,
                        "input_features_mask", False, None, ("processor_config.json",),
                        ("model.safetensors", _PROCESSOR_MSG), lambda tmp: str(tmp / "nowhere"), "not found"),
    "qwen3-omni": Family(_qwen3_omni, _load("specli.models.qwen3_omni.loader", "load_qwen3_omni"), _hf_qwen3_omni,
                         272, "feature_attention_mask", True, None, (), ("model.safetensors",),
                         lambda tmp: "qwen3-omni-nowhere", "never downloads"),
}


@dataclass
class Built:
    """A family's tiny checkpoint directory, specli's float32 model of it and transformers' (built on first use)."""

    family: Family
    dir: Path
    _model: object = None
    _hf: object = None

    @property
    def model(self):
        if self._model is None:
            self._model = self.family.load(str(self.dir), "float32")
        return self._model

    @property
    def hf(self):
        if self._hf is None:
            self._hf = self.family.reference(self.dir)
        return self._hf


def clip(i: int = 0, seconds: float | None = None) -> np.ndarray:
    """Bundled English clip ``i`` (its first ``seconds``), 16 kHz float32."""
    audio, _ = sf.read(str(EN_CLIPS[i]), dtype="float32")
    return audio if seconds is None else audio[: int(seconds * 16000)]


def window(model, audio: np.ndarray, max_new: int = 24, language: str | None = "en", task: str = "transcribe",
           context: str | None = None):
    """(job, state, mel, frames) of one window of ``audio``."""
    hooks = model.speech_hooks()
    mel, frames = hooks.features(audio)
    job = hooks.window_job(WindowPrompt(task, language, (), (), True, (-1,), max_new, frames, None,
                                        instruction=context))
    state = model.target.start(model.target.encode(mel, [frames]))
    return job, state, mel, frames
