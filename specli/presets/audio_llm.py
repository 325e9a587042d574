"""Presets of audio-LLM transcription targets (families ``qwen2-audio``, ``qwen3-asr``, ``qwen3-omni``): the
transcription preset's fields, with the drafters these targets take: none, the model-neutral n-gram pool, or a
trained EAGLE-3 / DFlash drafter directory (speculators or z-lab / SpecForge format; ``draft_dir`` is a path or
a name under ``$SPECLI_MODELS_DIR``, never downloaded)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from specli.presets import Preset
from specli.presets.draft import DRAFT_FIELDS


@dataclass(frozen=True)
class AudioLLMPreset(Preset):
    """A transcription preset whose target is an audio LLM (decoder-only LM over audio embeddings)."""

    # pool = n-gram pool of earlier windows; eagle3 / dflash: trained drafters (draft_dir)
    DRAFTER_KINDS: ClassVar[tuple[str, ...]] = ("none", "pool", "eagle3", "dflash")
    # Whisper's drafters' settings (a smaller model, a head and its weights, sparse-tree branches) are not taken
    DRAFT_KEYS: ClassVar[frozenset[str]] = DRAFT_FIELDS - {"draft_model", "head", "head_weights", "branch_steps"}

    family: str = "qwen2-audio"

    def _check(self) -> None:
        super()._check()
        if self.longform != "sequential":
            raise self.bad(f"family {self.family!r} transcribes long files sequentially only (longform = "
                           "\"batched\" is for Whisper presets)")
        if self.draft.strategy not in ("ar", "chain"):
            raise self.bad(f"family {self.family!r} takes strategy 'ar' (drafter 'none') or 'chain' (drafter "
                           "'pool', 'eagle3' or 'dflash')")
        if (self.draft.drafter in ("eagle3", "dflash")) != bool(self.draft.draft_dir):
            raise self.bad("drafters 'eagle3' / 'dflash' need 'draft_dir' (a directory or a name under "
                           "$SPECLI_MODELS_DIR), and 'draft_dir' is for them only")
