"""Presets of audio-LLM transcription targets (families ``qwen2-audio``, ``qwen3-asr``, ``qwen3-omni``): the
transcription preset's fields, with the drafters these targets take: none, the model-neutral n-gram pool, or a
trained EAGLE-3 / DFlash drafter directory (speculators or z-lab / SpecForge format; ``draft_dir`` is a path or
a name under ``$SPECLI_MODELS_DIR``, never downloaded)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from specli.presets import Preset

AudioLLMDrafter = Literal["none", "pool", "eagle3", "dflash"]


@dataclass(frozen=True)
class AudioLLMPreset(Preset):
    """A transcription preset whose target is an audio LLM (decoder-only LM over audio embeddings)."""

    family: str = "qwen2-audio"
    drafter: AudioLLMDrafter = "none"  # pool = n-gram pool of earlier windows; eagle3 / dflash: trained drafters
    draft_dir: str = ""  # eagle3 / dflash: the drafter directory, or a name under $SPECLI_MODELS_DIR

    def _check(self) -> None:
        super()._check()
        if self.strategy not in ("ar", "chain"):
            raise self.bad(f"family {self.family!r} takes strategy 'ar' (drafter 'none') or 'chain' (drafter "
                           "'pool', 'eagle3' or 'dflash')")
        if (self.drafter in ("eagle3", "dflash")) != bool(self.draft_dir):
            raise self.bad("drafters 'eagle3' / 'dflash' need 'draft_dir' (a directory or a name under "
                           "$SPECLI_MODELS_DIR), and 'draft_dir' is for them only")
