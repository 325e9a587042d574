"""Reference of upstream CosyVoice2's flow stage (``CausalMaskedDiffWithXvec``), for numerical tests only.

Built the way upstream builds it, so that ``specli.tts.acoustic.flow_cv2`` can be compared forward by forward:

- the estimator (``cosyvoice/flow/decoder.py`` ``CausalConditionalDecoder`` on Matcha-TTS 0.0.7.2's
  ``matcha/models/components/{decoder,transformer}.py``) uses **the real diffusers 0.29.0 modules** where
  Matcha does: ``diffusers.models.attention_processor.Attention`` (its default ``AttnProcessor2_0``),
  ``diffusers.models.attention.GELU``, ``diffusers.models.lora.LoRACompatibleLinear`` and
  ``diffusers.models.activations.get_activation``; Matcha's and CosyVoice's own glue around them is
  transcribed here (``SinusoidalPosEmb``, ``Block1D``, ``ResnetBlock1D``, ``Downsample1D``, ``Upsample1D``,
  ``TimestepEmbedding``, ``FeedForward``, ``BasicTransformerBlock``; ``CausalConv1d``, ``CausalBlock1D``,
  ``CausalResnetBlock1D``);
- the encoder (``cosyvoice/transformer/upsample_encoder.py`` ``UpsampleConformerEncoder``) is upstream's own
  code only, transcribed: ``LinearNoSubsampling`` + ``EspnetRelPositionalEncoding``, ``RelPositionMultiHeaded
  Attention`` with its pad-and-reshape ``rel_shift``, ``ConformerEncoderLayer`` as the published
  cosyvoice2.yaml configures it (pre-norm, SiLU feed-forward, no macaron, no conv module), ``PreLookaheadLayer``,
  ``Upsample1D``, and the masks of ``cosyvoice/utils/mask.py`` / ``mask_to_bias`` of ``utils/common.py``;
- ``CausalMaskedDiffWithXvec.inference`` and ``CausalConditionalCFM`` (``flow_matching.py``: fixed noise,
  cosine schedule, Euler steps with classifier-free guidance) are transcribed too.

Same math, same operation order as upstream; training-only branches (dropout is built but the modules run in
eval mode, dynamic chunks, caches, TensorRT) are left out. Modules keep upstream's attribute names so that
the reference loads ``flow.pt`` (``tests/flow_fixtures.py``'s layout) key for key. Upstream hard-codes 512
channels in the encoder's pre-lookahead and upsampling layers; here they follow ``output_size`` so that
tiny checkpoints work (512 in the published model either way).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from diffusers.models.activations import get_activation
from diffusers.models.attention import GELU
from diffusers.models.attention_processor import Attention
from diffusers.models.lora import LoRACompatibleLinear
from einops import pack, rearrange, repeat
from torch import nn

__all__ = ["CausalConditionalCFM", "CausalConditionalDecoder", "CausalMaskedDiffWithXvec",
           "UpsampleConformerEncoder", "build_reference_flow"]


# --- cosyvoice/utils/mask.py and cosyvoice/utils/common.py ---------------------------------------------------

def make_pad_mask(lengths: torch.Tensor, max_len: int = 0) -> torch.Tensor:
    """``make_pad_mask``: ``[B, max_len]``, True at padded positions."""
    batch = lengths.size(0)
    max_len = max_len if max_len > 0 else int(lengths.max().item())
    seq_range = torch.arange(0, max_len, dtype=torch.int64, device=lengths.device)
    return seq_range.unsqueeze(0).expand(batch, max_len) >= lengths.unsqueeze(-1)


def subsequent_chunk_mask(size: int, chunk_size: int, device: torch.device) -> torch.Tensor:
    """``subsequent_chunk_mask`` (all left chunks): ``[size, size]``, query i sees keys before its chunk's end."""
    pos_idx = torch.arange(size, device=device)
    block_value = (torch.div(pos_idx, chunk_size, rounding_mode="trunc") + 1) * chunk_size
    return pos_idx.unsqueeze(0) < block_value.unsqueeze(1)


def add_optional_chunk_mask(xs: torch.Tensor, masks: torch.Tensor, static_chunk_size: int) -> torch.Tensor:
    """``add_optional_chunk_mask(xs, masks, False, False, 0, static_chunk_size, -1)``: the static-chunk branch
    (``[B, L, L]``) or the padding mask as is (``[B, 1, L]``); rows with no visible key are forced to True."""
    if static_chunk_size > 0:
        chunk_masks = masks & subsequent_chunk_mask(xs.size(1), static_chunk_size, xs.device).unsqueeze(0)
    else:
        chunk_masks = masks
    assert chunk_masks.dtype == torch.bool
    if (chunk_masks.sum(dim=-1) == 0).sum().item() != 0:
        chunk_masks[chunk_masks.sum(dim=-1) == 0] = True
    return chunk_masks


def mask_to_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``mask_to_bias``: bool mask -> additive bias, 0 where visible and -1e10 where masked."""
    assert mask.dtype == torch.bool
    return (1.0 - mask.to(dtype)) * -1.0e10


# --- cosyvoice/transformer: embedding.py, subsampling.py ------------------------------------------------------

class EspnetRelPositionalEncoding(nn.Module):
    """``EspnetRelPositionalEncoding``: x * sqrt(d) and a window of the ``[1, 2 max_len - 1, d]`` table of relative
    positions ``max_len - 1 .. -(max_len - 1)`` (interleaved sin / cos)."""

    def __init__(self, d_model: int, dropout_rate: float, max_len: int = 5000) -> None:
        super().__init__()
        self.d_model = d_model
        self.xscale = math.sqrt(self.d_model)
        self.dropout = nn.Dropout(p=dropout_rate)
        self.pe = self._table(max_len)  # a plain attribute upstream: not in flow.pt

    def _table(self, length: int) -> torch.Tensor:  # upstream extend_pe
        pe_positive = torch.zeros(length, self.d_model)
        pe_negative = torch.zeros(length, self.d_model)
        position = torch.arange(0, length, dtype=torch.float32).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, self.d_model, 2, dtype=torch.float32)
                             * -(math.log(10000.0) / self.d_model))
        pe_positive[:, 0::2] = torch.sin(position * div_term)
        pe_positive[:, 1::2] = torch.cos(position * div_term)
        pe_negative[:, 0::2] = torch.sin(-1 * position * div_term)
        pe_negative[:, 1::2] = torch.cos(-1 * position * div_term)
        pe_positive = torch.flip(pe_positive, [0]).unsqueeze(0)
        pe_negative = pe_negative[1:].unsqueeze(0)
        return torch.cat([pe_positive, pe_negative], dim=1)

    def forward(self, x: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        # x [B, T, d] -> x * sqrt(d) [B, T, d], pos_emb [1, 2T - 1, d]
        self.pe = self.pe.to(dtype=x.dtype, device=x.device)
        x = x * self.xscale
        pos_emb = self.position_encoding(offset=offset, size=x.size(1))
        return self.dropout(x), self.dropout(pos_emb)

    def position_encoding(self, offset: int, size: int) -> torch.Tensor:
        center = self.pe.size(1) // 2
        return self.pe[:, center - size - offset + 1: center + size + offset]


class LinearNoSubsampling(nn.Module):
    """``LinearNoSubsampling``: Linear, LayerNorm(eps=1e-5), Dropout, then the positional encoding."""

    def __init__(self, idim: int, odim: int, dropout_rate: float, pos_enc_class: nn.Module) -> None:
        super().__init__()
        self.out = nn.Sequential(nn.Linear(idim, odim), nn.LayerNorm(odim, eps=1e-5), nn.Dropout(dropout_rate))
        self.pos_enc = pos_enc_class

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor,
                offset: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x [B, T, idim], x_mask [B, 1, T] -> [B, T, odim], pos_emb [1, 2T - 1, odim], x_mask
        x = self.out(x)
        x, pos_emb = self.pos_enc(x, offset)
        return x, pos_emb, x_mask


# --- cosyvoice/transformer: attention.py, positionwise_feed_forward.py, encoder_layer.py ------------------------

class RelPositionMultiHeadedAttention(nn.Module):
    """``RelPositionMultiHeadedAttention`` (``MultiHeadedAttention``'s q/k/v/out + Transformer-XL position terms)."""

    def __init__(self, n_head: int, n_feat: int, dropout_rate: float, key_bias: bool = True) -> None:
        super().__init__()
        assert n_feat % n_head == 0
        self.d_k, self.h = n_feat // n_head, n_head
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k = nn.Linear(n_feat, n_feat, bias=key_bias)
        self.linear_v = nn.Linear(n_feat, n_feat)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.dropout = nn.Dropout(p=dropout_rate)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(self.h, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(self.h, self.d_k))

    def forward_qkv(self, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # [B, T, d] each -> [B, H, T, d_k] each
        n_batch = query.size(0)
        q = self.linear_q(query).view(n_batch, -1, self.h, self.d_k).transpose(1, 2)
        k = self.linear_k(key).view(n_batch, -1, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(value).view(n_batch, -1, self.h, self.d_k).transpose(1, 2)
        return q, k, v

    @staticmethod
    def rel_shift(x: torch.Tensor) -> torch.Tensor:
        """Upstream's pad-and-reshape trick: ``[B, H, T1, 2 T1 - 1]`` -> ``[B, H, T1, T1]``."""
        zero_pad = torch.zeros((x.size()[0], x.size()[1], x.size()[2], 1), device=x.device, dtype=x.dtype)
        x_padded = torch.cat([zero_pad, x], dim=-1)
        x_padded = x_padded.view(x.size()[0], x.size()[1], x.size(3) + 1, x.size(2))
        return x_padded[:, :, 1:].view_as(x)[:, :, :, : x.size(-1) // 2 + 1]

    def forward_attention(self, value: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # value [B, H, T2, d_k], scores [B, H, T1, T2], mask [B, 1 or T1, T2] bool -> [B, T1, d]
        n_batch = value.size(0)
        if mask.size(2) > 0:
            mask = mask.unsqueeze(1).eq(0)[:, :, :, : scores.size(-1)]  # True where masked
            scores = scores.masked_fill(mask, -float("inf"))
            attn = torch.softmax(scores, dim=-1).masked_fill(mask, 0.0)
        else:
            attn = torch.softmax(scores, dim=-1)
        x = torch.matmul(self.dropout(attn), value)
        x = x.transpose(1, 2).contiguous().view(n_batch, -1, self.h * self.d_k)
        return self.linear_out(x)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                pos_emb: torch.Tensor) -> torch.Tensor:
        # query/key/value [B, T, d], mask [B, 1 or T, T] bool, pos_emb [1, 2T - 1, d] -> [B, T, d] (no cache)
        q, k, v = self.forward_qkv(query, key, value)
        q = q.transpose(1, 2)  # [B, T1, H, d_k]
        n_batch_pos = pos_emb.size(0)
        p = self.linear_pos(pos_emb).view(n_batch_pos, -1, self.h, self.d_k).transpose(1, 2)  # [1, H, 2T-1, d_k]
        q_with_bias_u = (q + self.pos_bias_u).transpose(1, 2)  # [B, H, T1, d_k]
        q_with_bias_v = (q + self.pos_bias_v).transpose(1, 2)
        matrix_ac = torch.matmul(q_with_bias_u, k.transpose(-2, -1))  # [B, H, T1, T2]
        matrix_bd = torch.matmul(q_with_bias_v, p.transpose(-2, -1))  # [B, H, T1, 2 T1 - 1]
        if matrix_ac.shape != matrix_bd.shape:
            matrix_bd = self.rel_shift(matrix_bd)
        scores = (matrix_ac + matrix_bd) / math.sqrt(self.d_k)
        return self.forward_attention(v, scores, mask)


class PositionwiseFeedForward(nn.Module):
    """``PositionwiseFeedForward``: w_2(dropout(activation(w_1(x))))."""

    def __init__(self, idim: int, hidden_units: int, dropout_rate: float, activation: nn.Module) -> None:
        super().__init__()
        self.w_1 = nn.Linear(idim, hidden_units)
        self.activation = activation
        self.dropout = nn.Dropout(dropout_rate)
        self.w_2 = nn.Linear(hidden_units, idim)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:  # [B, T, d]
        return self.w_2(self.dropout(self.activation(self.w_1(xs))))


class ConformerEncoderLayer(nn.Module):
    """``ConformerEncoderLayer`` as cosyvoice2.yaml builds it: ``normalize_before=True``, no macaron feed-forward
    (``ff_scale = 1``), no convolution module (so no ``norm_conv`` / ``norm_final``). Its norms use eps=1e-12."""

    def __init__(self, size: int, self_attn: nn.Module, feed_forward: nn.Module, dropout_rate: float) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.norm_ff = nn.LayerNorm(size, eps=1e-12)
        self.norm_mha = nn.LayerNorm(size, eps=1e-12)
        self.ff_scale = 1.0
        self.dropout = nn.Dropout(dropout_rate)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pos_emb: torch.Tensor) -> torch.Tensor:
        # x [B, T, d], mask [B, 1 or T, T], pos_emb [1, 2T - 1, d] -> [B, T, d]
        residual = x
        x = self.norm_mha(x)
        x_att = self.self_attn(x, x, x, mask, pos_emb)
        x = residual + self.dropout(x_att)
        residual = x
        x = self.norm_ff(x)
        return residual + self.ff_scale * self.dropout(self.feed_forward(x))


# --- cosyvoice/transformer/upsample_encoder.py ---------------------------------------------------------------

class EncoderUpsample1D(nn.Module):
    """upsample_encoder's ``Upsample1D``: nearest x stride, ``2 stride`` zeros on the left, conv ``2 stride + 1``."""

    def __init__(self, channels: int, out_channels: int, stride: int = 2) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(channels, out_channels, stride * 2 + 1, stride=1, padding=0)

    def forward(self, inputs: torch.Tensor, input_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # inputs [B, C, T] -> [B, C, stride T], lengths x stride
        outputs = F.interpolate(inputs, scale_factor=float(self.stride), mode="nearest")
        outputs = F.pad(outputs, (self.stride * 2, 0), value=0.0)
        return self.conv(outputs), input_lengths * self.stride


class PreLookaheadLayer(nn.Module):
    """``PreLookaheadLayer``: conv over each step and the next ``pre_lookahead_len`` (zeros or the given context),
    leaky ReLU, causal conv k3, residual."""

    def __init__(self, in_channels: int, channels: int, pre_lookahead_len: int = 1) -> None:
        super().__init__()
        self.pre_lookahead_len = pre_lookahead_len
        self.conv1 = nn.Conv1d(in_channels, channels, kernel_size=pre_lookahead_len + 1, stride=1, padding=0)
        self.conv2 = nn.Conv1d(channels, in_channels, kernel_size=3, stride=1, padding=0)

    def forward(self, inputs: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        # inputs [B, T, C], context [B, 0 or pre_lookahead_len, C] -> [B, T, C]
        outputs = inputs.transpose(1, 2).contiguous()
        context = context.transpose(1, 2).contiguous()
        if context.size(2) == 0:
            outputs = F.pad(outputs, (0, self.pre_lookahead_len), mode="constant", value=0.0)
        else:
            assert context.size(2) == self.pre_lookahead_len
            outputs = F.pad(torch.concat([outputs, context], dim=2), (0, self.pre_lookahead_len - context.size(2)),
                            mode="constant", value=0.0)
        outputs = F.leaky_relu(self.conv1(outputs))
        outputs = F.pad(outputs, (self.conv2.kernel_size[0] - 1, 0), mode="constant", value=0.0)
        outputs = self.conv2(outputs).transpose(1, 2).contiguous()
        return outputs + inputs


def _conformer_stack(n: int, d: int, heads: int, units: int, dropout: float, att_dropout: float) -> nn.ModuleList:
    """``n`` ConformerEncoderLayers with rel-position attention and a SiLU ("swish") feed-forward."""
    return nn.ModuleList(ConformerEncoderLayer(d, RelPositionMultiHeadedAttention(heads, d, att_dropout),
                                               PositionwiseFeedForward(d, units, dropout, nn.SiLU()), dropout)
                         for _ in range(n))


class UpsampleConformerEncoder(nn.Module):
    """``UpsampleConformerEncoder`` with ``input_layer: linear``, ``pos_enc_layer_type: rel_pos_espnet``,
    ``selfattention_layer_type: rel_selfattn`` (the published yaml)."""

    def __init__(self, input_size: int, output_size: int = 256, attention_heads: int = 4, linear_units: int = 2048,
                 num_blocks: int = 6, dropout_rate: float = 0.1, positional_dropout_rate: float = 0.1,
                 attention_dropout_rate: float = 0.0, static_chunk_size: int = 0) -> None:
        super().__init__()
        d = output_size
        self.embed = LinearNoSubsampling(input_size, d, dropout_rate,
                                         EspnetRelPositionalEncoding(d, positional_dropout_rate))
        self.after_norm = nn.LayerNorm(d, eps=1e-5)
        self.static_chunk_size = static_chunk_size
        self.pre_lookahead_layer = PreLookaheadLayer(in_channels=d, channels=d, pre_lookahead_len=3)  # 512 upstream
        self.encoders = _conformer_stack(num_blocks, d, attention_heads, linear_units, dropout_rate,
                                         attention_dropout_rate)
        self.up_layer = EncoderUpsample1D(channels=d, out_channels=d, stride=2)  # 512 upstream
        self.up_embed = LinearNoSubsampling(input_size, d, dropout_rate,
                                            EspnetRelPositionalEncoding(d, positional_dropout_rate))
        self.up_encoders = _conformer_stack(4, d, attention_heads, linear_units, dropout_rate, attention_dropout_rate)

    def forward(self, xs: torch.Tensor, xs_lens: torch.Tensor, context: torch.Tensor | None = None,
                streaming: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        # xs [B, T, input_size], xs_lens [B], context [1, 3, input_size] | None -> [B, 2T, d], masks [B, 1, 2T]
        context = torch.zeros(0, 0, 0) if context is None else context
        masks = ~make_pad_mask(xs_lens, xs.size(1)).unsqueeze(1)  # [B, 1, T]
        xs, pos_emb, masks = self.embed(xs, masks)
        if context.size(1) != 0:
            context_masks = torch.ones(1, 1, context.size(1)).to(masks)
            context, _, _ = self.embed(context, context_masks, offset=xs.size(1))
        chunk_masks = add_optional_chunk_mask(xs, masks, self.static_chunk_size if streaming else 0)
        xs = self.pre_lookahead_layer(xs, context=context)
        for layer in self.encoders:
            xs = layer(xs, chunk_masks, pos_emb)
        xs = xs.transpose(1, 2).contiguous()
        xs, xs_lens = self.up_layer(xs, xs_lens)
        xs = xs.transpose(1, 2).contiguous()
        masks = ~make_pad_mask(xs_lens, xs.size(1)).unsqueeze(1)  # [B, 1, 2T]
        xs, pos_emb, masks = self.up_embed(xs, masks)
        stride = self.up_layer.stride
        chunk_masks = add_optional_chunk_mask(xs, masks, self.static_chunk_size * stride if streaming else 0)
        for layer in self.up_encoders:
            xs = layer(xs, chunk_masks, pos_emb)
        return self.after_norm(xs), masks


# --- matcha/models/components/decoder.py ----------------------------------------------------------------------

class SinusoidalPosEmb(nn.Module):
    """Matcha ``SinusoidalPosEmb``: ``[sin | cos](scale * t * 10000^(-k / (dim/2 - 1)))``, ``[B] -> [B, dim]``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        assert self.dim % 2 == 0, "SinusoidalPosEmb requires dim to be even"

    def forward(self, x: torch.Tensor, scale: float = 1000) -> torch.Tensor:
        if x.ndim < 1:
            x = x.unsqueeze(0)
        half_dim = self.dim // 2
        emb = math.log(10000) / (half_dim - 1)
        emb = torch.exp(torch.arange(half_dim, device=x.device).float() * -emb)
        emb = scale * x.unsqueeze(1) * emb.unsqueeze(0)
        return torch.cat((emb.sin(), emb.cos()), dim=-1)


class Block1D(nn.Module):
    """Matcha ``Block1D``: conv k3, GroupNorm, Mish, masked in and out."""

    def __init__(self, dim: int, dim_out: int, groups: int = 8) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Conv1d(dim, dim_out, 3, padding=1), nn.GroupNorm(groups, dim_out), nn.Mish())

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # x [B, C, T], mask [B, 1, T]
        output = self.block(x * mask)
        return output * mask


class ResnetBlock1D(nn.Module):
    """Matcha ``ResnetBlock1D``: block1, + Linear(Mish(time)), block2, + 1x1 residual conv of the masked input."""

    def __init__(self, dim: int, dim_out: int, time_emb_dim: int, groups: int = 8) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_emb_dim, dim_out))
        self.block1 = Block1D(dim, dim_out, groups=groups)
        self.block2 = Block1D(dim_out, dim_out, groups=groups)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, time_emb: torch.Tensor) -> torch.Tensor:
        # x [B, dim, T], mask [B, 1, T], time_emb [B, time_emb_dim] -> [B, dim_out, T]
        h = self.block1(x, mask)
        h += self.mlp(time_emb).unsqueeze(-1)
        h = self.block2(h, mask)
        return h + self.res_conv(x * mask)


class Downsample1D(nn.Module):
    """Matcha ``Downsample1D`` (stride-2 conv; only between U-Net levels, unused by the one-level published U-Net)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, 3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Upsample1D(nn.Module):
    """Matcha ``Upsample1D`` (transposed conv by default; only between U-Net levels, unused when one level)."""

    def __init__(self, channels: int, use_conv: bool = False, use_conv_transpose: bool = True) -> None:
        super().__init__()
        self.channels = channels
        self.use_conv, self.use_conv_transpose = use_conv, use_conv_transpose
        self.conv: nn.Module | None = None
        if use_conv_transpose:
            self.conv = nn.ConvTranspose1d(channels, channels, 4, 2, 1)
        elif use_conv:
            self.conv = nn.Conv1d(channels, channels, 3, padding=1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        assert inputs.shape[1] == self.channels
        if self.use_conv_transpose:
            return self.conv(inputs)
        outputs = F.interpolate(inputs, scale_factor=2.0, mode="nearest")
        return self.conv(outputs) if self.use_conv else outputs


class TimestepEmbedding(nn.Module):
    """Matcha ``TimestepEmbedding`` (no condition projection, no post activation): linear_1, act, linear_2."""

    def __init__(self, in_channels: int, time_embed_dim: int, act_fn: str = "silu") -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, time_embed_dim)
        self.act = get_activation(act_fn)  # diffusers' activation table
        self.linear_2 = nn.Linear(time_embed_dim, time_embed_dim)

    def forward(self, sample: torch.Tensor) -> torch.Tensor:  # [B, in_channels] -> [B, time_embed_dim]
        sample = self.linear_1(sample)
        if self.act is not None:
            sample = self.act(sample)
        return self.linear_2(sample)


# --- matcha/models/components/transformer.py ------------------------------------------------------------------

class FeedForward(nn.Module):
    """Matcha's ``FeedForward`` with ``activation_fn='gelu'``: diffusers ``GELU`` (proj + exact gelu), Dropout,
    diffusers ``LoRACompatibleLinear`` (no final dropout)."""

    def __init__(self, dim: int, mult: int = 4, dropout: float = 0.0, activation_fn: str = "gelu") -> None:
        super().__init__()
        assert activation_fn == "gelu", "the published CosyVoice2 estimator uses act_fn: 'gelu'"
        inner_dim = int(dim * mult)
        self.net = nn.ModuleList([GELU(dim, inner_dim), nn.Dropout(dropout), LoRACompatibleLinear(inner_dim, dim)])

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # [B, T, dim]
        for module in self.net:
            hidden_states = module(hidden_states)
        return hidden_states


class BasicTransformerBlock(nn.Module):
    """Matcha's ``BasicTransformerBlock`` with ``norm_type='layer_norm'``, no cross-attention, no feed-forward
    chunking: LayerNorm -> diffusers ``Attention`` (self, no q/k/v bias) -> residual; LayerNorm -> FF -> residual."""

    def __init__(self, dim: int, num_attention_heads: int, attention_head_dim: int, dropout: float = 0.0,
                 activation_fn: str = "geglu", attention_bias: bool = False, upcast_attention: bool = False) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=True)
        self.attn1 = Attention(query_dim=dim, heads=num_attention_heads, dim_head=attention_head_dim, dropout=dropout,
                               bias=attention_bias, cross_attention_dim=None, upcast_attention=upcast_attention)
        self.norm3 = nn.LayerNorm(dim, elementwise_affine=True)
        self.ff = FeedForward(dim, dropout=dropout, activation_fn=activation_fn)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                timestep: torch.Tensor | None = None) -> torch.Tensor:
        # hidden_states [B, T, dim], attention_mask [B, T, T] additive bias -> [B, T, dim]
        norm_hidden_states = self.norm1(hidden_states)
        attn_output = self.attn1(norm_hidden_states, encoder_hidden_states=None, attention_mask=attention_mask)
        hidden_states = attn_output + hidden_states
        norm_hidden_states = self.norm3(hidden_states)
        ff_output = self.ff(norm_hidden_states)
        return ff_output + hidden_states


# --- cosyvoice/flow/decoder.py ---------------------------------------------------------------------------------

class Transpose(nn.Module):
    def __init__(self, dim0: int, dim1: int) -> None:
        super().__init__()
        self.dim0, self.dim1 = dim0, dim1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.transpose(x, self.dim0, self.dim1)


class CausalConv1d(nn.Conv1d):
    """``CausalConv1d``: ``kernel - 1`` zeros on the left, no padding in the conv (stride 1)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size, 1, padding=0)
        self.causal_padding = kernel_size - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T] -> [B, C_out, T]
        x = F.pad(x, (self.causal_padding, 0), value=0.0)
        return super().forward(x)


class CausalBlock1D(Block1D):
    """``CausalBlock1D``: Block1D's masking with causal conv k3, LayerNorm over channels, Mish."""

    def __init__(self, dim: int, dim_out: int) -> None:
        super().__init__(dim, dim_out)
        self.block = nn.Sequential(CausalConv1d(dim, dim_out, 3), Transpose(1, 2), nn.LayerNorm(dim_out),
                                   Transpose(1, 2), nn.Mish())


class CausalResnetBlock1D(ResnetBlock1D):
    """``CausalResnetBlock1D``: ResnetBlock1D with CausalBlock1D blocks."""

    def __init__(self, dim: int, dim_out: int, time_emb_dim: int, groups: int = 8) -> None:
        super().__init__(dim, dim_out, time_emb_dim, groups)
        self.block1 = CausalBlock1D(dim, dim_out)
        self.block2 = CausalBlock1D(dim_out, dim_out)


def _transformer_blocks(dim: int, n_blocks: int, num_heads: int, head_dim: int, dropout: float,
                        act_fn: str) -> nn.ModuleList:
    return nn.ModuleList(BasicTransformerBlock(dim=dim, num_attention_heads=num_heads, attention_head_dim=head_dim,
                                               dropout=dropout, activation_fn=act_fn) for _ in range(n_blocks))


class CausalConditionalDecoder(nn.Module):
    """``CausalConditionalDecoder``: the U-Net velocity estimator ``(x, mask, mu, t, spks, cond) -> [B, out, T]``."""

    def __init__(self, in_channels: int, out_channels: int, channels: tuple[int, ...] = (256, 256),
                 dropout: float = 0.05, attention_head_dim: int = 64, n_blocks: int = 1, num_mid_blocks: int = 2,
                 num_heads: int = 4, act_fn: str = "snake", static_chunk_size: int = 50) -> None:
        super().__init__()
        channels = tuple(channels)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.time_embeddings = SinusoidalPosEmb(in_channels)
        time_embed_dim = channels[0] * 4
        self.time_mlp = TimestepEmbedding(in_channels=in_channels, time_embed_dim=time_embed_dim, act_fn="silu")
        self.static_chunk_size = static_chunk_size
        attn = (n_blocks, num_heads, attention_head_dim, dropout, act_fn)
        self.down_blocks, self.mid_blocks, self.up_blocks = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        output_channel = in_channels
        for i, channel in enumerate(channels):
            input_channel, output_channel = output_channel, channel
            is_last = i == len(channels) - 1
            resnet = CausalResnetBlock1D(dim=input_channel, dim_out=output_channel, time_emb_dim=time_embed_dim)
            downsample = (Downsample1D(output_channel) if not is_last
                          else CausalConv1d(output_channel, output_channel, 3))
            self.down_blocks.append(nn.ModuleList([resnet, _transformer_blocks(output_channel, *attn), downsample]))
        for _ in range(num_mid_blocks):
            resnet = CausalResnetBlock1D(dim=channels[-1], dim_out=output_channel, time_emb_dim=time_embed_dim)
            self.mid_blocks.append(nn.ModuleList([resnet, _transformer_blocks(output_channel, *attn)]))
        channels = channels[::-1] + (channels[0],)
        for i in range(len(channels) - 1):
            input_channel, output_channel = channels[i] * 2, channels[i + 1]
            is_last = i == len(channels) - 2
            resnet = CausalResnetBlock1D(dim=input_channel, dim_out=output_channel, time_emb_dim=time_embed_dim)
            upsample = (Upsample1D(output_channel, use_conv_transpose=True) if not is_last
                        else CausalConv1d(output_channel, output_channel, 3))
            self.up_blocks.append(nn.ModuleList([resnet, _transformer_blocks(output_channel, *attn), upsample]))
        self.final_block = CausalBlock1D(channels[-1], channels[-1])
        self.final_proj = nn.Conv1d(channels[-1], self.out_channels, 1)

    def _transformers(self, blocks: nn.ModuleList, x: torch.Tensor, mask: torch.Tensor, t: torch.Tensor,
                      streaming: bool) -> torch.Tensor:
        """The attention part each level repeats: x [B, C, T], mask [B, 1, T] -> [B, C, T]."""
        x = rearrange(x, "b c t -> b t c").contiguous()
        if streaming is True:
            attn_mask = add_optional_chunk_mask(x, mask.bool(), self.static_chunk_size)
        else:
            attn_mask = add_optional_chunk_mask(x, mask.bool(), 0).repeat(1, x.size(1), 1)
        attn_mask = mask_to_bias(attn_mask, x.dtype)  # [B, T, T]
        for transformer_block in blocks:
            x = transformer_block(hidden_states=x, attention_mask=attn_mask, timestep=t)
        return rearrange(x, "b t c -> b c t").contiguous()

    def forward(self, x: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, t: torch.Tensor,
                spks: torch.Tensor | None = None, cond: torch.Tensor | None = None,
                streaming: bool = False) -> torch.Tensor:
        # x, mu, cond [B, 80, T], mask [B, 1, T], t [B], spks [B, 80] -> [B, out_channels, T]
        t = self.time_embeddings(t).to(t.dtype)
        t = self.time_mlp(t)
        x = pack([x, mu], "b * t")[0]
        if spks is not None:
            spks = repeat(spks, "b c -> b c t", t=x.shape[-1])
            x = pack([x, spks], "b * t")[0]
        if cond is not None:
            x = pack([x, cond], "b * t")[0]
        hiddens, masks = [], [mask]
        for resnet, transformer_blocks, downsample in self.down_blocks:
            mask_down = masks[-1]
            x = self._transformers(transformer_blocks, resnet(x, mask_down, t), mask_down, t, streaming)
            hiddens.append(x)  # skip connection
            x = downsample(x * mask_down)
            masks.append(mask_down[:, :, ::2])
        masks = masks[:-1]
        mask_mid = masks[-1]
        for resnet, transformer_blocks in self.mid_blocks:
            x = self._transformers(transformer_blocks, resnet(x, mask_mid, t), mask_mid, t, streaming)
        for resnet, transformer_blocks, upsample in self.up_blocks:
            mask_up = masks.pop()
            skip = hiddens.pop()
            x = pack([x[:, :, : skip.shape[-1]], skip], "b * t")[0]
            x = self._transformers(transformer_blocks, resnet(x, mask_up, t), mask_up, t, streaming)
            x = upsample(x * mask_up)
        x = self.final_block(x, mask_up)
        output = self.final_proj(x * mask_up)
        return output * mask


# --- cosyvoice/flow/flow_matching.py and flow.py ---------------------------------------------------------------

class CausalConditionalCFM(nn.Module):
    """``CausalConditionalCFM`` at inference: fixed seed-0 noise, cosine-scheduled Euler steps, CFG (w = 0.7)."""

    def __init__(self, estimator: nn.Module, inference_cfg_rate: float = 0.7, t_scheduler: str = "cosine") -> None:
        super().__init__()
        self.estimator = estimator
        self.inference_cfg_rate, self.t_scheduler = inference_cfg_rate, t_scheduler
        # upstream: set_all_random_seed(0); torch.randn([1, 80, 50 * 300]) (a seed-0 CPU generator draws the same)
        self.rand_noise = torch.randn([1, 80, 50 * 300], generator=torch.Generator().manual_seed(0))

    @torch.inference_mode()
    def forward(self, mu: torch.Tensor, mask: torch.Tensor, n_timesteps: int, temperature: float = 1.0,
                spks: torch.Tensor | None = None, cond: torch.Tensor | None = None,
                streaming: bool = False) -> torch.Tensor:
        # mu [1, 80, T], mask [1, 1, T], spks [1, 80], cond [1, 80, T] -> mel [1, 80, T]
        z = self.rand_noise[:, :, : mu.size(2)].to(mu.device).to(mu.dtype) * temperature
        t_span = torch.linspace(0, 1, n_timesteps + 1, device=mu.device, dtype=mu.dtype)
        if self.t_scheduler == "cosine":
            t_span = 1 - torch.cos(t_span * 0.5 * torch.pi)
        return self.solve_euler(z, t_span=t_span, mu=mu, mask=mask, spks=spks, cond=cond, streaming=streaming)

    def solve_euler(self, x: torch.Tensor, t_span: torch.Tensor, mu: torch.Tensor, mask: torch.Tensor,
                    spks: torch.Tensor, cond: torch.Tensor, streaming: bool = False) -> torch.Tensor:
        t, dt = t_span[0], t_span[1] - t_span[0]
        t = t.unsqueeze(dim=0)
        dtype = spks.dtype  # upstream allocates the CFG batch in the speaker embedding's dtype
        x_in = torch.zeros([2, 80, x.size(2)], device=x.device, dtype=dtype)
        mask_in = torch.zeros([2, 1, x.size(2)], device=x.device, dtype=dtype)
        mu_in = torch.zeros([2, 80, x.size(2)], device=x.device, dtype=dtype)
        t_in = torch.zeros([2], device=x.device, dtype=dtype)
        spks_in = torch.zeros([2, 80], device=x.device, dtype=dtype)
        cond_in = torch.zeros([2, 80, x.size(2)], device=x.device, dtype=dtype)
        for step in range(1, len(t_span)):
            x_in[:] = x
            mask_in[:] = mask
            mu_in[0] = mu
            t_in[:] = t.unsqueeze(0)
            spks_in[0] = spks
            cond_in[0] = cond
            dphi_dt = self.estimator(x_in, mask_in, mu_in, t_in, spks_in, cond_in, streaming=streaming)
            dphi_dt, cfg_dphi_dt = torch.split(dphi_dt, [x.size(0), x.size(0)], dim=0)
            dphi_dt = (1.0 + self.inference_cfg_rate) * dphi_dt - self.inference_cfg_rate * cfg_dphi_dt
            x = x + dt * dphi_dt
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        return x.float()


class CausalMaskedDiffWithXvec(nn.Module):
    """``CausalMaskedDiffWithXvec`` at inference: tokens (+ prompt) -> encoder -> ``encoder_proj`` = mu -> CFM."""

    def __init__(self, encoder: UpsampleConformerEncoder, decoder: CausalConditionalCFM, input_size: int = 512,
                 output_size: int = 80, spk_embed_dim: int = 192, vocab_size: int = 4096,
                 pre_lookahead_len: int = 3) -> None:
        super().__init__()
        self.output_size, self.pre_lookahead_len = output_size, pre_lookahead_len
        self.input_embedding = nn.Embedding(vocab_size, input_size)
        self.spk_embed_affine_layer = nn.Linear(spk_embed_dim, output_size)
        self.encoder = encoder
        self.encoder_proj = nn.Linear(encoder.after_norm.normalized_shape[0], output_size)
        self.decoder = decoder

    @torch.inference_mode()
    def inference(self, token: torch.Tensor, token_len: torch.Tensor, prompt_token: torch.Tensor,
                  prompt_token_len: torch.Tensor, prompt_feat: torch.Tensor, embedding: torch.Tensor,
                  streaming: bool, finalize: bool) -> torch.Tensor:
        # token [1, N], prompt_token [1, P], prompt_feat [1, 2P, 80], embedding [1, 192] -> mel [1, 80, 2N (- 6)]
        assert token.shape[0] == 1
        embedding = self.spk_embed_affine_layer(F.normalize(embedding, dim=1))
        token, token_len = torch.concat([prompt_token, token], dim=1), prompt_token_len + token_len
        mask = (~make_pad_mask(token_len)).unsqueeze(-1).to(embedding)
        token = self.input_embedding(torch.clamp(token, min=0)) * mask
        if finalize is True:
            h, _ = self.encoder(token, token_len, streaming=streaming)
        else:
            token, context = token[:, : -self.pre_lookahead_len], token[:, -self.pre_lookahead_len:]
            h, _ = self.encoder(token, token_len, context=context, streaming=streaming)
        mel_len1, mel_len2 = prompt_feat.shape[1], h.shape[1] - prompt_feat.shape[1]
        h = self.encoder_proj(h)
        conds = torch.zeros([1, mel_len1 + mel_len2, self.output_size], device=token.device).to(h.dtype)
        conds[:, :mel_len1] = prompt_feat
        conds = conds.transpose(1, 2)
        mask = (~make_pad_mask(torch.tensor([mel_len1 + mel_len2]))).to(h)
        feat = self.decoder(mu=h.transpose(1, 2).contiguous(), mask=mask.unsqueeze(1), spks=embedding, cond=conds,
                            n_timesteps=10, streaming=streaming)
        feat = feat[:, :, mel_len1:]
        assert feat.shape[2] == mel_len2
        return feat.float()


def build_reference_flow(sizes: dict[str, int]) -> CausalMaskedDiffWithXvec:
    """The reference flow for ``tests/flow_fixtures.py`` sizes (``TINY_CV2``'s keys), as the yaml would build it."""
    encoder = UpsampleConformerEncoder(input_size=sizes["d"], output_size=sizes["d"], attention_heads=sizes["heads"],
                                       linear_units=sizes["units"], num_blocks=sizes["blocks"], dropout_rate=0.1,
                                       positional_dropout_rate=0.1, attention_dropout_rate=0.1,
                                       static_chunk_size=sizes["chunk"])
    estimator = CausalConditionalDecoder(in_channels=320, out_channels=80, channels=(sizes["c"],), dropout=0.0,
                                         attention_head_dim=sizes["head_dim"], n_blocks=sizes["n_blocks"],
                                         num_mid_blocks=sizes["mid"], num_heads=sizes["unet_heads"], act_fn="gelu",
                                         static_chunk_size=sizes["unet_chunk"])
    flow = CausalMaskedDiffWithXvec(encoder, CausalConditionalCFM(estimator), input_size=sizes["d"], output_size=80,
                                    spk_embed_dim=192, vocab_size=6561, pre_lookahead_len=3)
    return flow.eval()
