"""Synthesis presets (``family = "cosyvoice"`` in the TOML): CosyVoice LM, sampler and drafter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from specli.errors import PresetError
from specli.presets import PresetBase, load_any_preset, preset_from_dict

SynthesisStrategy = Literal["ar", "chain", "adaptive", "sparse-tree", "dynamic-tree", "recycling"]
SynthesisDrafter = Literal["none", "pool", "dspark", "dflash", "eagle3"]
SamplerKind = Literal["ras", "vllm", "greedy"]
DType = Literal["float32", "bfloat16"]


@dataclass(frozen=True)
class SynthesisPreset(PresetBase):
    """A synthesis preset (family ``cosyvoice``): text -> speech-token LM, sampler and drafter."""

    family: str = "cosyvoice"  # model family (specli.models.registry)
    strategy: SynthesisStrategy = "ar"  # ar = a target forward a token; others draft and verify (lossless)
    drafter: SynthesisDrafter = "none"  # pool = n-gram pool over earlier outputs; dspark/dflash/eagle3: trained
    draft_dir: str = ""  # dspark/dflash/eagle3: drafter directory, or a name under $SPECLI_MODELS_DIR
    confidence_threshold: float = 0.3  # adaptive: stop drafting when the predicted survival falls below this
    tree_topk: int = 2  # sparse-tree: alternatives at each low-confidence draft slot; dynamic-tree: nodes expanded a level
    tree_threshold: float = 0.6  # sparse-tree: slots below this drafter probability get alternatives
    tree_depth: int = 8  # dynamic-tree: levels of the EAGLE-2 tree (DSpark/DFlash: at most the block); max_draft: its nodes
    dtype: DType = "float32"  # numeric type of the target
    max_draft: int = 8  # most draft tokens per target forward
    # batched synthesis (--batch-size) drafts only while at most this many requests are in flight: rows that join
    # beside as many others, and every row once more are active, decode plainly (0 = no limit)
    max_draft_rows: int = 0
    ngram: int = 4  # pool: longest suffix matched
    sampler: SamplerKind = "ras"  # ras (CosyVoice default), vllm (SpeechSpec's settings), greedy
    temperature: float | None = None  # vllm only; None = the sampler's default
    top_p: float | None = None  # None = the sampler's default (ras 0.8)
    top_k: int | None = None  # None = the sampler's default (ras 25)
    repetition_penalty: float | None = None  # vllm only; None = 1.0

    def _check(self) -> None:
        bad = self.bad
        if (self.strategy == "ar") != (self.drafter == "none"):
            raise bad("strategy 'ar' takes drafter 'none'; strategy 'chain' needs a drafter")
        if self.drafter in ("none", "pool") and self.strategy not in ("ar", "chain"):
            raise bad(f"strategy {self.strategy!r} needs a dspark, dflash or eagle3 drafter")
        if self.drafter in ("dspark", "dflash", "eagle3") and not self.draft_dir:
            raise bad(f"drafter {self.drafter!r} needs draft_dir (a directory or a name under $SPECLI_MODELS_DIR)")
        if not 0.0 <= self.confidence_threshold < 1.0 or not 0.0 <= self.tree_threshold <= 1.0 or self.tree_topk < 0:
            raise bad("confidence_threshold / tree_threshold must be within [0, 1) and tree_topk an integer >= 0")
        if self.strategy == "dynamic-tree" and not (1 <= self.tree_topk <= 8 and 1 <= self.tree_depth <= 16):
            raise bad("strategy 'dynamic-tree' needs tree_topk within 1..8 and tree_depth within 1..16")
        if self.max_draft_rows < 0:
            raise bad("max_draft_rows must be >= 0 (0 = no limit)")
        if not 1 <= self.max_draft <= 24 or self.ngram < 1:
            raise bad("max_draft must be within 1..24 and ngram >= 1")


def synthesis_preset_from_dict(name: str, data: dict) -> SynthesisPreset:
    """Build a :class:`SynthesisPreset` (``family`` defaults to cosyvoice here), rejecting unknown keys."""
    preset = preset_from_dict(name, {"family": "cosyvoice", **data})
    if not isinstance(preset, SynthesisPreset):
        raise PresetError(f"preset {name!r} is a transcription preset, not a synthesis preset")
    return preset


def load_synthesis_preset(name_or_path: str) -> SynthesisPreset:
    """A shipped synthesis preset by name, or a TOML file by path."""
    preset = load_any_preset(name_or_path)
    if not isinstance(preset, SynthesisPreset):
        raise PresetError(f"preset {preset.name!r} is a transcription preset, not a synthesis preset "
                          "(synthesis presets have family = \"cosyvoice\")")
    return preset
