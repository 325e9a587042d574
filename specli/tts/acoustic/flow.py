"""Loading CosyVoice's ``flow.pt`` strictly, with its configuration from the model yaml.

The yaml's ``flow:`` entry names the class: ``CausalMaskedDiffWithDiT`` (CosyVoice3,
:mod:`specli.tts.acoustic.flow_cv3`) or ``CausalMaskedDiffWithXvec`` (CosyVoice2, :mod:`specli.tts.acoustic.flow_cv2`).
Sizes come from the yaml, published values where a key is absent. Weights are read with
``torch.load(weights_only=True)`` and every key and shape must match
(:func:`specli.tts.acoustic.checkpoint.load_strict`), else a ModelLoadError names the file and the key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from specli.tts.acoustic.checkpoint import load_strict, read_state_dict
from specli.tts.acoustic.flow_cv2 import FlowCV2, FlowCV2Config
from specli.tts.acoustic.flow_cv3 import FlowCV3, FlowCV3Config
from specli.models.cosyvoice.layout import ModelKind
from specli.errors import ModelLoadError

__all__ = ["FLOW_CLASSES", "flow_config", "load_flow"]

FLOW_CLASSES: dict[str, ModelKind] = {"CausalMaskedDiffWithDiT": "cosyvoice3", "CausalMaskedDiffWithXvec": "cosyvoice2"}
FlowConfig = FlowCV2Config | FlowCV3Config
FlowModel = FlowCV2 | FlowCV3


def flow_config(node: Any, kind: ModelKind, where: str | os.PathLike[str] = "<yaml>") -> FlowConfig:
    """The flow configuration of a yaml ``flow`` node (``None``: the published one for ``kind``)."""
    if node is not None:
        target = str(getattr(node, "target", "")).rsplit(".", 1)[-1]
        if target not in FLOW_CLASSES:
            raise ModelLoadError(f"{os.fspath(where)}: flow class {target or '?'!r} is not supported "
                                 f"(known: {', '.join(FLOW_CLASSES)})")
        kind = FLOW_CLASSES[target]
    try:
        if kind == "cosyvoice3":
            return FlowCV3Config() if node is None else FlowCV3Config.from_yaml(node)
        return FlowCV2Config() if node is None else FlowCV2Config.from_yaml(node)
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{os.fspath(where)}: unusable flow settings: {exc}") from exc


def load_flow(path: str | os.PathLike[str], config: FlowConfig, device: torch.device | str = "cpu") -> FlowModel:
    """Read ``flow.pt`` strictly into an eval-mode flow model (CV2 or CV3 by ``config``) on ``device``."""
    state = read_state_dict(path)
    model: FlowModel = FlowCV3(config) if isinstance(config, FlowCV3Config) else FlowCV2(config)
    load_strict(model, state, path)
    return model.eval().requires_grad_(False).to(device)


def flow_path(model_dir: str | os.PathLike[str]) -> Path:
    """``<dir>/flow.pt``, or a ModelLoadError saying it is missing."""
    path = Path(model_dir) / "flow.pt"
    if not path.is_file():
        raise ModelLoadError(f"{path}: flow checkpoint not found (audio output needs flow.pt and hift.pt)")
    return path
