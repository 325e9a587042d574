"""The Qwen3-Omni thinker target: transformers' AuT audio encoder (its own output projection to the text width)
and the lean MoE decoder over the thinker's text model (:class:`~specli.models.audio_lm.AudioLMTarget`).

Positions. The thinker's RoPE is 3-D (M-RoPE: temporal / height / width sections of each head's frequencies).
Where a token's three position ids are equal, M-RoPE *is* 1-D RoPE at that position (every frequency sees the
same id). transformers' ``get_rope_index`` gives text tokens equal ids (continuing after a multimodal block at
its maximum + 1) and audio tokens equal, consecutive ids, so after any prompt a row's text continues at
``position + rope_delta`` on all three axes, ``rope_delta`` per row (``max position + 1 - prompt length``).
:meth:`Qwen3OmniTarget.prompt_rope_delta` takes it from ``get_rope_index`` over the row's prompt and checks
that the prompt's own ids are 1-D too (an audio-and-text prompt: delta 0), so the lean prefill is exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specli.models.audio_lm import AudioLMState, AudioLMTarget, DraftRecipe
from specli.models.aut import N_FRAMES, audio_positions, unpack
from specli.models.qwen2 import Qwen2Target

Qwen3OmniState = AudioLMState  # the cache, the window's audio embeddings, each row's RoPE offset


class Qwen3OmniTarget(AudioLMTarget):
    """The thinker's audio encoder (a transformers module; ``rope_index`` its ``get_rope_index``) and the lean
    MoE decoder (``lm``)."""

    # SpecForge qwen3-omni-30b: EAGLE-3 unroll 7; DFlash 5 layers, block 8
    draft_recipe = DraftRecipe(48, (1, 12, 23, 34, 45), 8, 7)

    def __init__(self, thinker_model: torch.nn.Module, lm: Qwen2Target, audio_token: int) -> None:
        tower = thinker_model.audio_tower
        self.n_window = int(tower.config.n_window)
        self.rope_index = thinker_model.get_rope_index
        cfg = thinker_model.config
        self.vision_tokens = (int(cfg.image_token_id), int(cfg.video_token_id))
        super().__init__(tower, torch.nn.Identity(), lm, audio_token, audio_positions(N_FRAMES, self.n_window))

    @torch.inference_mode()
    def encode(self, mel: torch.Tensor, frames: Sequence[int] | None = None) -> torch.Tensor:
        """``mel [B, n_mels, T]`` with ``frames[b]`` real frames (default: all) -> ``[B, A, hidden]``: the real
        frames of every row, gathered as the thinker's ``get_audio_features`` gathers them, through the tower."""
        b, _, t = mel.shape
        frames = [t] * b if frames is None else list(frames)
        mask = torch.arange(t, device=self.device)[None, :] < torch.tensor(frames, device=self.device)[:, None]
        dtype = next(self.tower.parameters()).dtype
        flat = mel.to(self.device, dtype).permute(0, 2, 1)[mask].permute(1, 0)  # [n_mels, sum of real frames]
        packed = self.tower(flat, feature_lens=mask.sum(1), return_dict=True).last_hidden_state
        return unpack(packed.to(self.dtype), frames, self.n_window, t)

    def prompt_rope_delta(self, prompt: torch.Tensor) -> int:
        """The row's M-RoPE offset from transformers' ``get_rope_index`` over ``prompt [n]`` (a window's prompt:
        audio and text); ValueError when the prompt holds vision tokens or its own 3-D ids are not 1-D (then a
        lean prefill is not exact)."""
        if any(bool((prompt == t).any()) for t in self.vision_tokens):
            raise ValueError("a prompt with image or video tokens has 3-D M-RoPE positions: no exact lean prefill")
        ids = prompt[None].to(self.device)
        positions, delta = self.rope_index(ids, attention_mask=torch.ones_like(ids))  # [3, 1, n], [1, 1]
        delta = int(delta.reshape(-1)[0])
        flat = torch.arange(ids.shape[1], device=positions.device) + delta
        if not bool((positions[:, 0] == flat).all()):
            raise ValueError("the prompt's M-RoPE positions are not 1-D (vision tokens?): a lean prefill is not exact")
        return delta
