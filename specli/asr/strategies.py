"""Build a preset's decode method (plain autoregressive, or speculative with its drafter)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from specli.asr.drafters import kinds  # registers the transcription drafter kinds
from specli.asr.fallback import AR, DecodeMethod
from specli.core.device import dtype_name, resolve_device
from specli.core.drafters.base import Drafter
from specli.core.drafters.recycling import RecyclingDrafter
from specli.core.drafters.registry import DRAFTERS
from specli.core.goodput import FixedCosts, MoECosts, OnlineCosts
from specli.core.speculative import SpecOptions
from specli.models.registry import family
from specli.presets import Preset
from specli.models.speech import SpeechModel, SpeechTarget


def build_drafter(preset: Preset, target: SpeechModel, language: str | None = None) -> Drafter:
    """The preset's drafter for ``target`` (its kind's builder in the drafter registry; loads a draft model
    when the preset names one), re-proposing rejected tails for strategy ``recycling``."""
    spec = preset.draft
    drafter = DRAFTERS.build(kinds.TASK, spec.drafter, target, spec, language=language, dtype=preset.dtype)
    return RecyclingDrafter(drafter) if spec.strategy == "recycling" else drafter


# goodput's first guess, in one-token target forwards, until this process has timed its own (notes/cpu-decoding-costs:
# an EAGLE head token ~7 % of a whisper-base step; a verify of n tokens ~1 + 0.08 (n - 1) steps in bf16; 4 batch
# rows ~1.3x one); OnlineCosts replaces it with measured seconds per (rows, tokens) as the decode goes
DRAFT_COST_PRIOR = FixedCosts(draft_s=0.07, base=1.0, slope=0.08, row_exp=0.2)


def goodput_prior(target: SpeechTarget) -> FixedCosts | MoECosts:
    """The goodput rule's first guess for ``target``: DRAFT_COST_PRIOR, or for a sparse-MoE target (its
    ``moe_profile()`` not None) the same with the experts' share scaled by the distinct experts a verification
    touches, read from the target's expert tally (``experts``) as the process decodes."""
    profile = target.moe_profile()
    if profile is None:
        return DRAFT_COST_PRIOR
    tally = target.experts
    observed = None if tally is None else partial(tally.layer_mean, layers=profile.layers)
    return MoECosts(DRAFT_COST_PRIOR, profile, observed)


def build_decoder(preset: Preset, target: SpeechModel, language: str | None = None) -> DecodeMethod:
    """Plain autoregressive decoding for 'ar' presets, else the preset's drafter and speculation settings."""
    spec = preset.draft
    if spec.strategy == "ar":
        return AR
    costs = OnlineCosts(goodput_prior(target.target)) if spec.draft_length == "goodput" else None
    return DecodeMethod(build_drafter(preset, target, language),
                        SpecOptions(max_draft=min(spec.max_draft, 24), stop_below=spec.stop_drafting_below,
                                    costs=costs, max_draft_rows=spec.max_draft_rows or None))


@dataclass(frozen=True)
class Engine:
    """A loaded target and the decode method its preset asks for."""

    preset: Preset
    model: SpeechModel
    decode: DecodeMethod  # drafter (None: plain autoregressive) and speculation settings


def load_engine(preset: Preset, model: str | None = None, dtype: str | None = None,
                language: str | None = None, compile_encoder: bool = False, device: str | None = None) -> Engine:
    """Load the preset's target (or ``model``) in ``dtype`` on ``device`` (default: the preset's; encoder
    compiled if asked) and build its decoder. ``Engine.preset`` holds the effective dtype and device."""
    p = replace(preset, model=model or preset.model, dtype=dtype or preset.dtype, device=device or preset.device)
    dev = resolve_device(p.device)
    loaded = family(p.family).load(p.model, p.dtype, compile_encoder=compile_encoder, device=dev)
    p = replace(p, dtype=dtype_name(loaded.target.dtype), device=str(dev))
    return Engine(p, loaded, build_decoder(p, loaded, language))
