"""The Qwen2-Audio target: transformers' audio tower + projector, and the lean Qwen2 decoder over its LM.

A window is encoded once (:meth:`Qwen2AudioTarget.encode`: log-mel ``[B, n_mels, 3000]`` -> projected audio
embeddings ``[B, A, hidden]``, ``A`` = 750 for 30 s, the padded frames masked as transformers masks them).
The decode prompt holds the chat template's tokens with ``<|AUDIO|>`` expanded to the window's ``N`` audio
positions; the shared :class:`~specli.models.audio_lm.AudioLMTarget` splices the audio rows in at prefill.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.masking_utils import create_bidirectional_mask

from specli.models.audio_lm import AudioLMState, AudioLMTarget, DraftRecipe
from specli.models.qwen2 import Qwen2Target

N_FRAMES = 3000  # mel frames the tower takes (2 x max_source_positions)


def audio_positions(frames: int) -> int:
    """Audio embeddings of a window with ``frames`` real mel frames (transformers'
    ``_get_feat_extract_output_lengths``: conv stride 2, then average pooling by 2)."""
    conv = (frames - 1) // 2 + 1
    return (conv - 2) // 2 + 1


Qwen2AudioState = AudioLMState  # the cache and the window's audio embeddings


class Qwen2AudioTarget(AudioLMTarget):
    """Qwen2-Audio's Whisper-like tower + projector (transformers modules) and the lean Qwen2 decoder (``lm``)."""

    # SpecForge qwen2-audio-7b: EAGLE-3 unroll 5; DFlash 5 layers, block 4
    draft_recipe = DraftRecipe(32, (1, 8, 15, 22, 28), 4, 5)

    def __init__(self, tower: torch.nn.Module, projector: torch.nn.Module, lm: Qwen2Target, audio_token: int) -> None:
        super().__init__(tower, projector, lm, audio_token, audio_positions(N_FRAMES))

    @torch.inference_mode()
    def encode(self, mel: torch.Tensor, frames: Sequence[int] | None = None) -> torch.Tensor:
        """``mel [B, n_mels, 3000]`` with ``frames[b]`` real frames (default: all) -> ``[B, A, hidden]``."""
        b = mel.shape[0]
        frames = [mel.shape[2]] * b if frames is None else list(frames)
        conv = torch.tensor([(f - 1) // 2 + 1 for f in frames], device=self.device)
        seq = (mel.shape[2] - 2) // 2 + 1  # tower positions before pooling
        keep = torch.arange(seq, device=self.device)[None, :] < conv[:, None]  # [B, seq]
        dtype = next(self.tower.parameters()).dtype
        mask = create_bidirectional_mask(config=self.tower.config, attention_mask=keep.long(),
                                         inputs_embeds=torch.zeros(b, seq, 1, dtype=dtype, device=self.device))
        hidden = self.tower(mel.to(self.device, dtype), attention_mask=mask).last_hidden_state
        return self.projector(hidden).to(self.dtype)
