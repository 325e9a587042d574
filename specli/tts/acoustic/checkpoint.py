"""Strict reading of CosyVoice's acoustic checkpoints (``hift.pt``, ``flow.pt``).

The files are plain ``torch.save`` state dicts. They are read with ``torch.load(weights_only=True)``, so
no arbitrary object is unpickled; weight norm is folded into plain weights (both key styles: the old
``X.weight_g`` / ``X.weight_v`` and the parametrized ``X.parametrizations.weight.original0`` /
``original1``); then every key must match the module exactly (nothing missing, nothing left over, every
shape equal). Each failure is a :class:`~specli.errors.ModelLoadError` naming the file and the key.
"""

from __future__ import annotations

import os
import pickle
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from specli.errors import ModelLoadError

__all__ = ["fold_weight_norm", "load_strict", "read_state_dict", "safe_torch_load", "strip_prefix"]

PathLike = str | os.PathLike[str]
_OLD_G, _OLD_V = ".weight_g", ".weight_v"
_NEW_G, _NEW_V = ".parametrizations.weight.original0", ".parametrizations.weight.original1"
_LOAD_ERRORS = (RuntimeError, pickle.UnpicklingError, EOFError, OSError, ValueError, TypeError,
                AttributeError, ImportError, IndexError, KeyError, UnicodeDecodeError, zipfile.BadZipFile)


def _error(path: PathLike, reason: str) -> ModelLoadError:
    return ModelLoadError(f"{os.fspath(path)}: {reason}")


def safe_torch_load(path: PathLike, what: str = "checkpoint") -> object:
    """``torch.load(weights_only=True)`` on the CPU; a missing/truncated/corrupt file or one holding
    objects other than tensors and plain containers is a ModelLoadError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise _error(path, f"{what} not found" if not p.exists() else "not a regular file")
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the refusal below says enough
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(p, map_location="cpu", weights_only=True)
    except _LOAD_ERRORS as exc:
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise _error(path, f"unreadable {what} (truncated, corrupt, or holding more than tensors and plain "
                           f"containers): {detail}") from exc


def read_state_dict(path: PathLike) -> dict[str, torch.Tensor]:
    """Read a ``torch.save``'d mapping of names to tensors without unpickling arbitrary objects."""
    obj = safe_torch_load(path)
    if not isinstance(obj, Mapping):
        raise _error(path, f"expected a state dict (a mapping of names to tensors), got {type(obj).__name__}")
    for key, value in obj.items():
        if not isinstance(key, str):
            raise _error(path, f"non-string key {key!r} in the state dict")
        if not isinstance(value, torch.Tensor):
            raise _error(path, f"key {key!r} holds a {type(value).__name__}, not a tensor")
    return dict(obj)


def strip_prefix(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """Drop ``prefix`` from the keys that start with it (``hift.pt`` may carry ``generator.``)."""
    return {key.removeprefix(prefix): value for key, value in state.items()}


def _norm_except_dim0(v: torch.Tensor) -> torch.Tensor:
    """L2 norm over every dimension but the first, shaped to broadcast against ``v``."""
    return v.flatten(1).norm(dim=1).reshape(-1, *([1] * (v.dim() - 1)))


def _pair_of(key: str) -> tuple[str, tuple[str, str], str] | None:
    """``(layer, (g_suffix, v_suffix), "g" | "v")`` for a weight-norm key, else None."""
    for suffixes in ((_OLD_G, _OLD_V), (_NEW_G, _NEW_V)):
        for part, suffix in zip("gv", suffixes):
            if key.endswith(suffix):
                return key[: -len(suffix)], suffixes, part
    return None


def fold_weight_norm(state: Mapping[str, torch.Tensor], path: PathLike) -> dict[str, torch.Tensor]:
    """Replace every weight-norm pair (either key style) by ``X.weight = g * v / ||v||`` (norm over dims > 0)."""
    out: dict[str, torch.Tensor] = {}
    pairs: dict[tuple[str, tuple[str, str]], dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        found = _pair_of(key)
        if found is None:
            out[key] = value
        else:
            layer, suffixes, part = found
            pairs.setdefault((layer, suffixes), {})[part] = value
    for (layer, suffixes), parts in pairs.items():
        for part, suffix in zip("gv", suffixes):
            if part not in parts:
                raise _error(path, f"missing key {layer + suffix!r} (weight-norm pair incomplete)")
        g, v = parts["g"].float(), parts["v"].float()
        if v.dim() < 2 or g.numel() != v.shape[0]:
            raise _error(path, f"key {layer + suffixes[0]!r} has shape {tuple(g.shape)}, "
                               f"not one magnitude per output row of {tuple(v.shape)}")
        if layer + ".weight" in out:
            raise _error(path, f"key {layer + '.weight'!r} is given twice (plain and weight-normed)")
        out[layer + ".weight"] = v * (g.reshape(-1, *([1] * (v.dim() - 1))) / _norm_except_dim0(v))
    return out


def load_strict(module: nn.Module, state: Mapping[str, torch.Tensor], path: PathLike) -> None:
    """Copy ``state`` into ``module``: every parameter/buffer present with its shape, no extra key."""
    expected = module.state_dict()
    missing = [key for key in expected if key not in state]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise _error(path, f"missing key {missing[0]!r}{more}")
    unexpected = [key for key in state if key not in expected]
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise _error(path, f"unexpected key {unexpected[0]!r}{more} (not in this model's configuration)")
    for key, target in expected.items():
        value = state[key]
        if tuple(value.shape) != tuple(target.shape):
            raise _error(path, f"key {key!r} has shape {tuple(value.shape)}, the configuration expects "
                               f"{tuple(target.shape)}")
        if not value.is_floating_point():
            raise _error(path, f"key {key!r} has dtype {value.dtype}, expected floating point")
    module.load_state_dict({key: value.to(expected[key].dtype) for key, value in state.items()}, strict=True)
