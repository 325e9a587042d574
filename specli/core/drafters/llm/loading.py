"""Build a DSpark / DFlash / EAGLE-3 drafter for a speech-token (or any Qwen2) target.

A drafter is a directory (speculators format, z-lab DFlash or SpecForge's EAGLE-3 ``LlamaForCausalLMEagle3``,
told apart by config.json) given by path, or a name found offline by :mod:`specli.io.locate`
(``$SPECLI_MODELS_DIR/<name>``, the local Hugging Face cache; nothing is downloaded). Loading attaches the drafter's
auxiliary layers to the target (converted to the target's layer-input convention), maps token ids when the
directory records another layout, and wraps the
module for the preset's strategy:
``chain`` (plain), ``adaptive`` (confidence truncation), ``sparse-tree`` (alternatives at
low-confidence slots), ``dynamic-tree`` (an EAGLE-2 tree: over a block drafter's slots, or EAGLE-3's draft steps) or ``recycling``
(rejected tails re-proposed; SpecASR).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specli.core.drafters.base import Drafter, ModelDraftOptions
from specli.core.drafters.llm.dflash import BlockDraftModule, BlockDrafter
from specli.core.drafters.tree_search import MAX_TOPK, DynamicTreeOptions
from specli.core.drafters.llm.eagle3 import Eagle3Drafter, Eagle3Module
from specli.core.drafters.recycling import RecyclingDrafter
from specli.core.drafters.llm.base import KINDS, SpeechDraftModule, attach_aux_layers
from specli.core.drafters.llm.specforge import drafter_format, load_specforge_eagle3
from specli.core.drafters.llm.layout import VocabLayout
from specli.core.drafters.llm.speculators import load_speech_drafter
from specli.core.types import DraftableTarget
from specli.errors import ModelLoadError
from specli.io.locate import Lookup, locate

SpeechStrategy = Literal["chain", "adaptive", "sparse-tree", "dynamic-tree", "recycling"]
STRATEGIES: tuple[str, ...] = ("chain", "adaptive", "sparse-tree", "dynamic-tree", "recycling")


@dataclass(frozen=True)
class SpeechDraftOptions:
    """How a loaded block drafter proposes."""

    strategy: SpeechStrategy = "chain"  # chain, adaptive, sparse-tree, dynamic-tree or recycling
    confidence_threshold: float = 0.3  # adaptive: stop when the predicted survival falls below this
    tree_topk: int = 2  # sparse-tree: alternatives at each low-confidence slot; dynamic-tree: nodes expanded a level
    tree_threshold: float = 0.6  # sparse-tree: slots below this drafter probability get alternatives
    tree_depth: int = 8  # dynamic-tree: levels (at most the drafter's drafts per block); its nodes: the max draft

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, not {self.strategy!r}")
        if not 0.0 <= self.confidence_threshold < 1.0 or not 0.0 <= self.tree_threshold <= 1.0 or self.tree_topk < 0:
            raise ValueError("thresholds must be within [0, 1) and tree_topk >= 0")
        if self.strategy == "dynamic-tree" and not (1 <= self.tree_topk <= MAX_TOPK and 1 <= self.tree_depth <= 16):
            raise ValueError(f"dynamic-tree needs tree_topk within 1..{MAX_TOPK} and tree_depth within 1..16")

    def tree_options(self) -> DynamicTreeOptions | None:
        """The dynamic tree's shape (None for the other strategies); the request's budget caps its nodes."""
        if self.strategy != "dynamic-tree":
            return None
        return DynamicTreeOptions(depth=self.tree_depth, topk=self.tree_topk, total=64)

    def model_options(self) -> ModelDraftOptions:
        return ModelDraftOptions(
            confidence_threshold=self.confidence_threshold if self.strategy == "adaptive" else 0.0,
            tree_topk=self.tree_topk if self.strategy == "sparse-tree" else 0,
            tree_threshold=self.tree_threshold)


def _drafter_missing(path: Path) -> list[str]:
    """What a drafter directory lacks: its config.json and weights."""
    missing = [] if (path / "config.json").is_file() else ["config.json"]
    if not (any(path.glob("*.safetensors")) or any(path.glob("pytorch_model*.bin"))):
        missing.append("*.safetensors (SpecForge: or pytorch_model.bin)")
    return missing


def resolve_drafter_dir(name_or_dir: str) -> Path:
    """A drafter directory by path, or by name found offline by :func:`~specli.io.locate.locate`
    (``$SPECLI_MODELS_DIR/<name>``, a hub id in the local Hugging Face cache); never downloads."""
    return locate(name_or_dir, Lookup("drafter", required=_drafter_missing))


def wrap(module: SpeechDraftModule, options: SpeechDraftOptions = SpeechDraftOptions()) -> Drafter:
    """The drafter for a loaded module and a strategy."""
    if isinstance(module, Eagle3Module):
        drafter: Drafter = Eagle3Drafter(module, options.model_options(), options.tree_options())
    elif isinstance(module, BlockDraftModule):
        drafter = BlockDrafter(module, options.model_options(), options.tree_options())
    else:
        raise TypeError(f"not a block drafter module: {type(module).__name__}")
    return RecyclingDrafter(drafter) if options.strategy == "recycling" else drafter


def load_drafter(name_or_dir: str, target: DraftableTarget, options: SpeechDraftOptions = SpeechDraftOptions(),
                 kind: str | None = None, layout: VocabLayout | None = None) -> Drafter:
    """Load a drafter directory for ``target`` (checks ``kind`` when given), attach its layers, wrap it."""
    path = resolve_drafter_dir(name_or_dir)
    if drafter_format(path) == "specforge-eagle3":
        module: SpeechDraftModule = load_specforge_eagle3(path, target, layout)
    else:
        module = load_speech_drafter(path, target, layout)
    if kind is not None and kind in KINDS and module.config.kind != kind:
        raise ModelLoadError(f"drafter {name_or_dir!r} is a {module.config.kind} drafter, the preset expects {kind}")
    try:
        attach_aux_layers(target, module.config)
    except ValueError as exc:
        raise ModelLoadError(f"drafter {name_or_dir!r}: {exc}") from exc
    try:
        return wrap(module, options)
    except ValueError as exc:
        raise ModelLoadError(f"drafter {name_or_dir!r}: {exc}") from exc
