"""The Qwen2-Audio target: transformers' audio tower + projector, and the lean Qwen2 decoder over its LM.

A window is encoded once (:meth:`Qwen2AudioTarget.encode`: log-mel ``[B, n_mels, 3000]`` -> projected audio
embeddings ``[B, A, hidden]``, ``A`` = 750 for 30 s, the padded frames masked as transformers masks them).
The decode prompt holds the chat template's tokens with ``<|AUDIO|>`` expanded to the window's ``N`` audio
positions. A forward that starts at position 0 (a prompt's prefill) takes the window's audio embeddings in
place of its ``<|AUDIO|>`` tokens, in order (the k-th such token gets audio row k), exactly where transformers'
``masked_scatter`` puts them; every later forward embeds tokens plainly, as transformers' decode steps do.
So the state (cache + the window's audio rows) meets the whole target contract: chains and trees, crop /
compact, batch rows (the audio rows are a row's context), beam rows, aux hidden states.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.masking_utils import create_bidirectional_mask

from specli.core.kv_cache import KVCache, RaggedKVCache
from specli.core.types import ScoreOutput
from specli.models.qwen2 import Qwen2Target

N_FRAMES = 3000  # mel frames the tower takes (2 x max_source_positions)
PROMPT_ROOM = 512  # cache positions a window's prompt and text have besides its audio rows


def audio_positions(frames: int) -> int:
    """Audio embeddings of a window with ``frames`` real mel frames (transformers'
    ``_get_feat_extract_output_lengths``: conv stride 2, then average pooling by 2)."""
    conv = (frames - 1) // 2 + 1
    return (conv - 2) // 2 + 1


@dataclass(frozen=True)
class Qwen2AudioState:
    """A window's decoder state: the self-attention cache and the window's audio embeddings."""

    cache: KVCache | RaggedKVCache  # a batch state (start_batch) holds one row per slot
    audio: torch.Tensor  # [B, A, hidden] projected audio embeddings (rows past a window's N are unused)

    @property
    def length(self) -> int:
        return self.cache.length


class Qwen2AudioTarget:
    """Audio tower + projector (transformers modules) and the lean Qwen2 decoder (``lm``)."""

    def __init__(self, tower: torch.nn.Module, projector: torch.nn.Module, lm: Qwen2Target, audio_token: int) -> None:
        self.tower, self.projector, self.lm = tower.eval(), projector.eval(), lm
        self.audio_token = audio_token
        self.dims, self.dtype, self.device = lm.dims, lm.dtype, lm.device
        self.audio_ctx = audio_positions(N_FRAMES)
        self.max_len = self.audio_ctx + PROMPT_ROOM
        self.compiled_encoder = None  # the tower runs eagerly

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

    def start(self, audio: torch.Tensor, max_len: int | None = None, features: torch.Tensor | None = None
              ) -> Qwen2AudioState:
        """A new window state: an empty cache and the window's audio embeddings ``[1, A, hidden]``."""
        d = self.dims
        audio = audio.to(self.device, self.dtype)
        cache = KVCache(d.layers, audio.shape[0], d.kv_heads, max_len or self.max_len, d.head_dim, self.dtype,
                        self.device)
        return Qwen2AudioState(cache, audio)

    def widen(self, state: Qwen2AudioState, rows: int) -> Qwen2AudioState:
        """Beam search's ``rows``-row state of a one-row state (the audio rows broadcast)."""
        return Qwen2AudioState(state.cache.widened(rows), state.audio.expand(rows, -1, -1))

    # ---- the batch contract (core/batched.py): slots of one preallocated state, rows [0, B) score
    def start_batch(self, capacity: int, max_len: int | None = None, spare: int = 0) -> Qwen2AudioState:
        """An empty state of ``capacity`` slots (``max_len`` positions a row, + ``spare`` padding slots)."""
        d = self.dims
        cache = RaggedKVCache(d.layers, capacity, d.kv_heads, max_len or self.max_len, d.head_dim, spare,
                              self.dtype, self.device)
        audio = torch.zeros(capacity, self.audio_ctx, d.hidden, dtype=self.dtype, device=self.device)
        return Qwen2AudioState(cache, audio)

    def admit(self, state: Qwen2AudioState, slot: int, context: torch.Tensor) -> None:
        """Slot ``slot`` starts a new window: its audio embeddings ``[1, A, hidden]``; empty cache."""
        audio = context.to(self.device, self.dtype)
        if audio.shape[1:] != state.audio.shape[1:]:
            raise ValueError(f"audio embeddings {tuple(audio.shape)} do not fit {tuple(state.audio.shape)}")
        state.audio[slot] = audio[0]
        state.cache.set_length(slot, 0)

    def row_state(self, state: Qwen2AudioState, slot: int, context: object = None) -> Qwen2AudioState:
        """Slot ``slot`` as a batch-1 state over the same memory."""
        return Qwen2AudioState(state.cache.row(slot), state.audio[slot : slot + 1])

    def move(self, state: Qwen2AudioState, src: int, dst: int) -> None:
        """Copy slot ``src`` into slot ``dst``."""
        state.audio[dst] = state.audio[src]
        state.cache.move(src, dst)

    @torch.inference_mode()
    def score(self, state: Qwen2AudioState, tokens: torch.Tensor, positions: torch.Tensor | None = None,
              tree_mask: torch.Tensor | None = None) -> ScoreOutput:
        """One decoder forward over a chain or tree (the :class:`~specli.models.qwen2.Qwen2Target` contract);
        rows starting at position 0 take the audio embeddings at their ``<|AUDIO|>`` tokens."""
        tokens = tokens.to(self.device)
        b, n = tokens.shape
        if positions is None:
            positions = state.cache.positions(b, n, self.device)
        positions = positions.to(self.device)
        embeds = self.lm.embed(tokens)
        audio = (tokens == self.audio_token) & (positions[:, :1] == 0)  # [B, n]: a prompt's placeholders
        if bool(audio.any()):
            index = audio.long().cumsum(1) - 1  # k-th placeholder of its row -> audio row k
            if int(index.max()) >= state.audio.shape[1]:
                raise ValueError(f"more <|AUDIO|> tokens than the window's {state.audio.shape[1]} audio rows")
            rows = torch.arange(b, device=self.device)[:, None].expand(b, n)
            embeds = embeds.clone()
            embeds[audio] = state.audio[rows[audio], index[audio]].to(embeds.dtype)
        return self.lm.score(state, None, positions, tree_mask, embeds=embeds)
