"""Synthesis presets (``family = "cosyvoice"`` in the TOML): CosyVoice LM, sampler and drafter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from specli.errors import PresetError
from specli.presets import PresetBase, load_any_preset, preset_from_dict
from specli.presets.draft import DraftSpec

SamplerKind = Literal["ras", "vllm", "greedy"]
DType = Literal["float32", "bfloat16"]

# a synthesis preset's speculation settings where its TOML sets none (adaptive stops at a predicted survival of 0.3;
# a dynamic tree of 8 levels: DSpark / DFlash draft at most their block)
SYNTHESIS_DRAFT = DraftSpec(confidence_threshold=0.3, tree_depth=8)


@dataclass(frozen=True)
class SynthesisPreset(PresetBase):
    """A synthesis preset (family ``cosyvoice``): text -> speech-token LM, sampler and drafter."""

    # pool = n-gram pool over earlier outputs; dspark / dflash / eagle3: trained drafters (draft_dir)
    DRAFTER_KINDS: ClassVar[tuple[str, ...]] = ("none", "pool", "dspark", "dflash", "eagle3")
    DRAFT_KEYS: ClassVar[frozenset[str]] = frozenset({
        "strategy", "drafter", "draft_dir", "confidence_threshold", "tree_topk", "tree_threshold", "tree_depth",
        "max_draft", "max_draft_rows", "ngram"})

    family: str = "cosyvoice"  # model family (specli.models.registry)
    draft: DraftSpec = SYNTHESIS_DRAFT  # drafter and speculation settings (the TOML's flat keys of DRAFT_KEYS)
    dtype: DType = "float32"  # numeric type of the target
    sampler: SamplerKind = "ras"  # ras (CosyVoice default), vllm (SpeechSpec's settings), greedy
    temperature: float | None = None  # vllm only; None = the sampler's default
    top_p: float | None = None  # None = the sampler's default (ras 0.8)
    top_k: int | None = None  # None = the sampler's default (ras 25)
    repetition_penalty: float | None = None  # vllm only; None = 1.0

    def _check(self) -> None:
        bad, d = self.bad, self.draft
        if d.drafter in ("none", "pool") and d.strategy not in ("ar", "chain"):
            raise bad(f"strategy {d.strategy!r} needs a dspark, dflash or eagle3 drafter")
        if d.drafter in ("dspark", "dflash", "eagle3") and not d.draft_dir:
            raise bad(f"drafter {d.drafter!r} needs draft_dir (a directory or a name under $SPECLI_MODELS_DIR)")
        if d.strategy == "dynamic-tree" and not (1 <= d.tree_topk <= 8 and 1 <= d.tree_depth <= 16):
            raise bad("strategy 'dynamic-tree' needs tree_topk within 1..8 and tree_depth within 1..16")


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
