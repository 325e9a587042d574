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
    # the target's own input ids of sos / task / text token 0 (None: it has no such inputs; input ids map as they are)
    native_sos: int | None = None
    native_task: int | None = None
    native_text_base: int | None = None

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

    def native_input_id(self, layout_id: int) -> int | None:
        """A layout *input* id (a mask token) -> the target's native input id (None: it has none)."""
        if self.offset <= layout_id < self.offset + self.native_rows:
            return layout_id - self.offset
        if self.native_text_base is None:
            return None
        if layout_id == self.sos:
            return self.native_sos
        if layout_id == self.task:
            return self.native_task
        if self.name == "merged" and layout_id < self.offset:
            return self.native_text_base + layout_id  # a text token
        return None

    def input_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The target's native input ids ``[...]`` -> this layout's input ids ``[...]`` (the rows of a table
        trained on it)."""
        ids = ids.long()
        if self.native_text_base is None:
            return ids
        mapped = torch.where(ids < self.native_rows, ids + self.offset, ids)
        if self.name == "merged":
            mapped = torch.where(ids >= self.native_text_base, ids - self.native_text_base, mapped)
        for native, theirs in ((self.native_sos, self.sos), (self.native_task, self.task)):
            if theirs is not None and native is not None and native >= self.native_rows:
                mapped = torch.where(ids == native, torch.full_like(ids, theirs), mapped)
        return mapped

    def native_index(self) -> torch.Tensor:
        """Layout columns of the native ids, in order: ``layout_probs[:, native_index()]``. [rows]"""
        return torch.arange(self.offset, self.offset + self.native_rows, device="cpu")
