"""Load a Whisper model (target + tokenizer) from any source ``resolve_model`` accepts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specli.engines.targets.resolve import resolve_model
from specli.engines.targets.tokenizer import WhisperSpecialTokens, WhisperTokenizer
from specli.engines.targets.whisper import WhisperTarget

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


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


def load_whisper(name_or_path: str, dtype: str = "float32", compile_encoder: bool = False) -> WhisperModel:
    """Resolve, verify and load a Whisper model; ``dtype`` is ``float32`` or ``bfloat16``;
    ``compile_encoder`` compiles the encoder with ``torch.compile`` now (see ``target.compiled_encoder``)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, not {dtype!r}")
    path = resolve_model(name_or_path)
    target = WhisperTarget.from_dir(path, DTYPES[dtype])
    if compile_encoder:
        target.compile_encoder()
    return WhisperModel(name_or_path, path, target, WhisperTokenizer(path))
