"""The Qwen3-ASR target: transformers' AuT encoder (chunked convolutions, windowed attention) + projector, and
the lean decoder over its Qwen3 language model (:class:`~specli.models.audio_lm.AudioLMTarget`).

The encoder's output (the real positions of every window, packed) is unpacked into ``[B, A, hidden]`` rows
(``A`` = 390 for 30 s; :mod:`specli.models.aut`). A window padded past its real frames encodes exactly as the
processor's own (shorter) features do: padded chunks are dropped and attention windows never cross into them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specli.models.audio_lm import AudioLMState, AudioLMTarget
from specli.models.aut import N_FRAMES, audio_positions, unpack
from specli.models.qwen2 import Qwen2Target

Qwen3ASRState = AudioLMState  # the cache and the window's audio embeddings


class Qwen3ASRTarget(AudioLMTarget):
    """Qwen3-ASR's encoder + projector (transformers modules) and the lean Qwen3 decoder (``lm``)."""

    def __init__(self, tower: torch.nn.Module, projector: torch.nn.Module, lm: Qwen2Target, audio_token: int
                 ) -> None:
        self.n_window = int(tower.config.n_window)
        super().__init__(tower, projector, lm, audio_token, audio_positions(N_FRAMES, self.n_window))

    @torch.inference_mode()
    def encode(self, mel: torch.Tensor, frames: Sequence[int] | None = None) -> torch.Tensor:
        """``mel [B, n_mels, T]`` (T a multiple of ``2 * n_window``, 3000 for 30 s) with ``frames[b]`` real
        frames (default: all) -> ``[B, A, hidden]``."""
        b, _, t = mel.shape
        frames = [t] * b if frames is None else list(frames)
        mask = (torch.arange(t, device=self.device)[None, :] < torch.tensor(frames, device=self.device)[:, None])
        dtype = next(self.tower.parameters()).dtype
        packed = self.tower(input_features=mel.to(self.device, dtype), input_features_mask=mask.long())
        return unpack(self.projector(packed.last_hidden_state).to(self.dtype), frames, self.n_window, t)
