"""Named presets: TOML files beside this module, read into frozen, validated dataclasses."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from types import UnionType
from typing import Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from specli.errors import PresetError
from specli.models.registry import Task, family, family_of_model

P = TypeVar("P", bound="PresetBase")  # a preset dataclass (Preset or SynthesisPreset)

# what `transcribe` / `translate` and `specli.asr.pipeline.transcribe` use unless told otherwise: whisper-base with
# the shipped EAGLE-ASR head (lossless: the same text as whisper-base-ar, faster on held-out speech)
DEFAULT_PRESET = "whisper-eagle-asr"

Strategy = Literal["ar", "chain", "adaptive", "recycling", "sparse-tree", "dynamic-tree"]
DrafterKind = Literal["none", "pool", "model", "cross-tokenizer", "eagle"]
DType = Literal["auto", "float32", "bfloat16", "float16", "int8"]  # auto: core.device.auto_dtype; int8: CPU weight-only
HeadWeights = Literal["auto", "int8", "float"]  # auto: int8 on the CPU, float elsewhere
DraftLength = Literal["fixed", "goodput"]  # specli.core.goodput
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


@dataclass(frozen=True)
class PresetBase:
    """What every preset has, and the one validation every preset goes through: each value of its field's
    type, each ``Literal`` field one of its choices, a registered family, a device spec; then the family's
    own rules (:meth:`_check`)."""

    name: str  # preset name (the TOML file's stem)
    model: str  # the family's model: a bundled name, a directory, a cached hub id
    family: str = "whisper"  # model family (specli.models.registry): which pipeline runs it, how it loads
    description: str = ""  # one line shown by `specli presets`
    device: str = "auto"  # auto (CUDA when available, else CPU), cpu, cuda or cuda:N

    def __post_init__(self) -> None:
        self._check_types()
        if not self.model:
            raise PresetError(f"preset {self.name!r}: 'model' must not be empty")
        for fname, kind in get_type_hints(type(self)).items():
            if get_origin(kind) is Literal and getattr(self, fname) not in get_args(kind):
                raise PresetError(f"preset {self.name!r}: {fname} must be one of {list(get_args(kind))}, "
                                  f"not {getattr(self, fname)!r}")
        try:
            own = family(self.family)
        except ValueError as exc:
            raise PresetError(f"preset {self.name!r}: {exc}") from None
        if own.preset_class() is not type(self):
            raise PresetError(f"preset {self.name!r}: family {self.family!r} presets are not {type(self).__name__}s")
        if not _DEVICE.match(self.device):
            raise PresetError(f"preset {self.name!r}: device must be auto, cpu, cuda or cuda:N, not {self.device!r}")
        self._check()

    def _check(self) -> None:
        """The family's own rules (raise PresetError)."""

    def bad(self, msg: str) -> PresetError:
        """A PresetError naming this preset."""
        return PresetError(f"preset {self.name!r}: {msg}")

    def _check_types(self) -> None:
        """Each value has its field's annotated type (bool is not an int; an int is taken for a float)."""
        for fname, kind in get_type_hints(type(self)).items():
            value = getattr(self, fname)
            if get_origin(kind) in (Union, UnionType):  # optional values: None or the type
                if value is None:
                    continue
                kind = next(k for k in get_args(kind) if k is not type(None))
            origin = get_origin(kind)
            expected = type(get_args(kind)[0]) if origin is Literal else origin or kind
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, fname, float(value))
                continue
            if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
                raise PresetError(
                    f"preset {self.name!r}: {fname} must be {_type_word(expected)}, "
                    f"not {_type_word(type(value))} ({value!r})"
                )


@dataclass(frozen=True)
class Preset(PresetBase):
    """A transcription preset (family ``whisper``): target model, strategy and numeric type."""

    strategy: Strategy = "ar"  # "ar" = plain greedy; the others draft and verify (lossless)
    dtype: DType = "auto"  # numeric type of the target's weights and activations (auto: by device)
    drafter: DrafterKind = "none"  # pool = n-gram pool of earlier hypotheses; model / cross-tokenizer / eagle
    draft_model: str = ""  # the drafter's model, for drafter = model or cross-tokenizer
    head: str = ""  # eagle: directory or shipped name of a trained Speech-Draft head (`specli distill train`)
    head_weights: HeadWeights = "auto"  # eagle chain: the head's matrices int8 weight-only, or float (its dtype)
    max_draft: int = 8  # most draft tokens (tree nodes) per target forward (hard cap 24 for adaptive)
    # stop drafting in a window whose accepted draft tokens per target forward fall below this (0 = never)
    stop_drafting_below: float = 0.0
    # draft length per step: "fixed" = up to max_draft (and the strategy's confidence rule); "goodput" = as many as
    # maximise expected tokens per second under costs measured in this process (0 included: no drafting)
    draft_length: DraftLength = "fixed"
    # batched decoding drafts only while at most this many files are in flight: rows that join beside as many
    # others, and every row once more are active, decode plainly (0 = no limit; CPU measurements: README)
    max_draft_rows: int = 0
    confidence_threshold: float = 0.0  # adaptive, sparse-tree: the chain stops below it; dynamic-tree: min path prob.
    tree_topk: int = 2  # sparse-tree: alternatives per low-confidence position; dynamic-tree: nodes expanded per level
    tree_threshold: float = 0.6  # sparse-tree: positions below this drafter probability branch
    branch_steps: int = 3  # sparse-tree: tokens drafted on from each alternative (SpecASR's second pass; 0 = leaves)
    tree_depth: int = 5  # dynamic-tree: levels of the EAGLE-2 tree (head forwards per proposal)
    ngram: int = 4  # pool: longest suffix matched

    def _check(self) -> None:
        bad = self.bad
        if (self.strategy == "ar") != (self.drafter == "none"):
            raise bad("strategy 'ar' takes drafter 'none'; every other strategy needs a drafter")
        if self.drafter in ("model", "cross-tokenizer") and not self.draft_model:
            raise bad(f"drafter {self.drafter!r} needs 'draft_model'")
        if (self.drafter == "eagle") != bool(self.head):
            raise bad("drafter 'eagle' needs 'head', and 'head' is for drafter 'eagle' only")
        if self.strategy == "adaptive" and (self.drafter == "pool" or self.confidence_threshold <= 0):
            raise bad("strategy 'adaptive' needs a model drafter and confidence_threshold > 0")
        if self.strategy == "sparse-tree" and (self.drafter == "pool" or self.tree_topk < 1):
            raise bad("strategy 'sparse-tree' needs a model drafter and tree_topk >= 1")
        if self.strategy == "dynamic-tree" and (self.drafter != "eagle" or not 1 <= self.tree_topk <= 8
                                                or not 1 <= self.tree_depth <= 16
                                                or 1 + self.tree_topk * (self.tree_depth - 1) > 32):
            raise bad("strategy 'dynamic-tree' needs drafter 'eagle', tree_topk within 1..8, tree_depth within "
                      "1..16, and 1 + tree_topk * (tree_depth - 1) <= 32 (the head's draft-step cache)")
        if self.branch_steps < 0:
            raise bad("branch_steps must be >= 0")
        if not 1 <= self.max_draft <= 24:
            raise bad("max_draft must be within 1..24")
        if not 0.0 <= self.stop_drafting_below < 24:
            raise bad("stop_drafting_below must be within [0, 24)")
        if not 0.0 <= self.confidence_threshold < 1.0 or not 0.0 <= self.tree_threshold <= 1.0:
            raise bad("thresholds must be within [0, 1)")
        if self.ngram < 1:
            raise bad("ngram must be >= 1")
        if self.max_draft_rows < 0:
            raise bad("max_draft_rows must be >= 0 (0 = no limit)")


def _type_word(kind: type) -> str:
    """The TOML word for a Python type (for messages)."""
    words = {str: "a string", int: "an integer", float: "a number", bool: "a boolean (true/false)",
             list: "an array", dict: "a table"}
    return words.get(kind, kind.__name__)


def build_preset(cls: type[P], name: str, data: dict) -> P:
    """Build the preset dataclass ``cls`` called ``name`` from ``data``, rejecting unknown keys."""
    known = {f.name for f in fields(cls)} - {"name"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise PresetError(f"preset {name!r}: unknown key(s) {unknown}; known keys are {sorted(known)}")
    return cls(name=name, **data)


def preset_from_dict(name: str, data: dict) -> PresetBase:
    """Build the preset of ``data``'s family (its class in :mod:`specli.models.registry`), rejecting unknown
    keys."""
    if "task" in data:  # the marker synthesis presets had before families
        raise PresetError(f"preset {name!r}: 'task' is no preset key; a synthesis preset says family = \"cosyvoice\"")
    fam = data.get("family", "whisper")
    try:
        cls = family(fam).preset_class() if isinstance(fam, str) else None
    except ValueError as exc:
        raise PresetError(f"preset {name!r}: {exc}") from None
    if cls is None:
        raise PresetError(f"preset {name!r}: family must be a string")
    return build_preset(cls, name, data)


def preset_task(name_or_path: str) -> Task:
    """The pipeline a preset runs in (its family's task): transcribe or synthesize."""
    return family(load_any_preset(name_or_path).family).task


def available_presets(task: Task | None = "transcribe") -> list[str]:
    """Names of the presets shipped with specli whose family runs in ``task`` (None: all)."""
    names = sorted(p.name[:-5] for p in resources.files(__package__).iterdir() if p.name.endswith(".toml"))
    return names if task is None else [n for n in names if preset_task(n) == task]


def load_any_preset(name_or_path: str) -> PresetBase:
    """A shipped preset by name, or a TOML file by path, of any family."""
    return preset_from_dict(*read_preset_toml(name_or_path))


def load_preset(name_or_path: str) -> Preset:
    """A transcription preset: shipped by name, or a TOML file by path."""
    preset = load_any_preset(name_or_path)
    if not isinstance(preset, Preset):
        raise PresetError(f"preset {preset.name!r} is a synthesis preset: use it with "
                          f"`specli synthesize --preset {preset.name}`")
    return preset


def preset_for_model(preset: Preset, model: str | None) -> Preset:
    """The preset to run ``model`` with when no preset was named: ``preset`` itself, unless another family
    claims ``model`` (``specli transcribe --model <Qwen2-Audio dir>``): then that family's default preset."""
    owner = family_of_model(model) if model else None
    if owner is None or owner.name == preset.family or not owner.default_preset:
        return preset
    return load_preset(owner.default_preset)


def read_preset_toml(name_or_path: str) -> tuple[str, dict]:
    """``(name, table)`` of a shipped preset by name, or of a TOML file by path."""
    path = Path(name_or_path)
    if path.suffix == ".toml" and path.is_file():
        text, name = path.read_text(), path.stem
    else:
        res = resources.files(__package__) / f"{name_or_path}.toml"
        if not res.is_file():
            raise PresetError(f"unknown preset {name_or_path!r}; available: {', '.join(available_presets(None))}")
        text, name = res.read_text(), name_or_path
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PresetError(f"preset {name!r}: invalid TOML: {exc}") from exc
    return name, data
