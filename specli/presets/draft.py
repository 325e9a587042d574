"""How a preset speculates: :class:`DraftSpec`, one frozen, validated dataclass embedded in every preset class.

A preset TOML keeps its speculation settings as flat top-level keys (``strategy = "chain"``, ``drafter = "pool"``,
``max_draft = 8``...); each is the :class:`DraftSpec` field of the same name. A preset class says which of them its
family takes (``DRAFT_KEYS``) and which drafter kinds (``DRAFTER_KINDS``, each registered by its pipeline in
:data:`specli.core.drafters.registry.DRAFTERS`); the rules of one kind (what it needs) stay with the preset class.
This module also holds the one field check every preset value goes through (:func:`check_fields`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from types import UnionType
from typing import Literal, Union, get_args, get_origin, get_type_hints

from specli.core.drafters.llm.loading import SpeechDraftOptions
from specli.errors import PresetError

Strategy = Literal["ar", "chain", "adaptive", "recycling", "sparse-tree", "dynamic-tree"]
HeadWeights = Literal["auto", "int8", "float"]  # auto: int8 on the CPU, float elsewhere
DraftLength = Literal["fixed", "goodput"]  # specli.core.goodput


@dataclass(frozen=True)
class DraftSpec:
    """A preset's drafter and speculation settings (kind-independent rules checked here; raises PresetError)."""

    strategy: Strategy = "ar"  # "ar" = a target forward a token (drafter "none"); the others draft and verify
    drafter: str = "none"  # "none", or a kind the preset's pipeline registers (specli.core.drafters.registry)
    draft_model: str = ""  # model / cross-tokenizer (Whisper): the smaller model that drafts
    head: str = ""  # eagle (Whisper): directory or shipped name of a trained Speech-Draft head
    head_weights: HeadWeights = "auto"  # eagle chain: the head's matrices int8 weight-only, or float (its dtype)
    draft_dir: str = ""  # dspark / dflash / eagle3: the drafter directory, or a name under $SPECLI_MODELS_DIR
    max_draft: int = 8  # most draft tokens (tree nodes) per target forward
    # stop drafting in a window whose accepted draft tokens per target forward fall below this (0 = never)
    stop_drafting_below: float = 0.0
    # draft length per step: "fixed" = up to max_draft (and the strategy's confidence rule); "goodput" = as many as
    # maximise expected tokens per second under costs measured in this process (0 included: no drafting)
    draft_length: DraftLength = "fixed"
    # batched decoding drafts only while at most this many rows are in flight: rows that join beside as many
    # others, and every row once more are active, decode plainly (0 = no limit; CPU measurements: README)
    max_draft_rows: int = 0
    confidence_threshold: float = 0.0  # adaptive: the chain stops below it; dynamic-tree (Whisper): min path prob.
    tree_topk: int = 2  # sparse-tree: alternatives per low-confidence position; dynamic-tree: nodes expanded a level
    tree_threshold: float = 0.6  # sparse-tree: positions below this drafter probability branch
    branch_steps: int = 3  # sparse-tree (Whisper): tokens drafted on from each alternative (0 = leaves)
    tree_depth: int = 5  # dynamic-tree: levels of the EAGLE-2 tree
    ngram: int = 4  # pool: longest suffix matched

    def __post_init__(self) -> None:
        check_fields(self)
        if (self.strategy == "ar") != (self.drafter == "none"):
            raise PresetError("strategy 'ar' takes drafter 'none'; every other strategy needs a drafter")
        if not self.drafter:
            raise PresetError("drafter must not be empty (\"none\": no drafter)")
        if not 1 <= self.max_draft <= 24:
            raise PresetError("max_draft must be within 1..24")
        if not 0.0 <= self.stop_drafting_below < 24:
            raise PresetError("stop_drafting_below must be within [0, 24)")
        if not 0.0 <= self.confidence_threshold < 1.0 or not 0.0 <= self.tree_threshold <= 1.0:
            raise PresetError("thresholds must be within [0, 1)")
        if self.tree_topk < 0 or self.branch_steps < 0:
            raise PresetError("tree_topk and branch_steps must be >= 0")
        if self.ngram < 1:
            raise PresetError("ngram must be >= 1")
        if self.max_draft_rows < 0:
            raise PresetError("max_draft_rows must be >= 0 (0 = no limit)")

    @property
    def learns(self) -> bool:
        """The drafter learns from earlier outputs (the n-gram pool): a rebuilt one starts afresh."""
        return self.drafter == "pool"


DRAFT_FIELDS = frozenset(f.name for f in fields(DraftSpec))  # the flat TOML keys a DraftSpec reads


def check_fields(obj: object) -> None:
    """Each field of the dataclass ``obj`` holds its annotated type (bool is not an int; an int is taken for a
    float, and stored as one) and each ``Literal`` field one of its choices; raises PresetError naming the field."""
    hints = get_type_hints(type(obj))
    for fname in (f.name for f in fields(obj)):
        kind, value = hints[fname], getattr(obj, fname)
        if get_origin(kind) in (Union, UnionType):  # optional values: None or the type
            if value is None:
                continue
            kind = next(k for k in get_args(kind) if k is not type(None))
        origin = get_origin(kind)
        expected = type(get_args(kind)[0]) if origin is Literal else origin or kind
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(obj, fname, float(value))
            continue
        if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
            raise PresetError(f"{fname} must be {_type_word(expected)}, not {_type_word(type(value))} ({value!r})")
        if origin is Literal and value not in get_args(kind):
            raise PresetError(f"{fname} must be one of {list(get_args(kind))}, not {value!r}")


def _type_word(kind: type) -> str:
    """The TOML word for a Python type (for messages)."""
    words = {str: "a string", int: "an integer", float: "a number", bool: "a boolean (true/false)",
             list: "an array", dict: "a table"}
    return words.get(kind, kind.__name__)


def llm_draft_options(spec: DraftSpec) -> SpeechDraftOptions:
    """How a trained LLM drafter (dspark / dflash / eagle3) proposes under ``spec``: its strategy (an ``ar`` spec
    drafts nothing; a loaded drafter then chains) and its confidence and tree settings."""
    return SpeechDraftOptions("chain" if spec.strategy == "ar" else spec.strategy, spec.confidence_threshold,
                              spec.tree_topk, spec.tree_threshold, spec.tree_depth)
