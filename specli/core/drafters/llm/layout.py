"""Token-id layouts: where a target's native output ids live in another vocabulary a drafter was trained on.

A target may be exported in several layouts (CosyVoice's native ``llm.pt``, the official vLLM export, SpeechSpec's
merged vocabulary), and a drafter's token ids refer to the one it was trained against. The target supplies the
layout a drafter file names (``target.token_layout(record)``); the drafter loader only maps ids through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VocabLayout:
    """Where native output ids (``0 .. speech_rows-1``) live in another layout's vocabulary."""

    name: str  # "vllm" or "merged"
    offset: int  # layout id of native id 0
    native_rows: int  # native ids mapped (speech rows)
    size: int  # the layout's vocabulary size (padded)
    sos: int | None = None  # CosyVoice2 merged layout: the <|sos|> id (llm_embedding row 0)
    task: int | None = None  # CosyVoice2 merged layout: the <|task_id|> id (llm_embedding row 1)

    def from_native(self, ids: Sequence[int]) -> list[int]:
        """Native speech ids -> layout ids."""
        bad = [i for i in ids if not 0 <= i < self.native_rows]
        if bad:
            raise ValueError(f"{self.name}: native ids {bad[:5]} outside 0..{self.native_rows - 1}")
        return [self.offset + i for i in ids]

    def to_native(self, ids: Sequence[int]) -> list[int]:
        """Layout ids -> native speech ids; text rows, padding and sos/task are errors."""
        bad = [i for i in ids if not self.offset <= i < self.offset + self.native_rows]
        if bad:
            raise ValueError(f"{self.name}: ids {bad[:5]} are not speech ids of this layout")
        return [i - self.offset for i in ids]

    def native_index(self) -> torch.Tensor:
        """Layout columns of the native ids, in order: ``layout_probs[:, native_index()]``. [rows]"""
        return torch.arange(self.offset, self.offset + self.native_rows, device="cpu")
