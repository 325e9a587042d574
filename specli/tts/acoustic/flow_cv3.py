"""CosyVoice3 flow stage (inference only): speech tokens -> 80-bin mel at 50 frames/s.

A port of upstream's ``CausalMaskedDiffWithDiT`` (``cosyvoice/flow/flow.py``) with its
``PreLookaheadLayer`` (``transformer/upsample_encoder.py``) and DiT estimator (``flow/DiT/dit.py``,
``modules.py``, F5-TTS style), loading the official ``flow.pt``; module names follow upstream so the keys
load one to one:

- ``input_embedding`` (6561 x 80) of prompt tokens + tokens -> ``pre_lookahead_layer`` (conv over the
  token and the next 3, leaky ReLU, causal conv back to 80, residual) -> each frame repeated
  ``token_mel_ratio`` (2) times = ``mu``;
- the 192-d x-vector, L2-normalised, -> ``spk_embed_affine_layer`` -> 80;
- the prompt mel fills the first frames of the condition (zeros after it);
- :func:`specli.tts.acoustic.cfm.solve_cfm` with the DiT (dim 1024, depth 22, 16 heads of 64 in the published
  yaml): sinusoidal time embedding + MLP; input ``proj([x, cond, mu, spk])`` + causal grouped conv position
  embedding; blocks of adaLN-zero attention (x-transformers' rotary: adjacent channel pairs, on the first
  ``dim_head`` channels of the *un-split* query/key, as x-transformers applies it there) and tanh-GELU feed-forward; final adaLN + projection;
- the mel after the prompt frames is returned.

Rows of several utterances run together (``segments``, :class:`Spans`): the padded batch shares the
position-wise layers (every linear, norm and activation, whose rows do not depend on their neighbours), while
what mixes frames or reads the time embedding (attention, the conv position embedding, the adaLN
modulations) runs per utterance over its own frames, the very calls a batch of one makes: an utterance's mel
is then the same bits at any batch size (GEMMs of 12 rows or more give each row the same bits whatever the
row count on these CPUs; fewer rows may take another kernel, measured on a Xeon with AMX, so an utterance
whose own GEMMs would have fewer than :data:`SHARED_MIN_ROWS` rows is solved alone; tests/test_flow_batch.py
checks it).

Attention is full (upstream's offline ``tts``) or, with ``streaming=True``, chunk-causal over
``static_chunk_size`` (50) frames as upstream's streaming mode; with ``finalize=False`` the last 3 tokens
only serve as look-ahead context. Then the mel of a token prefix that ends on a chunk boundary (prompt
included) plus 3 context tokens equals the start of the mel of any longer sequence: what upstream's
streaming relies on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specli.tts.acoustic.cfm import CFMSettings, attention_mask, solve_cfm, timestep_sinusoid, yaml_args

__all__ = ["DiTConfig", "FlowCV3", "FlowCV3Config", "PreLookahead", "Spans", "TokenFlow"]

Spans = tuple[tuple[int, int, int], ...]  # (first row, end row, frames) of each utterance in a padded batch
#: An utterance shares a padded batch's position-wise GEMMs only when its own (CFG rows x frames) have at least
#: this many rows: below 12 rows oneDNN / MKL may pick a small-M kernel that rounds otherwise (a 1-token utterance,
#: 2 x 4 rows, differed by 3e-6 on a Sapphire Rapids Xeon).
SHARED_MIN_ROWS = 16


def spans_of(segments: Sequence[tuple[int, int]]) -> Spans:
    """The row spans of consecutive ``(rows, frames)`` segments: ``((0, r0, f0), (r0, r0 + r1, f1), ...)``."""
    out, lo = [], 0
    for rows, frames in segments:
        out.append((lo, lo + rows, frames))
        lo += rows
    return tuple(out)


def _per_span(layer: nn.Module, x: torch.Tensor, spans: Spans) -> torch.Tensor:
    """``layer`` on each span's rows and frames alone (``x [B, T, D]`` padded), zeros past each span's frames."""
    out: torch.Tensor | None = None
    for lo, hi, frames in spans:
        y = layer(x[lo:hi, :frames].contiguous())
        if out is None:
            out = y.new_zeros(x.shape[0], x.shape[1], y.shape[2])
        out[lo:hi, :frames] = y
    return out


@dataclass(frozen=True)
class DiTConfig:
    """The DiT estimator's shape (the yaml's ``estimator: !new:cosyvoice.flow.DiT.dit.DiT``)."""

    dim: int = 1024  # model width
    depth: int = 22  # DiT blocks
    heads: int = 16  # attention heads
    dim_head: int = 64  # width of a head (rotary covers this many channels)
    ff_mult: int = 2  # feed-forward expansion
    mel_dim: int = 80  # mel bins (x, cond and the output)
    mu_dim: int = 80  # width of mu (the token features)
    spk_dim: int = 80  # width of the projected speaker embedding
    static_chunk_size: int = 50  # streaming: frames per attention chunk (chunk_size 25 x token_mel_ratio 2)
    long_skip_connection: bool = False  # a Linear(2 dim, dim) over [x, input] after the blocks
    conv_pos_kernel: int = 31  # causal conv position embedding kernel
    conv_pos_groups: int = 16  # its groups

    def __post_init__(self) -> None:
        if min(self.dim, self.depth, self.heads, self.dim_head, self.ff_mult, self.mel_dim) < 1:
            raise ValueError("DiT sizes must be positive")
        if self.dim_head % 2:
            raise ValueError("dim_head must be even (rotary pairs)")
        if self.dim % self.conv_pos_groups or self.conv_pos_kernel % 2 == 0:
            raise ValueError("dim must be a multiple of conv_pos_groups and conv_pos_kernel odd")
        if self.static_chunk_size < 0:
            raise ValueError("static_chunk_size must be >= 0")


@dataclass(frozen=True)
class FlowCV3Config:
    """``CausalMaskedDiffWithDiT`` arguments that inference reads; defaults are the published ones."""

    vocab_size: int = 6561  # speech codes
    input_size: int = 80  # token embedding width
    output_size: int = 80  # mel bins
    spk_embed_dim: int = 192  # x-vector width
    token_mel_ratio: int = 2  # mel frames per token
    pre_lookahead_len: int = 3  # tokens the pre-lookahead conv looks ahead
    lookahead_channels: int = 1024  # pre-lookahead inner width
    dit: DiTConfig = field(default_factory=DiTConfig)  # the estimator
    cfm: CFMSettings = field(default_factory=CFMSettings)  # solver settings

    def __post_init__(self) -> None:
        if min(self.vocab_size, self.input_size, self.spk_embed_dim, self.token_mel_ratio) < 1:
            raise ValueError("flow sizes must be positive")
        if self.pre_lookahead_len < 1 or self.lookahead_channels < 1:
            raise ValueError("pre_lookahead_len and lookahead_channels must be positive")
        if self.output_size != self.dit.mel_dim or self.input_size != self.dit.mu_dim:
            raise ValueError("output_size must equal the DiT's mel_dim and input_size its mu_dim")
        if self.dit.spk_dim != self.output_size:
            raise ValueError("the speaker projection (output_size) must match the DiT's spk_dim")

    @classmethod
    def from_yaml(cls, node: Any) -> FlowCV3Config:
        """From the ``flow: !new:...CausalMaskedDiffWithDiT`` node (published values where absent)."""
        args = yaml_args(node)
        kwargs = {k: int(args[k]) for k in ("vocab_size", "input_size", "output_size", "spk_embed_dim",
                                            "token_mel_ratio", "pre_lookahead_len") if k in args}
        look = yaml_args(args.get("pre_lookahead_layer"))
        if "channels" in look:
            kwargs["lookahead_channels"] = int(look["channels"])
        if "pre_lookahead_len" in look:
            kwargs["pre_lookahead_len"] = int(look["pre_lookahead_len"])
        decoder = args.get("decoder")
        est = yaml_args(yaml_args(decoder).get("estimator"))
        names = ("dim", "depth", "heads", "dim_head", "ff_mult", "mel_dim", "mu_dim", "spk_dim", "static_chunk_size")
        dit = DiTConfig(**{k: int(est[k]) for k in names if k in est},
                        long_skip_connection=bool(est.get("long_skip_connection", False)))
        return cls(**kwargs, dit=dit, cfm=CFMSettings.from_yaml(decoder))

    def scaled(self, **dit: int) -> FlowCV3Config:
        """This configuration with other DiT sizes (tests, benchmarks)."""
        return replace(self, dit=replace(self.dit, **dit))


class PreLookahead(nn.Module):
    """Conv over each token and the next ``n`` (zero padded, or real context), leaky ReLU, causal conv, residual."""

    def __init__(self, cin: int, channels: int, lookahead: int) -> None:
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(cin, channels, lookahead + 1)
        self.conv2 = nn.Conv1d(channels, cin, 3)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:  # [B, N, C]
        h = x.transpose(1, 2)
        if context is None:
            h = F.pad(h, (0, self.lookahead))
        else:  # [B, lookahead, C] real future tokens instead of zeros
            h = torch.cat([h, context.transpose(1, 2)], dim=2)
        h = F.leaky_relu(self.conv1(h))
        h = self.conv2(F.pad(h, (2, 0)))
        return h.transpose(1, 2) + x


class _TimeEmbedding(nn.Module):
    """Sinusoidal embedding of ``1000 t`` (256 wide: sin | cos) then Linear-SiLU-Linear."""

    def __init__(self, dim: int, freq_dim: int = 256) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.time_mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:  # [B] -> [B, dim]
        return self.time_mlp(timestep_sinusoid(t, self.freq_dim))


class _CausalConvPosition(nn.Module):
    """Two left-padded grouped convs with Mish (``CausalConvPositionEmbedding``)."""

    def __init__(self, dim: int, kernel: int, groups: int) -> None:
        super().__init__()
        self.kernel = kernel
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, kernel, groups=groups), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, kernel, groups=groups), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D]
        h = self.conv1(F.pad(x.transpose(1, 2), (self.kernel - 1, 0)))
        h = self.conv2(F.pad(h, (self.kernel - 1, 0)))
        return h.transpose(1, 2)


class _InputEmbed(nn.Module):
    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.proj = nn.Linear(cfg.mel_dim * 2 + cfg.mu_dim + cfg.spk_dim, cfg.dim)
        self.conv_pos_embed = _CausalConvPosition(cfg.dim, cfg.conv_pos_kernel, cfg.conv_pos_groups)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, mu: torch.Tensor, spks: torch.Tensor,
                spans: Spans | None = None) -> torch.Tensor:
        # x, cond [B, T, 80], mu [B, T, mu_dim], spks [B, spk_dim] -> [B, T, dim]
        h = self.proj(torch.cat([x, cond, mu, spks[:, None].expand(-1, x.shape[1], -1)], dim=-1))
        pos = self.conv_pos_embed(h) if spans is None else _per_span(self.conv_pos_embed, h, spans)
        return pos + h


class _Rotary(nn.Module):
    """x-transformers' ``RotaryEmbedding`` (2.11.24, the version upstream pins); ``inv_freq`` is in ``flow.pt``.

    Each frequency covers two *adjacent* channels: angles ``[f0, f0, f1, f1, ...]`` (x-transformers stacks
    ``(freqs, freqs)`` on a last axis and flattens it), not the half-split ``[f0, f1, ..., f0, f1, ...]``.
    """

    def __init__(self, dim_head: int) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim_head, 2).float() / dim_head)))

    def forward(self, length: int) -> torch.Tensor:  # -> [T, dim_head] angles, each one twice in a row
        pos = torch.arange(length, device=self.inv_freq.device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq.float()[None]  # [T, dim_head / 2]
        return freqs.repeat_interleave(2, dim=-1)


def _apply_rotary(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``angles.shape[-1]`` channels of ``x [B, T, D]`` in adjacent pairs.

    x-transformers' ``apply_rotary_pos_emb`` / ``rotate_half``: each pair ``(x0, x1)`` turns by its angle,
    ``(x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)``; channels past the rotary width pass unchanged.
    """
    width = angles.shape[-1]
    head, rest = x[..., :width].float(), x[..., width:]
    pairs = head.unflatten(-1, (width // 2, 2))  # [B, T, width / 2, 2]
    turned = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)  # (x0, x1) -> (-x1, x0)
    rotated = head * angles.cos() + turned * angles.sin()
    return torch.cat([rotated.to(x.dtype), rest], dim=-1)


class _Attention(nn.Module):
    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        inner = cfg.heads * cfg.dim_head
        self.heads = cfg.heads
        self.to_q = nn.Linear(cfg.dim, inner)
        self.to_k = nn.Linear(cfg.dim, inner)
        self.to_v = nn.Linear(cfg.dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, cfg.dim)])  # upstream's to_out.1 is a Dropout

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, angles: torch.Tensor,
                spans: Spans | None = None) -> torch.Tensor:
        # x [B, T, dim], mask [B, 1, T, T] bool (key j visible from query i; None: all), angles [T, dim_head];
        # spans: attend within each utterance's rows and frames (mask ignored)
        q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        if spans is None:
            out = self.to_out[0](self._attend(q, k, v, mask, angles))
            if mask is None:
                return out
            return out.masked_fill(~mask[:, 0, -1, :, None], 0.0)  # upstream zeroes padded query rows
        heads = q.new_zeros(q.shape)  # [B, T, inner]: padded frames attend to nothing
        for lo, hi, frames in spans:
            part = (y[lo:hi, :frames].contiguous() for y in (q, k, v))
            heads[lo:hi, :frames] = self._attend(*part, None, angles[:frames])
        return self.to_out[0](heads)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                angles: torch.Tensor) -> torch.Tensor:
        # q, k, v [B, T, inner] before the rotary -> [B, T, inner] attention output (heads concatenated)
        b, n, _ = q.shape
        q, k = _apply_rotary(q, angles), _apply_rotary(k, angles)
        q, k, v = (y.view(b, n, self.heads, -1).transpose(1, 2) for y in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(b, n, -1)


class _FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int) -> None:
        super().__init__()
        # keys ff.0.0 / ff.2 as upstream (ff.1 is a Dropout there)
        self.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, dim * mult), nn.GELU(approximate="tanh")),
                                nn.Identity(), nn.Linear(dim * mult, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class _AdaNorm(nn.Module):
    """adaLN: ``linear(silu(t))`` -> ``chunks`` modulation vectors; a LayerNorm without affine weights."""

    def __init__(self, dim: int, chunks: int) -> None:
        super().__init__()
        self.chunks = chunks
        self.linear = nn.Linear(dim, dim * chunks)

    def forward(self, t: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [B, dim] -> chunks x [B, 1, dim]
        return tuple(c[:, None] for c in self.linear(F.silu(t)).chunk(self.chunks, dim=1))


def _norm(x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], eps=1e-6)


class _DiTBlock(nn.Module):
    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.attn_norm = _AdaNorm(cfg.dim, 6)
        self.attn = _Attention(cfg)
        self.ff = _FeedForward(cfg.dim, cfg.ff_mult)

    def forward(self, x: torch.Tensor, t: torch.Tensor | list[torch.Tensor], mask: torch.Tensor | None,
                angles: torch.Tensor, spans: Spans | None = None) -> torch.Tensor:
        # t: [B, dim] time embedding, or with spans each span's own [rows, dim]
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = _modulation(self.attn_norm, t)
        x = x + gate_a * self.attn(_norm(x) * (1 + scale_a) + shift_a, mask, angles, spans)
        return x + gate_f * self.ff(_norm(x) * (1 + scale_f) + shift_f)


def _modulation(norm: _AdaNorm, t: torch.Tensor | list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """``norm(t)``; for a list (one time embedding a span) each span's alone, rows concatenated: a span's
    modulation is then the few-row GEMM a batch of one computes."""
    if isinstance(t, torch.Tensor):
        return norm(t)
    return tuple(torch.cat(chunks, dim=0) for chunks in zip(*(norm(part) for part in t)))


class DiT(nn.Module):
    """The velocity estimator ``(x, mask, mu, t, spks, cond) -> [B, 80, T]``."""

    row_segments = True  # takes ``segments``: several utterances in one padded batch (TokenFlow.inference_rows)

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.time_embed = _TimeEmbedding(cfg.dim)
        self.input_embed = _InputEmbed(cfg)
        self.rotary_embed = _Rotary(cfg.dim_head)
        self.transformer_blocks = nn.ModuleList(_DiTBlock(cfg) for _ in range(cfg.depth))
        if cfg.long_skip_connection:
            self.long_skip_connection = nn.Linear(cfg.dim * 2, cfg.dim, bias=False)
        self.norm_out = _AdaNorm(cfg.dim, 2)
        self.proj_out = nn.Linear(cfg.dim, cfg.mel_dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, spks: torch.Tensor,
                cond: torch.Tensor, streaming: bool = False,
                segments: Sequence[tuple[int, int]] | None = None) -> torch.Tensor:
        # x, cond [B, 80, T], mask [B, 1, T], mu [B, mu_dim, T], t [B], spks [B, spk_dim] -> [B, 80, T];
        # segments: (rows, frames) of each utterance, in row order (full attention within each; mask unused)
        spans = None if segments is None else spans_of(segments)
        if spans is not None and streaming:
            raise ValueError("row segments are for offline (full attention) inference")
        temb = self.time_embed(t) if spans is None else [self.time_embed(t[lo:hi]) for lo, hi, _ in spans]
        h = self.input_embed(x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2), spks, spans)
        residual = h
        attn_mask = None if spans else attention_mask(mask, self.cfg.static_chunk_size if streaming else 0)
        angles = self.rotary_embed(h.shape[1])
        for block in self.transformer_blocks:
            h = block(h, temb, attn_mask, angles, spans)
        if self.cfg.long_skip_connection:
            h = self.long_skip_connection(torch.cat([h, residual], dim=-1))
        scale, shift = _modulation(self.norm_out, temb)
        return self.proj_out(_norm(h) * (1 + scale) + shift).transpose(1, 2)


class _Decoder(nn.Module):
    """Holds the estimator under upstream's ``decoder.estimator`` key prefix (the CFM has no weights)."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.estimator = DiT(cfg)


class TokenFlow(nn.Module):
    """The inference both flows share: token embedding, speaker projection and the prompt-conditioned CFM solve.

    A subclass sets ``cfg`` (``pre_lookahead_len``, ``token_mel_ratio``, ``output_size``, ``cfm``), the layers
    ``input_embedding``, ``spk_embed_affine_layer`` and ``decoder.estimator``, and defines :meth:`encode_tokens`.
    """

    cfg: Any

    @property
    def token_mel_ratio(self) -> int:
        return self.cfg.token_mel_ratio

    def encode_tokens(self, emb: torch.Tensor, context: torch.Tensor | None, streaming: bool) -> torch.Tensor:
        """``emb [1, N, C]`` (``context [1, lookahead, C]``: real future tokens, or None) -> ``mu [1, T, 80]``."""
        raise NotImplementedError(f"{type(self).__name__} must define encode_tokens")

    @torch.inference_mode()
    def inference(self, tokens: torch.Tensor, prompt_tokens: torch.Tensor, prompt_mel: torch.Tensor,
                  embedding: torch.Tensor, streaming: bool = False, finalize: bool = True) -> torch.Tensor:
        """Mel ``[1, 80, 2 N]`` (``N`` tokens; ``N - 3`` with ``finalize=False``) after the prompt.

        ``tokens [1, N]``, ``prompt_tokens [1, P]`` int, ``prompt_mel [1, 2P, 80]`` (may be empty),
        ``embedding [1, 192]`` (zeros: no speaker).
        """
        mu, spks, cond, prompt_frames = self._conditions(tokens, prompt_tokens, prompt_mel, embedding, streaming,
                                                         finalize)
        mask = mu.new_ones(1, 1, mu.shape[2])
        mel = solve_cfm(self.decoder.estimator, mu, mask, spks, cond, self.cfg.cfm, streaming=streaming)
        return mel[:, :, prompt_frames:]

    @torch.inference_mode()
    def inference_rows(self, rows: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
                       ) -> list[torch.Tensor]:
        """:meth:`inference` (offline) of several utterances ``(tokens, prompt_tokens, prompt_mel, embedding)``
        together: one padded CFM solve when the estimator takes row segments (the DiT; each mel the same bits
        as alone), else one after another; an utterance too short to share GEMMs (:data:`SHARED_MIN_ROWS`) alone."""
        if not self.decoder.estimator.row_segments or len(rows) == 1:
            return [self.inference(*row) for row in rows]
        per = 2 if self.cfg.cfm.inference_cfg_rate > 0 else 1  # estimator rows an utterance (CFG: 2)
        ratio = self.cfg.token_mel_ratio  # an utterance's frames: ratio x (prompt tokens + tokens)
        shared = [i for i, (tokens, prompt, _, _) in enumerate(rows)
                  if per * ratio * (prompt.shape[1] + tokens.shape[1]) >= SHARED_MIN_ROWS]
        shared = shared if len(shared) >= 2 else []
        out = {i: self.inference(*row) for i, row in enumerate(rows) if i not in shared}
        if shared:
            conds = [self._conditions(*rows[i], streaming=False, finalize=True) for i in shared]
            out.update(zip(shared, self._solve_padded(conds)))
        return [out[i] for i in range(len(rows))]

    def _solve_padded(self, conds: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]
                      ) -> list[torch.Tensor]:
        """One padded CFM solve of several utterances' :meth:`_conditions` (row segments); each mel after its prompt."""
        lengths = [mu.shape[2] for mu, _, _, _ in conds]
        width = max(lengths)

        def padded(k: int) -> torch.Tensor:  # [N, C, width] of the k-th condition of every row
            return torch.cat([F.pad(c[k], (0, width - c[k].shape[2])) for c in conds], dim=0)

        mask = torch.stack([(torch.arange(width) < n).to(conds[0][0].dtype) for n in lengths])[:, None]
        mel = solve_cfm(self.decoder.estimator, padded(0), mask.to(conds[0][0].device),
                        torch.cat([c[1] for c in conds], dim=0), padded(2), self.cfg.cfm, lengths=lengths)
        return [mel[i : i + 1, :, c[3] : n] for i, (c, n) in enumerate(zip(conds, lengths))]

    def _conditions(self, tokens: torch.Tensor, prompt_tokens: torch.Tensor, prompt_mel: torch.Tensor,
                    embedding: torch.Tensor, streaming: bool, finalize: bool
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """``(mu [1, 80, T], spks [1, 80], cond [1, 80, T], prompt frames)`` of one utterance."""
        cfg, param = self.cfg, self.spk_embed_affine_layer.weight
        device, dtype = param.device, param.dtype
        spks = self.spk_embed_affine_layer(F.normalize(embedding.to(device, dtype), dim=1))
        ids = torch.cat([prompt_tokens.to(device).long(), tokens.to(device).long()], dim=1)
        emb = self.input_embedding(ids.clamp(min=0))  # [1, P + N, C]
        if finalize:
            mu = self.encode_tokens(emb, None, streaming)
        else:
            look = cfg.pre_lookahead_len
            mu = self.encode_tokens(emb[:, :-look], emb[:, -look:], streaming)
        prompt_frames, frames = prompt_mel.shape[1], mu.shape[1]
        cond = mu.new_zeros(1, frames, cfg.output_size)
        cond[:, :prompt_frames] = prompt_mel.to(device, dtype)
        return mu.transpose(1, 2).contiguous(), spks, cond.transpose(1, 2).contiguous(), prompt_frames


class FlowCV3(TokenFlow):
    """``CausalMaskedDiffWithDiT`` for inference; see the module docstring."""

    kind = "cosyvoice3"

    def __init__(self, cfg: FlowCV3Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
        self.pre_lookahead_layer = PreLookahead(cfg.input_size, cfg.lookahead_channels, cfg.pre_lookahead_len)
        self.decoder = _Decoder(cfg.dit)

    def encode_tokens(self, emb: torch.Tensor, context: torch.Tensor | None, streaming: bool) -> torch.Tensor:
        # emb [1, N, C], context [1, lookahead, C] | None -> [1, T, C] (streaming: no effect here)
        return self.pre_lookahead_layer(emb, context=context).repeat_interleave(self.cfg.token_mel_ratio, dim=1)
