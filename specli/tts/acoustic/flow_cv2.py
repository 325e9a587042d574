"""CosyVoice2 flow stage (inference only): speech tokens -> 80-bin mel at 50 frames/s.

A port of upstream's ``CausalMaskedDiffWithXvec`` (``cosyvoice/flow/flow.py``) with its
``UpsampleConformerEncoder`` (``transformer/upsample_encoder.py`` + wenet-style layers) and the
``CausalConditionalDecoder`` estimator (``flow/decoder.py``, a Matcha-TTS U-Net with diffusers-style
transformer blocks), loading the official ``flow.pt`` key for key:

- ``input_embedding`` (6561 x 512) of prompt tokens + tokens -> encoder: linear + LayerNorm, scaled by
  sqrt(512), ESPnet relative positions; the pre-lookahead conv (3 tokens ahead); 6 pre-norm conformer
  blocks (relative-position self-attention with ``pos_bias_u/v``, SiLU feed-forward; no conv module, no
  macaron); x2 nearest upsampling + causal conv (kernel 5); a second embedding; 4 more blocks; LayerNorm
  -> ``encoder_proj`` (512 -> 80) = ``mu`` at 50 Hz;
- the x-vector, L2-normalised, -> ``spk_embed_affine_layer`` (192 -> 80); the prompt mel as condition;
- :func:`specli.tts.acoustic.cfm.solve_cfm` with the U-Net: sinusoidal time embedding + MLP; causal ResNet
  blocks (causal conv k3, LayerNorm, Mish) each followed by transformer blocks (LayerNorm, 8x64 self-
  attention without q/k/v bias, GELU feed-forward x4): one down level (no resampling in the published
  config), 12 mid blocks, one up level with the skip connection, final causal block and 1x1 projection.

Only the published single-level U-Net (``channels: [256]``) is supported. Attention is full, or chunk-causal
(25 tokens in the encoder, 50 frames after upsampling and in the estimator) with ``streaming=True``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specli.tts.acoustic.cfm import CFMSettings, attention_mask, chunk_attention_mask, timestep_sinusoid, yaml_args
from specli.tts.acoustic.flow_cv3 import PreLookahead, TokenFlow

__all__ = ["EncoderConfig", "FlowCV2", "FlowCV2Config", "UNetConfig"]


@dataclass(frozen=True)
class EncoderConfig:
    """``UpsampleConformerEncoder`` arguments inference reads (the published yaml's values)."""

    output_size: int = 512  # model width (upstream hard-codes 512 for the lookahead and upsampling layers)
    attention_heads: int = 8  # heads
    linear_units: int = 2048  # feed-forward width
    num_blocks: int = 6  # conformer blocks before upsampling (4 after, fixed upstream)
    static_chunk_size: int = 25  # streaming: tokens per attention chunk (x2 after upsampling)

    def __post_init__(self) -> None:
        if min(self.output_size, self.attention_heads, self.linear_units, self.num_blocks) < 1:
            raise ValueError("encoder sizes must be positive")
        if self.output_size % self.attention_heads or self.output_size % 2:
            raise ValueError("output_size must be even and a multiple of attention_heads")


@dataclass(frozen=True)
class UNetConfig:
    """``CausalConditionalDecoder`` arguments inference reads (the published yaml's values)."""

    in_channels: int = 320  # x, mu, speaker and condition channels stacked
    out_channels: int = 80  # mel bins
    channels: int = 256  # width of the single U-Net level
    attention_head_dim: int = 64  # width of a head
    num_heads: int = 8  # heads
    n_blocks: int = 4  # transformer blocks after each ResNet block
    num_mid_blocks: int = 12  # middle ResNet + transformer stacks
    static_chunk_size: int = 50  # streaming: frames per attention chunk

    def __post_init__(self) -> None:
        if min(self.in_channels, self.out_channels, self.channels, self.attention_head_dim, self.num_heads) < 1:
            raise ValueError("U-Net sizes must be positive")
        if self.in_channels % 2:
            raise ValueError("in_channels must be even (sinusoidal time embedding)")


@dataclass(frozen=True)
class FlowCV2Config:
    """``CausalMaskedDiffWithXvec`` arguments inference reads; defaults are the published ones."""

    vocab_size: int = 6561  # speech codes
    input_size: int = 512  # token embedding width (= the encoder's input)
    output_size: int = 80  # mel bins
    spk_embed_dim: int = 192  # x-vector width
    token_mel_ratio: int = 2  # mel frames per token (the encoder's upsampling)
    pre_lookahead_len: int = 3  # tokens the pre-lookahead conv looks ahead
    encoder: EncoderConfig = field(default_factory=EncoderConfig)  # the upsampling conformer
    unet: UNetConfig = field(default_factory=UNetConfig)  # the estimator
    cfm: CFMSettings = field(default_factory=CFMSettings)  # solver settings

    def __post_init__(self) -> None:
        if self.token_mel_ratio != 2:
            raise ValueError("the CosyVoice2 encoder upsamples x2: token_mel_ratio must be 2")
        if self.input_size != self.encoder.output_size:
            raise ValueError("input_size must equal the encoder's output_size")
        if self.unet.in_channels != 4 * self.output_size or self.unet.out_channels != self.output_size:
            raise ValueError("the U-Net takes x, mu, speaker and condition (4 x output_size) and returns output_size")

    @classmethod
    def from_yaml(cls, node: Any) -> FlowCV2Config:
        """From the ``flow: !new:...CausalMaskedDiffWithXvec`` node (published values where absent)."""
        args = yaml_args(node)
        kwargs = {k: int(args[k]) for k in ("vocab_size", "input_size", "output_size", "spk_embed_dim",
                                            "token_mel_ratio", "pre_lookahead_len") if k in args}
        enc = yaml_args(args.get("encoder"))
        for name, expected in (("input_layer", "linear"), ("pos_enc_layer_type", "rel_pos_espnet"),
                               ("selfattention_layer_type", "rel_selfattn"), ("use_cnn_module", False),
                               ("macaron_style", False), ("normalize_before", True)):
            if name in enc and enc[name] != expected:
                raise ValueError(f"encoder {name}={enc[name]!r} is not supported ({expected!r})")
        encoder = EncoderConfig(**{k: int(enc[k]) for k in ("output_size", "attention_heads", "linear_units",
                                                             "num_blocks", "static_chunk_size") if k in enc})
        decoder = args.get("decoder")
        est = yaml_args(yaml_args(decoder).get("estimator"))
        channels = est.get("channels", [256])
        if not isinstance(channels, list) or len(channels) != 1:
            raise ValueError(f"estimator channels {channels!r}: only a single U-Net level is supported")
        if est.get("act_fn", "gelu") != "gelu":
            raise ValueError(f"estimator act_fn {est.get('act_fn')!r} is not supported (gelu)")
        unet = UNetConfig(channels=int(channels[0]), **{k: int(est[k]) for k in (
            "in_channels", "out_channels", "attention_head_dim", "num_heads", "n_blocks", "num_mid_blocks",
            "static_chunk_size") if k in est})
        return cls(**kwargs, encoder=encoder, unet=unet, cfm=CFMSettings.from_yaml(decoder))


# --- the upsampling conformer encoder -------------------------------------------------------------------

class _LinearEmbed(nn.Module):
    """``LinearNoSubsampling`` + the ESPnet relative positional encoding's input scaling."""

    def __init__(self, cin: int, d: int) -> None:
        super().__init__()
        self.out = nn.Sequential(nn.Linear(cin, d), nn.LayerNorm(d, eps=1e-5))
        self.scale = math.sqrt(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, cin] -> [B, T, d]
        return self.out(x) * self.scale


def relative_positions(n: int, d: int, device: torch.device) -> torch.Tensor:
    """``[1, 2n - 1, d]`` sinusoids of relative positions ``n - 1 .. -(n - 1)`` (ESPnet, interleaved sin/cos)."""
    rel = torch.arange(n - 1, -n, -1, device=device, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d, 2, device=device, dtype=torch.float32) * -(math.log(10000.0) / d))
    pe = torch.zeros(2 * n - 1, d, device=device)
    pe[:, 0::2] = torch.sin(rel * div)
    pe[:, 1::2] = torch.cos(rel * div)
    return pe[None]


def rel_shift(scores: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, 2T - 1]`` scores over relative positions -> ``[B, H, T, T]``: entry (i, j) reads relative
    position ``i - j``, i.e. column ``T - 1 - i + j`` (what upstream's pad-and-reshape trick selects)."""
    t = scores.shape[2]
    idx = (t - 1) - torch.arange(t, device=scores.device)[:, None] + torch.arange(t, device=scores.device)[None]
    return scores.gather(-1, idx.expand(*scores.shape[:2], t, t))


class _RelSelfAttention(nn.Module):
    """``RelPositionMultiHeadedAttention`` (Transformer-XL scores with ``pos_bias_u`` / ``pos_bias_v``)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.h, self.dk = heads, d // heads
        self.linear_q, self.linear_k, self.linear_v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.linear_out = nn.Linear(d, d)
        self.linear_pos = nn.Linear(d, d, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(heads, d // heads))
        self.pos_bias_v = nn.Parameter(torch.zeros(heads, d // heads))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        # x [B, T, d], mask [B, 1, T, T] bool, pos [1, 2T - 1, d]
        b, n, _ = x.shape
        q, k, v = (lin(x).view(b, n, self.h, self.dk).transpose(1, 2) for lin in (self.linear_q, self.linear_k,
                                                                                     self.linear_v))
        p = self.linear_pos(pos).view(1, -1, self.h, self.dk).transpose(1, 2)  # [1, H, 2T - 1, dk]
        ac = torch.matmul(q + self.pos_bias_u[:, None], k.transpose(-2, -1))
        bd = rel_shift(torch.matmul(q + self.pos_bias_v[:, None], p.transpose(-2, -1)))
        scores = ((ac + bd) / math.sqrt(self.dk)).masked_fill(~mask, float("-inf"))
        attn = torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)
        return self.linear_out(torch.matmul(attn, v).transpose(1, 2).reshape(b, n, -1))


class _FeedForward(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(F.silu(self.w_1(x)))


class _ConformerLayer(nn.Module):
    """Pre-norm self-attention + feed-forward (the published config has no conv module and no macaron)."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        d = cfg.output_size
        self.self_attn = _RelSelfAttention(d, cfg.attention_heads)
        self.feed_forward = _FeedForward(d, cfg.linear_units)
        # upstream's ConformerEncoderLayer norms use eps=1e-12 (the embeddings' and after_norm's use 1e-5)
        self.norm_ff, self.norm_mha = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.norm_mha(x), mask, pos)
        return x + self.feed_forward(self.norm_ff(x))


class _Upsample(nn.Module):
    """``Upsample1D``: nearest x2, 4 zeros on the left, conv kernel 5."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(d, d, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, d] -> [B, 2T, d]
        h = x.transpose(1, 2).repeat_interleave(2, dim=2)
        return self.conv(F.pad(h, (4, 0))).transpose(1, 2)


class UpsampleConformerEncoder(nn.Module):
    def __init__(self, cfg: EncoderConfig, input_size: int, lookahead: int) -> None:
        super().__init__()
        d = cfg.output_size
        self.cfg = cfg
        self.embed = _LinearEmbed(input_size, d)
        self.pre_lookahead_layer = PreLookahead(d, d, lookahead)
        self.encoders = nn.ModuleList(_ConformerLayer(cfg) for _ in range(cfg.num_blocks))
        self.up_layer = _Upsample(d)
        self.up_embed = _LinearEmbed(input_size, d)
        self.up_encoders = nn.ModuleList(_ConformerLayer(cfg) for _ in range(4))
        self.after_norm = nn.LayerNorm(d, eps=1e-5)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None, streaming: bool) -> torch.Tensor:
        # x [1, N, input_size], context [1, lookahead, input_size] | None -> [1, 2N, d]
        d, chunk = self.cfg.output_size, self.cfg.static_chunk_size if streaming else 0
        h = self.embed(x)
        h = self.pre_lookahead_layer(h, None if context is None else self.embed(context))
        mask = chunk_attention_mask(h.new_ones(1, 1, h.shape[1]), chunk)
        pos = relative_positions(h.shape[1], d, h.device).to(h.dtype)
        for layer in self.encoders:
            h = layer(h, mask, pos)
        h = self.up_embed(self.up_layer(h))
        mask = chunk_attention_mask(h.new_ones(1, 1, h.shape[1]), 2 * chunk)
        pos = relative_positions(h.shape[1], d, h.device).to(h.dtype)
        for layer in self.up_encoders:
            h = layer(h, mask, pos)
        return self.after_norm(h)


# --- the U-Net estimator -----------------------------------------------------------------------------------

class _CausalConv(nn.Conv1d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T], left-padded
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class _Transpose(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2)


class _CausalBlock(nn.Module):
    """``CausalBlock1D``: causal conv k3, LayerNorm over channels, Mish; masked in and out."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.block = nn.Sequential(_CausalConv(cin, cout, 3), _Transpose(), nn.LayerNorm(cout), _Transpose(), nn.Mish())

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # [B, C, T], mask [B, 1, T]
        return self.block(x * mask) * mask


class _ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, time_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_dim, cout))
        self.block1, self.block2 = _CausalBlock(cin, cout), _CausalBlock(cout, cout)
        self.res_conv = nn.Conv1d(cin, cout, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.block1(x, mask) + self.mlp(t)[:, :, None]
        return self.block2(h, mask) + self.res_conv(x * mask)


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])  # upstream's to_out.1 is a Dropout

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:  # [B, T, C], [B, 1, T, T]
        b, n, _ = x.shape
        q, k, v = (lin(x).view(b, n, self.heads, -1).transpose(1, 2) for lin in (self.to_q, self.to_k, self.to_v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.to_out[0](out.transpose(1, 2).reshape(b, n, -1))


class _GeluProj(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.proj = nn.Linear(cin, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x))


class _TransformerBlock(nn.Module):
    """diffusers ``BasicTransformerBlock`` (layer norm, self-attention only, GELU feed-forward x4)."""

    def __init__(self, cfg: UNetConfig) -> None:
        super().__init__()
        c = cfg.channels
        self.norm1, self.norm3 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.attn1 = _Attention(c, cfg.num_heads, cfg.attention_head_dim)
        self.ff = nn.Module()
        self.ff.net = nn.Sequential(_GeluProj(c, 4 * c), nn.Identity(), nn.Linear(4 * c, c))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn1(self.norm1(x), mask)
        return x + self.ff.net(self.norm3(x))


class _TimeMLP(nn.Module):
    def __init__(self, cin: int, dim: int) -> None:
        super().__init__()
        self.linear_1, self.linear_2 = nn.Linear(cin, dim), nn.Linear(dim, dim)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(t)))


class UNetEstimator(nn.Module):
    """The velocity estimator ``(x, mask, mu, t, spks, cond) -> [B, 80, T]``."""

    row_segments = False  # takes no ``segments``: utterances solve one after another (TokenFlow.inference_rows)

    def __init__(self, cfg: UNetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        c, time_dim = cfg.channels, 4 * cfg.channels

        def stage(cin: int) -> list[nn.Module]:
            return [_ResnetBlock(cin, c, time_dim), nn.ModuleList(_TransformerBlock(cfg) for _ in range(cfg.n_blocks))]

        self.time_mlp = _TimeMLP(cfg.in_channels, time_dim)
        self.down_blocks = nn.ModuleList([nn.ModuleList([*stage(cfg.in_channels), _CausalConv(c, c, 3)])])
        self.mid_blocks = nn.ModuleList(nn.ModuleList(stage(c)) for _ in range(cfg.num_mid_blocks))
        self.up_blocks = nn.ModuleList([nn.ModuleList([*stage(2 * c), _CausalConv(c, c, 3)])])
        self.final_block = _CausalBlock(c, c)
        self.final_proj = nn.Conv1d(c, cfg.out_channels, 1)

    @staticmethod
    def _attend(blocks: nn.ModuleList, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        h = x.transpose(1, 2)
        for block in blocks:
            h = block(h, attn_mask)
        return h.transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, spks: torch.Tensor,
                cond: torch.Tensor, streaming: bool = False) -> torch.Tensor:
        # x, mu, cond [B, 80, T], mask [B, 1, T], t [B], spks [B, 80] -> [B, 80, T]
        temb = self.time_mlp(timestep_sinusoid(t, self.cfg.in_channels))
        h = torch.cat([x, mu, spks[:, :, None].expand(-1, -1, x.shape[2]), cond], dim=1)
        attn_mask = attention_mask(mask, self.cfg.static_chunk_size if streaming else 0)
        resnet, blocks, down = self.down_blocks[0]
        h = self._attend(blocks, resnet(h, mask, temb), attn_mask)
        skip = h
        h = down(h * mask)
        for resnet, blocks in self.mid_blocks:
            h = self._attend(blocks, resnet(h, mask, temb), attn_mask)
        resnet, blocks, up = self.up_blocks[0]
        h = torch.cat([h[:, :, : skip.shape[2]], skip], dim=1)
        h = up(self._attend(blocks, resnet(h, mask, temb), attn_mask) * mask)
        return self.final_proj(self.final_block(h, mask) * mask) * mask


class _Decoder(nn.Module):
    """Holds the estimator under upstream's ``decoder.estimator`` key prefix (the CFM has no weights)."""

    def __init__(self, cfg: UNetConfig) -> None:
        super().__init__()
        self.estimator = UNetEstimator(cfg)


class FlowCV2(TokenFlow):
    """``CausalMaskedDiffWithXvec`` for inference; see the module docstring."""

    kind = "cosyvoice2"

    def __init__(self, cfg: FlowCV2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
        self.encoder = UpsampleConformerEncoder(cfg.encoder, cfg.input_size, cfg.pre_lookahead_len)
        self.encoder_proj = nn.Linear(cfg.encoder.output_size, cfg.output_size)
        self.decoder = _Decoder(cfg.unet)

    def encode_tokens(self, emb: torch.Tensor, context: torch.Tensor | None, streaming: bool) -> torch.Tensor:
        # emb [1, N, 512], context [1, lookahead, 512] | None -> [1, 2N, 80]
        return self.encoder_proj(self.encoder(emb, context, streaming))
