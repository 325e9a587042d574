"""Named presets: TOML files beside this module, read into frozen, validated dataclasses."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import ClassVar, Literal, TypeVar

from specli.errors import PresetError
from specli.models.registry import Task, family, family_of_model
from specli.presets.draft import DRAFT_FIELDS, DraftSpec, check_fields

P = TypeVar("P", bound="PresetBase")  # a preset dataclass (Preset or SynthesisPreset)

# what `transcribe` / `translate` and `specli.asr.pipeline.transcribe` use unless told otherwise: whisper-base with
# the shipped EAGLE-ASR head (lossless: the same text as whisper-base-ar, faster on held-out speech)
DEFAULT_PRESET = "whisper-eagle-asr"

DType = Literal["auto", "float32", "bfloat16", "float16", "int8"]  # auto: core.device.auto_dtype; int8: CPU weight-only
# how a file longer than 30 s is transcribed: "sequential" = 30-s windows one after another, each prompted with the
# previous text (specli.asr.windows); "batched" = its voiced chunks of <= 30 s decoded side by side as rows of one
# batch, without that prompt (specli.asr.batched_longform, faster-whisper's BatchedInferencePipeline)
LongForm = Literal["sequential", "batched"]
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


@dataclass(frozen=True)
class PresetBase:
    """What every preset has, and the one validation every preset goes through: each value of its field's
    type, each ``Literal`` field one of its choices, a registered family, a device spec, a drafter kind of
    ``DRAFTER_KINDS`` and no speculation setting outside ``DRAFT_KEYS``; then the family's own rules
    (:meth:`_check`)."""

    DRAFTER_KINDS: ClassVar[tuple[str, ...]] = ("none",)  # the drafter kinds this family takes
    DRAFT_KEYS: ClassVar[frozenset[str]] = frozenset()  # the DraftSpec fields its TOML may set (flat keys)

    name: str  # preset name (the TOML file's stem)
    model: str  # the family's model: a bundled name, a directory, a cached hub id
    family: str = "whisper"  # model family (specli.models.registry): which pipeline runs it, how it loads
    description: str = ""  # one line shown by `specli presets`
    device: str = "auto"  # auto (CUDA when available, else CPU), cpu, cuda or cuda:N
    draft: DraftSpec = DraftSpec()  # drafter and speculation settings (the TOML's flat keys of DRAFT_KEYS)

    def __post_init__(self) -> None:
        try:
            check_fields(self)
        except PresetError as exc:
            raise self.bad(str(exc)) from None
        if not self.model:
            raise self.bad("'model' must not be empty")
        try:
            own = family(self.family)
        except ValueError as exc:
            raise self.bad(str(exc)) from None
        if own.preset_class() is not type(self):
            raise self.bad(f"family {self.family!r} presets are not {type(self).__name__}s")
        if not _DEVICE.match(self.device):
            raise self.bad(f"device must be auto, cpu, cuda or cuda:N, not {self.device!r}")
        self._check_draft()
        self._check()

    def _check_draft(self) -> None:
        """The drafter is one of this family's kinds, and no speculation setting it does not take is set."""
        if self.draft.drafter not in self.DRAFTER_KINDS:
            raise self.bad(f"drafter must be one of {list(self.DRAFTER_KINDS)}, not {self.draft.drafter!r}")
        default = default_draft(type(self))
        stray = [k for k in sorted(DRAFT_FIELDS - self.DRAFT_KEYS) if getattr(self.draft, k) != getattr(default, k)]
        if stray:
            raise self.bad(f"{stray} are no settings of family {self.family!r} presets")

    def _check(self) -> None:
        """The family's own rules (raise PresetError)."""

    def bad(self, msg: str) -> PresetError:
        """A PresetError naming this preset."""
        return PresetError(f"preset {self.name!r}: {msg}")

    def with_draft(self: P, **changes: object) -> P:
        """This preset with some of its speculation settings changed (validated again)."""
        return replace(self, draft=replace(self.draft, **changes))


@dataclass(frozen=True)
class Preset(PresetBase):
    """A transcription preset (family ``whisper``): target model, numeric type, drafter and strategy."""

    # pool = n-gram pool of earlier hypotheses; model / cross-tokenizer: a smaller Whisper; eagle: a trained head
    DRAFTER_KINDS: ClassVar[tuple[str, ...]] = ("none", "pool", "model", "cross-tokenizer", "eagle")
    DRAFT_KEYS: ClassVar[frozenset[str]] = DRAFT_FIELDS - {"draft_dir"}

    dtype: DType = "auto"  # numeric type of the target's weights and activations (auto: by device)
    longform: LongForm = "sequential"  # long files: sequential windows, or voiced chunks as batch rows (opt-in)

    def _check(self) -> None:
        bad, d = self.bad, self.draft
        if d.drafter in ("model", "cross-tokenizer") and not d.draft_model:
            raise bad(f"drafter {d.drafter!r} needs 'draft_model'")
        if (d.drafter == "eagle") != bool(d.head):
            raise bad("drafter 'eagle' needs 'head', and 'head' is for drafter 'eagle' only")
        if d.strategy == "adaptive" and (d.drafter == "pool" or d.confidence_threshold <= 0):
            raise bad("strategy 'adaptive' needs a model drafter and confidence_threshold > 0")
        if d.strategy == "sparse-tree" and (d.drafter == "pool" or d.tree_topk < 1):
            raise bad("strategy 'sparse-tree' needs a model drafter and tree_topk >= 1")
        if d.strategy == "dynamic-tree" and (d.drafter != "eagle" or not 1 <= d.tree_topk <= 8
                                             or not 1 <= d.tree_depth <= 16
                                             or 1 + d.tree_topk * (d.tree_depth - 1) > 32):
            raise bad("strategy 'dynamic-tree' needs drafter 'eagle', tree_topk within 1..8, tree_depth within "
                      "1..16, and 1 + tree_topk * (tree_depth - 1) <= 32 (the head's draft-step cache)")


def default_draft(cls: type[PresetBase]) -> DraftSpec:
    """The speculation settings a preset of ``cls`` has where its TOML sets none."""
    return next(f.default for f in fields(cls) if f.name == "draft")


def build_preset(cls: type[P], name: str, data: dict) -> P:
    """Build the preset dataclass ``cls`` called ``name`` from the flat table ``data`` (its speculation keys
    into :class:`DraftSpec`), rejecting unknown keys."""
    own = {f.name for f in fields(cls)} - {"name", "draft"}
    unknown = sorted(set(data) - own - cls.DRAFT_KEYS)
    if unknown:
        raise PresetError(f"preset {name!r}: unknown key(s) {unknown}; known keys are "
                          f"{sorted(own | cls.DRAFT_KEYS)}")
    try:
        draft = replace(default_draft(cls), **{k: v for k, v in data.items() if k in cls.DRAFT_KEYS})
    except PresetError as exc:
        raise PresetError(f"preset {name!r}: {exc}") from None
    return cls(name=name, draft=draft, **{k: v for k, v in data.items() if k in own})


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
    claims ``model`` (``specli transcribe --model <Qwen2-Audio dir>``): then that family's default preset; or
    ``preset`` drafts with a head trained for its own model and ``model`` is another (``--model whisper-tiny.en``
    beside the whisper-base default): then the shipped preset with the same drafter and strategy for ``model``,
    else ``preset`` for ``model`` decoding without a drafter (the same text: a head drafts only for its target)."""
    owner = family_of_model(model) if model else None
    if owner is not None and owner.name != preset.family and owner.default_preset:
        return load_preset(owner.default_preset)
    if not model or model == preset.model or not preset.draft.head:
        return preset
    for name in available_presets("transcribe"):
        twin = load_any_preset(name)
        if (isinstance(twin, Preset) and twin.family == preset.family and twin.model == model
                and (twin.draft.drafter, twin.draft.strategy) == (preset.draft.drafter, preset.draft.strategy)):
            return twin
    return replace(preset, model=model, draft=default_draft(Preset))


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
