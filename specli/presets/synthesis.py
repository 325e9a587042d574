"""Synthesis presets (``task = "synthesize"`` in the TOML): CosyVoice LM, sampler and drafter."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

from specli.errors import PresetError
from specli.presets import build_preset, read_preset_toml

SynthesisStrategy = Literal["ar", "chain", "adaptive", "sparse-tree", "recycling"]
SynthesisDrafter = Literal["none", "pool", "dspark", "dflash", "eagle3"]
SamplerKind = Literal["ras", "vllm", "greedy"]
DType = Literal["float32", "bfloat16"]


@dataclass(frozen=True)
class SynthesisPreset:
    """A named text-to-speech-tokens configuration."""

    name: str  # preset name (the TOML file's stem)
    model: str  # cosyvoice2, cosyvoice3 or a checkpoint directory
    task: Literal["synthesize"] = "synthesize"  # marks the TOML as a synthesis preset
    description: str = ""  # one line shown by `specli presets`
    strategy: SynthesisStrategy = "ar"  # ar = a target forward a token; others draft and verify (lossless)
    drafter: SynthesisDrafter = "none"  # pool = n-gram pool over earlier outputs; dspark/dflash/eagle3: trained
    draft_dir: str = ""  # dspark/dflash/eagle3: drafter directory, or a name under $SPECLI_MODELS_DIR
    confidence_threshold: float = 0.3  # adaptive: stop drafting when the predicted survival falls below this
    tree_topk: int = 2  # sparse-tree: alternatives at each low-confidence draft slot
    tree_threshold: float = 0.6  # sparse-tree: slots below this drafter probability get alternatives
    dtype: DType = "float32"  # numeric type of the target
    device: str = "auto"  # auto (CUDA when available, else CPU), cpu, cuda or cuda:N
    max_draft: int = 8  # most draft tokens per target forward
    ngram: int = 4  # pool: longest suffix matched
    sampler: SamplerKind = "ras"  # ras (CosyVoice default), vllm (SpeechSpec's settings), greedy
    temperature: float | None = None  # vllm only; None = the sampler's default
    top_p: float | None = None  # None = the sampler's default (ras 0.8)
    top_k: int | None = None  # None = the sampler's default (ras 25)
    repetition_penalty: float | None = None  # vllm only; None = 1.0

    def __post_init__(self) -> None:
        bad = lambda msg: PresetError(f"preset {self.name!r}: {msg}")  # noqa: E731
        if not isinstance(self.model, str) or not self.model:
            raise bad("'model' must be a non-empty string")
        for fname, kind in (("task", Literal["synthesize"]), ("strategy", SynthesisStrategy),
                            ("drafter", SynthesisDrafter), ("dtype", DType), ("sampler", SamplerKind)):
            if getattr(self, fname) not in get_args(kind):
                raise bad(f"{fname} must be one of {list(get_args(kind))}, not {getattr(self, fname)!r}")
        if (self.strategy == "ar") != (self.drafter == "none"):
            raise bad("strategy 'ar' takes drafter 'none'; strategy 'chain' needs a drafter")
        if self.drafter in ("none", "pool") and self.strategy not in ("ar", "chain"):
            raise bad(f"strategy {self.strategy!r} needs a dspark, dflash or eagle3 drafter")
        if self.drafter in ("dspark", "dflash", "eagle3") and not self.draft_dir:
            raise bad(f"drafter {self.drafter!r} needs draft_dir (a directory or a name under $SPECLI_MODELS_DIR)")
        if not 0.0 <= self.confidence_threshold < 1.0 or not 0.0 <= self.tree_threshold <= 1.0 \
                or type(self.tree_topk) is not int or self.tree_topk < 0:
            raise bad("confidence_threshold / tree_threshold must be within [0, 1) and tree_topk an integer >= 0")
        if not isinstance(self.device, str) or not re.match(r"^(auto|cpu|cuda(:\d+)?)$", self.device):
            raise bad(f"device must be auto, cpu, cuda or cuda:N, not {self.device!r}")
        for fname in ("max_draft", "ngram"):
            if type(getattr(self, fname)) is not int:
                raise bad(f"{fname} must be an integer")
        if not 1 <= self.max_draft <= 24 or self.ngram < 1:
            raise bad("max_draft must be within 1..24 and ngram >= 1")
        for fname in ("temperature", "top_p", "repetition_penalty"):
            value = getattr(self, fname)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise bad(f"{fname} must be a number")
        if self.top_k is not None and type(self.top_k) is not int:
            raise bad("top_k must be an integer")


def synthesis_preset_from_dict(name: str, data: dict) -> SynthesisPreset:
    """Build a :class:`SynthesisPreset`, rejecting unknown keys."""
    return build_preset(SynthesisPreset, name, data)


def load_synthesis_preset(name_or_path: str) -> SynthesisPreset:
    """A shipped synthesis preset by name, or a TOML file by path."""
    name, data = read_preset_toml(name_or_path)
    if data.get("task") != "synthesize":
        raise PresetError(f"preset {name!r} is a transcription preset, not a synthesis preset "
                          "(synthesis presets have task = \"synthesize\")")
    return synthesis_preset_from_dict(name, data)
