"""The Qwen3-ASR target: transformers' AuT encoder (chunked convolutions, windowed attention) + projector, and
the lean decoder over its Qwen3 language model (:class:`~specli.models.audio_lm.AudioLMTarget`).

The encoder cuts a window's log-mel into chunks of ``2 * n_window`` frames (100: one second), three stride-2
convolutions turn a full chunk into 13 positions, and only the positions of real frames are kept (packed over
the batch). :meth:`Qwen3ASRTarget.encode` unpacks them into ``[B, A, hidden]`` rows (``A`` = 390 for 30 s),
each window's first ``audio_positions(frames)`` rows real, as the processor counts its ``<|audio_pad|>`` tokens.
A window padded past its real frames encodes exactly as the processor's own (shorter) features do: padded
chunks are dropped and attention windows never cross into them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specli.models.audio_lm import AudioLMState, AudioLMTarget
from specli.models.qwen2 import Qwen2Target

N_FRAMES = 3000  # mel frames of a 30-s window


def _conv_length(frames: int) -> int:
    """Positions after the three (kernel 3, stride 2, padding 1) convolutions; zero stays zero."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1 if frames > 0 else 0
    return frames


def audio_positions(frames: int, n_window: int = 50) -> int:
    """Audio embeddings of ``frames`` real mel frames (the processor's ``_get_audio_token_length``: full
    chunks of ``2 * n_window`` frames, 13 positions each at the default, then the last partial chunk)."""
    chunk = 2 * n_window
    return (frames // chunk) * _conv_length(chunk) + _conv_length(frames % chunk)


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
        packed = self.projector(packed.last_hidden_state).to(self.dtype)  # [sum of real positions, hidden]
        counts = [audio_positions(f, self.n_window) for f in frames]
        out = torch.zeros(b, audio_positions(t, self.n_window), packed.shape[-1], dtype=self.dtype,
                          device=self.device)
        for row, part in enumerate(packed.split(counts)):
            out[row, : part.shape[0]] = part
        return out
