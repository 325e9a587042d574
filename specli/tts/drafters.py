"""The synthesis pipeline's drafter kinds, registered in :data:`specli.core.drafters.registry.DRAFTERS` under
``"synthesize"``. Each builder takes the loaded CosyVoice model, the run's :class:`DraftSpec` and ``greedy`` (the
sampler draws nothing):

* ``pool``: the n-gram pool over earlier outputs; with a sampler, each request's own tokens only
  (:class:`OwnTokensDrafter`: a request's sampled tokens do not depend on the requests decoded before it);
* ``dspark`` / ``dflash`` / ``eagle3``: that kind of trained drafter from ``draft_dir``; ``model``: any drafter
  directory (``--draft DIR``; its kind read from its config). ``draft_dir`` is a directory, a drafter shipped
  beside a voice (``specli-en/dflash``) or a name under $SPECLI_MODELS_DIR; loading attaches its layers to the LM.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from specli.core.drafters.base import Drafter
from specli.core.drafters.llm.loading import load_drafter, resolve_drafter_dir
from specli.core.drafters.ngram import NgramDrafter, NgramPool
from specli.core.drafters.registry import DRAFTERS
from specli.models.cosyvoice.lm import CosyVoiceModel
from specli.models.cosyvoice.voices import shipped_part
from specli.presets.draft import DraftSpec, llm_draft_options
from specli.presets.synthesis import SynthesisPreset

TASK = "synthesize"


class OwnTokensDrafter(NgramDrafter):
    """The n-gram drafter over the request's own tokens only: each ``start`` begins with an empty pool, so a
    request's drafts (and so its sampled tokens) do not depend on the requests decoded before it."""

    def fork(self) -> OwnTokensDrafter:
        return OwnTokensDrafter(NgramPool(self.pool.max_ngram), self.eot, self.min_ngram)

    def start(self, state, prompt: list[int]) -> None:
        super().start(state, prompt)
        self.pool = NgramPool(self.pool.max_ngram)


@DRAFTERS.register(TASK, "pool")
def pool(model: CosyVoiceModel, spec: DraftSpec, greedy: bool) -> Drafter:
    drafts = NgramPool(spec.ngram)
    return NgramDrafter(drafts, model.spec.eos) if greedy else OwnTokensDrafter(drafts, model.spec.eos)


@DRAFTERS.register(TASK, "dspark")
@DRAFTERS.register(TASK, "dflash")
@DRAFTERS.register(TASK, "eagle3")
@DRAFTERS.register(TASK, "model")
def trained(model: CosyVoiceModel, spec: DraftSpec, greedy: bool) -> Drafter:
    """A trained drafter from ``draft_dir`` (:func:`drafter_dir`), reading the LM's aux layers."""
    where = str(drafter_dir(spec.draft_dir))
    return load_drafter(where, model.lm, llm_draft_options(spec), None if spec.drafter == "model" else spec.drafter)


def drafter_dir(draft_dir: str) -> Path:
    """Where a synthesis drafter is: a directory by that path first, then one shipped beside a voice
    (``specli-en/dflash``, checked against the voice's SHA256SUMS), then a name found offline
    (``$SPECLI_MODELS_DIR``, the local Hugging Face cache); the one place loading and resume settings ask."""
    local = Path(draft_dir).expanduser()
    if local.is_dir():
        return local
    shipped = shipped_part(draft_dir)
    return shipped if shipped is not None else resolve_drafter_dir(draft_dir)


def check_draft(spec: DraftSpec) -> None:
    """ValueError unless ``spec``'s drafter is "none" or a registered synthesis kind with what it needs."""
    if spec.drafter not in ("none", *DRAFTERS.kinds(TASK)):
        raise ValueError(f"unknown synthesis drafter {spec.drafter!r} (none, {', '.join(DRAFTERS.kinds(TASK))})")
    if spec.drafter not in ("none", "pool") and not spec.draft_dir:
        raise ValueError(f"drafter {spec.drafter!r} needs a drafter directory")


def run_draft(spec: DraftSpec, draft: str | None = None) -> DraftSpec:
    """The speculation a synthesis run decodes with: ``spec`` (a preset's), its drafter replaced by ``draft`` (the
    CLI's ``--draft``: none, pool, a preset drafter kind, else a drafter directory or name, kind ``model``).
    The pool and a drafter given for an ``ar`` preset chain; the trees and adaptive are for trained drafters."""
    kind, where = draft or spec.drafter, spec.draft_dir
    if kind not in SynthesisPreset.DRAFTER_KINDS:
        kind, where = "model", kind
    if kind == "none":
        return replace(spec, strategy="ar", drafter="none", draft_dir=where)
    keep = spec.strategy not in ("ar", "chain") and kind != "pool"
    return replace(spec, strategy=spec.strategy if keep else "chain", drafter=kind, draft_dir=where)
