"""Model families: what a preset's ``family`` names, which pipeline runs it, and how its models load.

A new target is one package under ``specli/models/``, one :class:`Family` entry below, and presets
(TOML files with ``family = "<name>"``). Entries name their preset class and loader as ``module:attribute``
strings, imported on first use, so reading the registry loads no model code.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal

Task = Literal["transcribe", "synthesize"]  # the pipeline a family's presets run in: specli.asr or specli.tts


@dataclass(frozen=True)
class Family:
    """One model family."""

    name: str  # the value of a preset's ``family`` key
    task: Task  # transcribe: specli.asr (transcribe / translate); synthesize: specli.tts (synthesize)
    preset: str  # "module:Class" of its presets' frozen dataclass
    loader: str  # "module:function": (name or directory, dtype, device=..., **options) -> the loaded model
    claims: str = ""  # "module:function": (name or directory) -> whether it is this family's model ("": none)
    default_preset: str = ""  # the preset a claimed --model runs with when no preset is named

    def preset_class(self) -> type:
        """The dataclass this family's presets are read into."""
        return _attribute(self.preset)

    def claims_model(self, name_or_dir: str) -> bool:
        """Whether ``name_or_dir`` is one of this family's models (by name or its config, without loading)."""
        return bool(self.claims) and bool(_attribute(self.claims)(name_or_dir))

    def load(self, name_or_dir: str, dtype: str, **options: Any) -> Any:
        """Load one of this family's models (offline: a bundled name, a local directory, a cached hub id)."""
        return _attribute(self.loader)(name_or_dir, dtype, **options)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("whisper", "transcribe", "specli.presets:Preset", "specli.models.whisper.loader:load_whisper"),
    Family("cosyvoice", "synthesize", "specli.presets.synthesis:SynthesisPreset",
           "specli.models.cosyvoice.lm:load_cosyvoice"),
    Family("qwen2-audio", "transcribe", "specli.presets.audio_llm:AudioLLMPreset",
           "specli.models.qwen2_audio.loader:load_qwen2_audio", claims="specli.models.qwen2_audio.loader:claims",
           default_preset="qwen2-audio-ar"),
    Family("qwen3-asr", "transcribe", "specli.presets.audio_llm:AudioLLMPreset",
           "specli.models.qwen3_asr.loader:load_qwen3_asr", claims="specli.models.qwen3_asr.loader:claims",
           default_preset="qwen3-asr-ar"),
    Family("qwen3-omni", "transcribe", "specli.presets.audio_llm:AudioLLMPreset",
           "specli.models.qwen3_omni.loader:load_qwen3_omni", claims="specli.models.qwen3_omni.loader:claims",
           default_preset="qwen3-omni-ar"),
)}


def family_of_model(name_or_dir: str) -> Family | None:
    """The family that claims ``name_or_dir`` (a model name or directory), or None (no family says so)."""
    return next((f for f in FAMILIES.values() if f.claims_model(name_or_dir)), None)


def family(name: str) -> Family:
    """The registered family ``name`` (ValueError naming the known ones when it is not)."""
    found = FAMILIES.get(name)
    if found is None:
        raise ValueError(f"unknown model family {name!r}; known families: {', '.join(sorted(FAMILIES))}")
    return found


def _attribute(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)
