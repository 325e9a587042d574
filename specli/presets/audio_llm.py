"""Presets of audio-LLM transcription targets (families ``qwen2-audio``, ``qwen3-asr``, ``qwen3-omni``): the
transcription preset's fields, with the drafters these targets take so far (none, or the model-neutral n-gram
pool)."""

from __future__ import annotations

from dataclasses import dataclass

from specli.presets import Preset


@dataclass(frozen=True)
class AudioLLMPreset(Preset):
    """A transcription preset whose target is an audio LLM (decoder-only LM over audio embeddings)."""

    family: str = "qwen2-audio"

    def _check(self) -> None:
        super()._check()
        if self.drafter not in ("none", "pool") or self.strategy not in ("ar", "chain"):
            raise self.bad(f"family {self.family!r} takes strategy 'ar' (drafter 'none') or 'chain' with drafter "
                           "'pool' (EAGLE-3 / DFlash drafters come later)")
