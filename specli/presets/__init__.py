"""Named presets: TOML files beside this module, read into frozen, validated dataclasses."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Literal, get_args

from specli.errors import PresetError

Strategy = Literal["ar"]
DType = Literal["float32", "bfloat16"]


@dataclass(frozen=True)
class Preset:
    """A named decoding configuration: target model, strategy and numeric type."""

    name: str  # preset name (the TOML file's stem)
    model: str  # bundled model name, Hugging Face id or directory, or CTranslate2 directory
    description: str = ""  # one line shown by `specli presets`
    strategy: Strategy = "ar"  # decoding strategy; "ar" is plain greedy autoregressive decoding
    dtype: DType = "float32"  # numeric type of the target's weights and activations

    def __post_init__(self) -> None:
        if not self.model:
            raise PresetError(f"preset {self.name!r}: 'model' must not be empty")
        for fname, kind in (("strategy", Strategy), ("dtype", DType)):
            if getattr(self, fname) not in get_args(kind):
                raise PresetError(
                    f"preset {self.name!r}: {fname} must be one of {list(get_args(kind))}, "
                    f"not {getattr(self, fname)!r}"
                )


def preset_from_dict(name: str, data: dict) -> Preset:
    """Build a :class:`Preset`, rejecting unknown keys."""
    known = {f.name for f in fields(Preset)} - {"name"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise PresetError(f"preset {name!r}: unknown key(s) {unknown}; known keys are {sorted(known)}")
    return Preset(name=name, **data)


def available_presets() -> list[str]:
    """Names of the presets shipped with specli."""
    return sorted(p.name[:-5] for p in resources.files(__package__).iterdir() if p.name.endswith(".toml"))


def load_preset(name_or_path: str) -> Preset:
    """A shipped preset by name, or a TOML file by path."""
    path = Path(name_or_path)
    if path.suffix == ".toml" and path.is_file():
        text, name = path.read_text(), path.stem
    else:
        res = resources.files(__package__) / f"{name_or_path}.toml"
        if not res.is_file():
            raise PresetError(f"unknown preset {name_or_path!r}; available: {', '.join(available_presets())}")
        text, name = res.read_text(), name_or_path
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PresetError(f"preset {name!r}: invalid TOML: {exc}") from exc
    return preset_from_dict(name, data)
