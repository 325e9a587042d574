"""The transcription pipeline's drafter kinds, registered in :data:`specli.core.drafters.registry.DRAFTERS` under
``"transcribe"``. Each builder takes the loaded speech model, the preset's :class:`DraftSpec`, the output
``language`` (a cross-tokenizer drafter re-tokenizes in it) and the preset's ``dtype`` (a draft model's):

* ``pool``: the n-gram pool over earlier windows (any family);
* ``model`` / ``cross-tokenizer``: a smaller Whisper with the same / another vocabulary;
* ``eagle``: a trained Speech-Draft head, chaining (or the EAGLE-2 tree for strategy ``dynamic-tree``);
* ``eagle3`` / ``dflash``: a trained LLM drafter reading an audio LLM's aux layers.
"""

from __future__ import annotations

from specli.asr.drafters.cross_tokenizer import CrossTokenizerDrafter
from specli.asr.drafters.dynamic_tree import DynamicTreeDrafter, DynamicTreeOptions
from specli.asr.drafters.eagle import EagleDrafter
from specli.asr.drafters.eagle_head import load_head
from specli.asr.drafters.model import ModelDrafter, ModelDraftOptions
from specli.core.drafters.base import Drafter
from specli.core.drafters.llm.loading import load_drafter
from specli.core.drafters.ngram import NgramDrafter, NgramPool
from specli.core.drafters.registry import DRAFTERS
from specli.models.whisper.loader import WhisperModel, load_whisper
from specli.presets.draft import DraftSpec, llm_draft_options

TASK = "transcribe"


def _draft_options(spec: DraftSpec) -> ModelDraftOptions:
    return ModelDraftOptions(
        confidence_threshold=spec.confidence_threshold if spec.strategy in ("adaptive", "sparse-tree") else 0.0,
        tree_topk=spec.tree_topk if spec.strategy == "sparse-tree" else 0,
        tree_threshold=spec.tree_threshold,
        branch_steps=spec.branch_steps,
    )


def _tree_options(spec: DraftSpec) -> DynamicTreeOptions:
    """EAGLE-2 dynamic tree: ``tree_depth`` levels, ``tree_topk`` expanded per level, ``max_draft`` nodes kept,
    none whose path probability is below ``confidence_threshold``."""
    return DynamicTreeOptions(depth=spec.tree_depth, topk=spec.tree_topk, total=min(spec.max_draft, 24),
                              min_path=spec.confidence_threshold)


def _draft_whisper(model: WhisperModel, spec: DraftSpec, dtype: str) -> WhisperModel:
    return load_whisper(spec.draft_model, dtype, device=model.target.device)


@DRAFTERS.register(TASK, "pool")
def pool(model, spec: DraftSpec, language: str | None, dtype: str) -> Drafter:
    return NgramDrafter(NgramPool(spec.ngram), model.speech_hooks().eot)


@DRAFTERS.register(TASK, "model")
def smaller_model(model: WhisperModel, spec: DraftSpec, language: str | None, dtype: str) -> Drafter:
    draft = _draft_whisper(model, spec, dtype)
    if draft.target.dims.vocab != model.target.dims.vocab:
        raise ValueError(f"draft model {spec.draft_model!r} has another vocabulary: use cross-tokenizer")
    return ModelDrafter(draft.target, _draft_options(spec))


@DRAFTERS.register(TASK, "cross-tokenizer")
def cross_tokenizer(model: WhisperModel, spec: DraftSpec, language: str | None, dtype: str) -> Drafter:
    return CrossTokenizerDrafter(_draft_whisper(model, spec, dtype), model, language or "en", _draft_options(spec))


@DRAFTERS.register(TASK, "eagle")
def eagle(model: WhisperModel, spec: DraftSpec, language: str | None, dtype: str) -> Drafter:
    head = load_head(spec.head, model.target)
    if spec.strategy == "dynamic-tree":
        return DynamicTreeDrafter(head, _tree_options(spec))
    return EagleDrafter(head, _draft_options(spec),
                        int8=None if spec.head_weights == "auto" else spec.head_weights == "int8")


@DRAFTERS.register(TASK, "eagle3")
@DRAFTERS.register(TASK, "dflash")
def llm_drafter(model, spec: DraftSpec, language: str | None, dtype: str) -> Drafter:
    """A trained LLM drafter reading the target's aux layers (loading attaches them)."""
    return load_drafter(spec.draft_dir, model.target, llm_draft_options(spec), kind=spec.drafter)
