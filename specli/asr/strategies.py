"""Build a preset's decode method (plain autoregressive, or speculative with its drafter)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from specli.core.drafters.base import Drafter
from specli.asr.drafters.cross_tokenizer import CrossTokenizerDrafter
from specli.asr.drafters.dynamic_tree import DynamicTreeDrafter, DynamicTreeOptions
from specli.asr.drafters.eagle_head import load_head
from specli.asr.drafters.eagle import EagleDrafter
from specli.asr.drafters.model import ModelDrafter, ModelDraftOptions
from specli.core.drafters.llm.loading import SpeechDraftOptions, load_drafter
from specli.core.drafters.ngram import NgramDrafter, NgramPool
from specli.core.drafters.recycling import RecyclingDrafter
from specli.asr.fallback import AR, DecodeMethod
from specli.asr.speech import speech_hooks
from specli.core.goodput import FixedCosts, MoECosts, OnlineCosts
from specli.core.speculative import SpecOptions
from specli.core.device import dtype_name, resolve_device
from specli.models.registry import family
from specli.models.whisper.loader import WhisperModel, load_whisper
from specli.presets import Preset


def _draft_options(preset: Preset) -> ModelDraftOptions:
    return ModelDraftOptions(
        confidence_threshold=preset.confidence_threshold if preset.strategy in ("adaptive", "sparse-tree") else 0.0,
        tree_topk=preset.tree_topk if preset.strategy == "sparse-tree" else 0,
        tree_threshold=preset.tree_threshold,
        branch_steps=preset.branch_steps,
    )


def _tree_options(preset: Preset) -> DynamicTreeOptions:
    """EAGLE-2 dynamic tree: ``tree_depth`` levels, ``tree_topk`` expanded per level, ``max_draft`` nodes kept,
    none whose path probability is below ``confidence_threshold``."""
    return DynamicTreeOptions(depth=preset.tree_depth, topk=preset.tree_topk, total=min(preset.max_draft, 24),
                              min_path=preset.confidence_threshold)


def build_drafter(preset: Preset, target: WhisperModel, language: str | None = None) -> Drafter:
    """The preset's drafter for ``target`` (loads a draft model when the preset names one)."""
    if preset.drafter == "pool":
        drafter: Drafter = NgramDrafter(NgramPool(preset.ngram), speech_hooks(target).eot)
    elif preset.drafter == "model":
        draft = load_whisper(preset.draft_model, preset.dtype, device=target.target.device)
        if draft.target.dims.vocab != target.target.dims.vocab:
            raise ValueError(f"draft model {preset.draft_model!r} has another vocabulary: use cross-tokenizer")
        drafter = ModelDrafter(draft.target, _draft_options(preset))
    elif preset.drafter == "cross-tokenizer":
        draft = load_whisper(preset.draft_model, preset.dtype, device=target.target.device)
        drafter = CrossTokenizerDrafter(draft, target, language or "en", _draft_options(preset))
    elif preset.drafter == "eagle" and preset.strategy == "dynamic-tree":
        drafter = DynamicTreeDrafter(load_head(preset.head, target.target), _tree_options(preset))
    elif preset.drafter in ("eagle3", "dflash"):  # a trained LLM drafter reading the target's aux layers
        drafter = load_drafter(preset.draft_dir, target.target, SpeechDraftOptions(), kind=preset.drafter)
    elif preset.drafter == "eagle":
        drafter = EagleDrafter(load_head(preset.head, target.target), _draft_options(preset),
                               int8=None if preset.head_weights == "auto" else preset.head_weights == "int8")
    else:
        raise ValueError(f"preset {preset.name!r} has no drafter")
    return RecyclingDrafter(drafter) if preset.strategy == "recycling" else drafter


# goodput's first guess, in one-token target forwards, until this process has timed its own (notes/cpu-decoding-costs:
# an EAGLE head token ~7 % of a whisper-base step; a verify of n tokens ~1 + 0.08 (n - 1) steps in bf16; 4 batch
# rows ~1.3x one); OnlineCosts replaces it with measured seconds per (rows, tokens) as the decode goes
DRAFT_COST_PRIOR = FixedCosts(draft_s=0.07, base=1.0, slope=0.08, row_exp=0.2)


def goodput_prior(target: object) -> FixedCosts | MoECosts:
    """The goodput rule's first guess for ``target``: DRAFT_COST_PRIOR, or for a sparse-MoE target (one with a
    ``moe_profile``) the same with the experts' share scaled by the distinct experts a verification touches, read
    from the target's expert tally as the process decodes."""
    profile = target.moe_profile() if hasattr(target, "moe_profile") else None
    if profile is None:
        return DRAFT_COST_PRIOR
    tally = getattr(target, "experts", None)  # an MoE target's ExpertTally
    observed = None if tally is None else partial(tally.layer_mean, layers=profile.layers)
    return MoECosts(DRAFT_COST_PRIOR, profile, observed)


def build_decoder(preset: Preset, target: WhisperModel, language: str | None = None) -> DecodeMethod:
    """Plain autoregressive decoding for 'ar' presets, else the preset's drafter and speculation settings."""
    if preset.strategy == "ar":
        return AR
    costs = OnlineCosts(goodput_prior(target.target)) if preset.draft_length == "goodput" else None
    return DecodeMethod(build_drafter(preset, target, language),
                        SpecOptions(max_draft=min(preset.max_draft, 24), stop_below=preset.stop_drafting_below,
                                    costs=costs, max_draft_rows=preset.max_draft_rows or None))


@dataclass(frozen=True)
class Engine:
    """A loaded target and the decode method its preset asks for."""

    preset: Preset
    model: WhisperModel
    decode: DecodeMethod  # drafter (None: plain autoregressive) and speculation settings


def load_engine(preset: Preset, model: str | None = None, dtype: str | None = None,
                language: str | None = None, compile_encoder: bool = False, device: str | None = None) -> Engine:
    """Load the preset's target (or ``model``) in ``dtype`` on ``device`` (default: the preset's; encoder
    compiled if asked) and build its decoder. ``Engine.preset`` holds the effective dtype and device."""
    p = replace(preset, model=model or preset.model, dtype=dtype or preset.dtype, device=device or preset.device)
    dev = resolve_device(p.device)
    whisper = family(p.family).load(p.model, p.dtype, compile_encoder=compile_encoder, device=dev)
    p = replace(p, dtype=dtype_name(whisper.target.dtype), device=str(dev))
    return Engine(p, whisper, build_decoder(p, whisper, language))
