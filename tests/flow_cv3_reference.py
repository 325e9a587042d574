"""A readable transcription of upstream's CosyVoice3 flow (``CausalMaskedDiffWithDiT``), for numerical tests.

Upstream = FunAudioLLM/CosyVoice@ace7c47: ``cosyvoice/flow/DiT/{dit,modules}.py`` (the DiT estimator),
``cosyvoice/transformer/upsample_encoder.py`` (``PreLookaheadLayer``), ``cosyvoice/flow/flow_matching.py``
(``CausalConditionalCFM.solve_euler``), ``cosyvoice/flow/flow.py`` (``CausalMaskedDiffWithDiT.inference``) and
``cosyvoice/utils/mask.py`` (``add_optional_chunk_mask``). Written independently of ``specli.tts.acoustic``: the
rotary embedding is **x-transformers' own module** at the version upstream pins (2.11.24), everything else
follows upstream's operations in upstream's order, with module names that take ``flow.pt`` keys strictly.
Inference only (dropout layers are identities in eval mode and are left out, keeping upstream's indices).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from x_transformers.x_transformers import RotaryEmbedding, apply_rotary_pos_emb


def chunk_mask(valid: torch.Tensor, chunk: int) -> torch.Tensor:
    """``add_optional_chunk_mask(x, valid, False, False, 0, chunk, -1)``: ``valid [B, 1, T]`` -> ``[B, T, T]``
    (``chunk == 0``: ``valid`` itself, which upstream's DiT then repeats over the T query rows)."""
    if chunk <= 0:
        masks = valid
    else:
        size = valid.shape[-1]
        pos = torch.arange(size)
        block_end = (torch.div(pos, chunk, rounding_mode="trunc") + 1) * chunk  # subsequent_chunk_mask
        masks = valid & (pos.unsqueeze(0) < block_end.unsqueeze(1)).unsqueeze(0)
    empty = masks.sum(dim=-1) == 0
    masks = masks.clone()
    masks[empty] = True  # upstream forces rows with no visible key to all-visible
    return masks


class SinusPosition(nn.Module):
    """``SinusPositionEmbedding``: ``[sin | cos](scale * t * exp(-k log(10000) / (half - 1)))``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor, scale: float = 1000) -> torch.Tensor:  # [B] -> [B, dim]
        half = self.dim // 2
        step = math.log(10000) / (half - 1)
        freqs = torch.exp(torch.arange(half).float() * -step)
        arg = scale * t.unsqueeze(1) * freqs.unsqueeze(0)
        return torch.cat((arg.sin(), arg.cos()), dim=-1)


class TimestepEmbedding(nn.Module):
    def __init__(self, dim: int, freq_dim: int = 256) -> None:
        super().__init__()
        self.time_embed = SinusPosition(freq_dim)
        self.time_mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.time_mlp(self.time_embed(t).to(t.dtype))


class CausalConvPositionEmbedding(nn.Module):
    def __init__(self, dim: int, kernel: int = 31, groups: int = 16) -> None:
        super().__init__()
        self.kernel = kernel
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, kernel, groups=groups), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, kernel, groups=groups), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, N, D], no mask (as InputEmbedding calls it)
        x = x.permute(0, 2, 1)
        x = self.conv1(F.pad(x, (self.kernel - 1, 0, 0, 0)))
        x = self.conv2(F.pad(x, (self.kernel - 1, 0, 0, 0)))
        return x.permute(0, 2, 1)


class InputEmbedding(nn.Module):
    def __init__(self, mel_dim: int, mu_dim: int, out_dim: int, spk_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(mel_dim * 2 + mu_dim + spk_dim, out_dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(out_dim)

    def forward(self, x, cond, mu, spks):  # [B, N, *] x3, spks [B, S]
        spks = spks.unsqueeze(1).expand(-1, x.shape[1], -1)  # einops repeat 'b c -> b t c'
        x = self.proj(torch.cat([x, cond, mu, spks], dim=-1))
        return self.conv_pos_embed(x) + x


class Attention(nn.Module):
    """``Attention`` + ``AttnProcessor``: rotary (x-transformers) on the un-split q and k, SDPA, zeroed pad rows."""

    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.to_q, self.to_k, self.to_v = nn.Linear(dim, inner), nn.Linear(dim, inner), nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Identity()])  # [1] is a Dropout upstream

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rope) -> torch.Tensor:  # mask [B, 1, N, N]
        b = x.shape[0]
        query, key, value = self.to_q(x), self.to_k(x), self.to_v(x)
        freqs, xpos_scale = rope
        q_scale, k_scale = (xpos_scale, xpos_scale ** -1.0) if xpos_scale is not None else (1.0, 1.0)
        query = apply_rotary_pos_emb(query, freqs, q_scale)
        key = apply_rotary_pos_emb(key, freqs, k_scale)
        head_dim = key.shape[-1] // self.heads
        query, key, value = (y.view(b, -1, self.heads, head_dim).transpose(1, 2) for y in (query, key, value))
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).reshape(b, -1, self.heads * head_dim).to(query.dtype)
        out = self.to_out[1](self.to_out[0](out))
        return out.masked_fill(~mask[:, 0, -1].unsqueeze(-1), 0.0)


class AdaLayerNormZero(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(dim, dim * 6)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def forward(self, x, emb):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = torch.chunk(self.linear(self.silu(emb)), 6, 1)
        x = self.norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None]
        return x, gate_msa, shift_mlp, scale_mlp, gate_mlp


class AdaLayerNormZeroFinal(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(dim, dim * 2)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def forward(self, x, emb):
        scale, shift = torch.chunk(self.linear(self.silu(emb)), 2, dim=1)
        return self.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int) -> None:
        super().__init__()
        inner = int(dim * mult)
        self.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")), nn.Identity(),
                                nn.Linear(inner, dim))

    def forward(self, x):
        return self.ff(x)


class DiTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: int) -> None:
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim)
        self.attn = Attention(dim, heads, dim_head)
        self.ff_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff = FeedForward(dim, ff_mult)

    def forward(self, x, t, mask, rope):
        norm, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.attn_norm(x, emb=t)
        x = x + gate_msa.unsqueeze(1) * self.attn(norm, mask=mask, rope=rope)
        ff_norm = self.ff_norm(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        return x + gate_mlp.unsqueeze(1) * self.ff(ff_norm)


class DiT(nn.Module):
    """``cosyvoice.flow.DiT.dit.DiT`` (mel_dim = mu_dim = spk_dim = 80 as published)."""

    def __init__(self, dim: int, depth: int, heads: int, dim_head: int, ff_mult: int, static_chunk_size: int,
                 mel_dim: int = 80, long_skip_connection: bool = False) -> None:
        super().__init__()
        self.time_embed = TimestepEmbedding(dim)
        self.input_embed = InputEmbedding(mel_dim, mel_dim, dim, mel_dim)
        self.rotary_embed = RotaryEmbedding(dim_head)  # x-transformers
        self.transformer_blocks = nn.ModuleList(DiTBlock(dim, heads, dim_head, ff_mult) for _ in range(depth))
        self.long_skip_connection = nn.Linear(dim * 2, dim, bias=False) if long_skip_connection else None
        self.norm_out = AdaLayerNormZeroFinal(dim)
        self.proj_out = nn.Linear(dim, mel_dim)
        self.static_chunk_size = static_chunk_size

    def forward(self, x, mask, mu, t, spks, cond, streaming: bool = False):  # [B, 80, T] ... -> [B, 80, T]
        x, mu, cond = x.transpose(1, 2), mu.transpose(1, 2), cond.transpose(1, 2)
        seq_len = x.shape[1]
        t = self.time_embed(t)
        x = self.input_embed(x, cond, mu, spks)
        rope = self.rotary_embed.forward_from_seq_len(seq_len)
        residual = x
        if streaming:
            attn_mask = chunk_mask(mask.bool(), self.static_chunk_size).unsqueeze(1)
        else:
            attn_mask = chunk_mask(mask.bool(), 0).repeat(1, seq_len, 1).unsqueeze(1)
        for block in self.transformer_blocks:
            x = block(x, t, mask=attn_mask.bool(), rope=rope)
        if self.long_skip_connection is not None:
            x = self.long_skip_connection(torch.cat((x, residual), dim=-1))
        return self.proj_out(self.norm_out(x, t)).transpose(1, 2)


class PreLookaheadLayer(nn.Module):
    def __init__(self, in_channels: int, channels: int, pre_lookahead_len: int) -> None:
        super().__init__()
        self.pre_lookahead_len = pre_lookahead_len
        self.conv1 = nn.Conv1d(in_channels, channels, kernel_size=pre_lookahead_len + 1)
        self.conv2 = nn.Conv1d(channels, in_channels, kernel_size=3)

    def forward(self, inputs: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:  # [B, N, C]
        out = inputs.transpose(1, 2)
        if context is None:
            out = F.pad(out, (0, self.pre_lookahead_len))
        else:
            ctx = context.transpose(1, 2)
            out = F.pad(torch.cat([out, ctx], dim=2), (0, self.pre_lookahead_len - ctx.shape[2]))
        out = F.leaky_relu(self.conv1(out))
        out = self.conv2(F.pad(out, (self.conv2.kernel_size[0] - 1, 0)))
        return out.transpose(1, 2) + inputs


def solve_euler(estimator: nn.Module, x, t_span, mu, mask, spks, cond, cfg_rate: float, streaming: bool):
    """``ConditionalCFM.solve_euler``: CFG on a batch of two (second row: no mu, spks, cond)."""
    t, dt = t_span[0].unsqueeze(0), t_span[1] - t_span[0]
    frames = x.shape[2]
    x_in, mu_in, cond_in = (torch.zeros(2, 80, frames) for _ in range(3))
    mask_in, t_in, spks_in = torch.zeros(2, 1, frames), torch.zeros(2), torch.zeros(2, 80)
    for step in range(1, len(t_span)):
        x_in[:] = x
        mask_in[:] = mask
        mu_in[0], t_in[:], spks_in[0], cond_in[0] = mu, t.unsqueeze(0), spks, cond
        dphi = estimator(x_in, mask_in, mu_in, t_in, spks_in, cond_in, streaming=streaming)
        dphi, cfg_dphi = torch.split(dphi, [x.shape[0], x.shape[0]], dim=0)
        x = x + dt * ((1.0 + cfg_rate) * dphi - cfg_rate * cfg_dphi)
        t = t + dt
        if step < len(t_span) - 1:
            dt = t_span[step + 1] - t
    return x.float()


class _Decoder(nn.Module):
    def __init__(self, estimator: DiT) -> None:
        super().__init__()
        self.estimator = estimator


class FlowCV3Reference(nn.Module):
    """``CausalMaskedDiffWithDiT`` (+ ``CausalConditionalCFM``) inference, batch 1."""

    def __init__(self, dit: dict[str, int], lookahead_channels: int, noise: torch.Tensor) -> None:
        super().__init__()
        self.input_embedding = nn.Embedding(6561, 80)
        self.spk_embed_affine_layer = nn.Linear(192, 80)
        self.pre_lookahead_layer = PreLookaheadLayer(80, lookahead_channels, 3)
        self.decoder = _Decoder(DiT(**dit))
        self.noise = noise  # upstream's CausalConditionalCFM.rand_noise [1, 80, 15000]

    @torch.inference_mode()
    def inference(self, token, prompt_token, prompt_feat, embedding, streaming: bool, finalize: bool):
        embedding = self.spk_embed_affine_layer(F.normalize(embedding, dim=1))
        token = torch.cat([prompt_token, token], dim=1)
        token = self.input_embedding(torch.clamp(token, min=0))  # the pad mask is all ones at batch 1
        if finalize:
            h = self.pre_lookahead_layer(token)
        else:
            h = self.pre_lookahead_layer(token[:, :-3], context=token[:, -3:])
        h = h.repeat_interleave(2, dim=1)
        mel_len1, total = prompt_feat.shape[1], h.shape[1]
        conds = torch.zeros(1, total, 80)
        conds[:, :mel_len1] = prompt_feat
        mask = torch.ones(1, 1, total)
        t_span = 1 - torch.cos(torch.linspace(0, 1, 11) * 0.5 * torch.pi)
        z = self.noise[:, :, :total]
        feat = solve_euler(self.decoder.estimator, z, t_span, h.transpose(1, 2).contiguous(), mask, embedding,
                           conds.transpose(1, 2), 0.7, streaming)
        return feat[:, :, mel_len1:]
