"""Load a Whisper model (target + tokenizer) from any source ``resolve_model`` accepts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specli.core.device import DTYPES, resolve_device, resolve_dtype
from specli.models.whisper.hooks import WhisperHooks
from specli.models.whisper.resolve import resolve_model
from specli.models.whisper.tokenizer import WhisperSpecialTokens, WhisperTokenizer
from specli.models.whisper.target import WhisperTarget

__all__ = ["DTYPES", "WhisperModel", "load_whisper"]


@dataclass(frozen=True)
class WhisperModel:
    """A loaded Whisper model: lean target, tokenizer and the directory it came from."""

    name: str  # what the user asked for (bundled name, id or path)
    path: Path  # resolved Hugging Face layout directory
    target: WhisperTarget
    tokenizer: WhisperTokenizer

    @property
    def special(self) -> WhisperSpecialTokens:
        return self.tokenizer.special

    def speech_hooks(self) -> WhisperHooks:
        """Whisper's part of the window loop (:class:`specli.models.speech.SpeechHooks`)."""
        return WhisperHooks(self.target, self.tokenizer)


def load_whisper(name_or_path: str, dtype: str = "float32", compile_encoder: bool = False,
                 device: str | torch.device = "cpu") -> WhisperModel:
    """Resolve, verify and load a Whisper model onto ``device`` (``auto``, ``cpu``, ``cuda[:N]``);
    ``dtype`` is ``float32``, ``bfloat16``, ``float16``, ``int8`` (weight-only int8 decoder, CPU) or ``auto``
    (:func:`specli.core.device.auto_dtype`);
    ``compile_encoder`` compiles the encoder with ``torch.compile`` now (see ``target.compiled_encoder``)."""
    if dtype != "auto" and dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {['auto', *DTYPES]}, not {dtype!r}")
    dev = resolve_device(device)
    path = resolve_model(name_or_path)
    target = WhisperTarget.from_dir(path, resolve_dtype(dtype, dev), dev)
    if compile_encoder:
        target.compile_encoder()
    return WhisperModel(name_or_path, path, target, WhisperTokenizer(path))
