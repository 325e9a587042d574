"""Shared parts of the target-neutral block drafters (DSpark, DFlash, EAGLE-3).

A drafter here reads any :class:`~specli.core.types.DraftableTarget` (a CosyVoice LM, an audio-LLM target, a plain
Qwen2 decoder): its auxiliary hidden states, its input embedding and its vocabulary head. Everything a trainer needs
is on :class:`SpeechDraftModule`:

* ``module.config`` -- a frozen :class:`SpeechDraftConfig` (sizes, auxiliary layers and their
  convention, block size, Markov rank, draft vocabulary size ...);
* ``module.forward_train(context, input_ids, anchors)`` -> :class:`DraftTrainOutput`: logits over the
  draft vocabulary for every (anchor, slot) and the position of the token each slot predicts (the
  target's distribution for that token is its logits row ``position - 1``);
* ``module.draft_ids`` -- target id of each draft-vocabulary row (``to_draft_rows`` maps back);
* :func:`~specli.core.drafters.llm.speculators.save_speculators` / ``load_speech_drafter`` -- the speculators format (config.json +
  model.safetensors; see :mod:`specli.core.drafters.llm.speculators`).

Positions and features. ``context [B, T, n_aux * H]`` is the concatenation of the target's auxiliary
hidden states at positions ``0 .. T-1`` (row ``t`` = the state after reading ``input_ids[:, t]``), in
the order of ``config.aux_layers``; ``input_ids [B, T]`` are the target's *input* ids (for CosyVoice:
input-layout ids, whose speech ids equal the output ids). Layer ids follow ``config.aux_convention``:
``"input"`` = the input of block ``i`` (vLLM / SGLang / speculators capture; ``hidden_states[i]``),
``"output"`` = the output of block ``i`` (SpecForge / z-lab; ``hidden_states[i + 1]``).
:func:`target_layer_ids` turns them into the ids :class:`~specli.models.qwen2.Qwen2Target`
takes (``aux_layers``, input convention).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from specli.core.types import DraftableTarget, TargetParts

DrafterKind = Literal["dspark", "dflash", "eagle3"]
AuxConvention = Literal["input", "output"]
KINDS: tuple[str, ...] = ("dspark", "dflash", "eagle3")


def target_layer_ids(ids: Sequence[int], convention: AuxConvention) -> tuple[int, ...]:
    """Layer ids in the target's (input) convention: ``hidden_states[i]`` for input, ``[i + 1]`` for output."""
    if convention not in ("input", "output"):
        raise ValueError(f"unknown aux layer convention {convention!r} (input, output)")
    return tuple(int(i) + (1 if convention == "output" else 0) for i in ids)


def default_aux_layers(kind: DrafterKind, target_layers: int, n: int = 3) -> tuple[tuple[int, ...], AuxConvention]:
    """Published defaults: DFlash evenly spaced from 1 to L-3 (layer outputs, z-lab); DSpark /
    EAGLE-3 speculators' ``[2, L // 2, L - 3]`` (layer inputs, as vLLM captures them)."""
    L = target_layers
    if kind == "dflash":
        if n == 1:
            return (L // 2,), "output"
        start, end = min(1, L - 1), max(L - 3, min(1, L - 1))  # tiny targets: clamp into 0 .. L-1
        return tuple(int(round(start + i * (end - start) / (n - 1))) for i in range(n)), "output"
    return (min(2, L), L // 2, max(L - 3, 0)), "input"


@dataclass(frozen=True)
class SpeechDraftConfig:
    """Sizes and conventions of one block drafter (what config.json stores)."""

    kind: DrafterKind  # dspark / dflash / eagle3
    hidden: int  # draft width (= the target's hidden size)
    layers: int  # draft decoder layers (EAGLE-3: 1)
    heads: int  # query heads
    kv_heads: int  # key/value heads
    head_dim: int  # width of one head
    intermediate: int  # MLP width
    target_vocab: int  # rows of the target's head (output ids 0 .. target_vocab-1)
    draft_vocab: int  # rows of the draft vocabulary (== target_vocab: the whole vocabulary)
    aux_layers: tuple[int, ...]  # target layers read, in aux_convention
    aux_convention: AuxConvention = "input"  # input (vLLM capture) or output (SpecForge / z-lab)
    target_hidden: int = 0  # target width if it differs from hidden (0 = same)
    block_size: int = 8  # slots per draft forward (DSpark: B drafts; DFlash: B - 1; EAGLE-3: most steps)
    mask_token_id: int = 0  # input id whose embedding fills the masked slots (DSpark / DFlash)
    sample_from_anchor: bool = False  # slot k predicts anchor + k + 1 (DSpark) instead of anchor + k (DFlash)
    markov_rank: int = 0  # DSpark Markov head rank (0 = none)
    confidence_head: bool = False  # DSpark acceptance predictor on [hidden; Markov embedding]
    qk_norm: bool = True  # per-head RMSNorm of q and k (Qwen3 layers); EAGLE-3 (Llama layer): False
    rms_eps: float = 1e-6  # RMSNorm epsilon
    rope_theta: float = 1000000.0  # RoPE base
    max_positions: int = 32768  # positions the RoPE tables may reach
    head_bias: bool = False  # the target's head has a bias (CosyVoice2's llm_decoder), kept in the draft head
    eagle_zero_row: bool = True  # EAGLE-3: a draft row for position 0 ([embed(x_0); 0], specli's training); False:
    # rows start at position 1 (SpecForge / SGLang: row t is [embed(x_{t+1}); g_t]), position 0 is never attended
    extra: dict = field(default_factory=dict, compare=False)  # free-form metadata (token layout, training)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown drafter kind {self.kind!r} ({', '.join(KINDS)})")
        if self.aux_convention not in ("input", "output"):
            raise ValueError(f"unknown aux layer convention {self.aux_convention!r}")
        if self.heads % self.kv_heads or min(self.hidden, self.layers, self.head_dim, self.intermediate) < 1:
            raise ValueError("invalid draft layer sizes")
        if not 1 <= self.draft_vocab <= self.target_vocab:
            raise ValueError("draft_vocab must be within 1..target_vocab")
        if self.block_size < 2 or self.markov_rank < 0 or not self.aux_layers:
            raise ValueError("block_size >= 2, markov_rank >= 0 and at least one aux layer are required")
        if self.kind == "eagle3" and len(self.aux_layers) != 3:
            raise ValueError("EAGLE-3 reads exactly three auxiliary layers")
        object.__setattr__(self, "aux_layers", tuple(int(i) for i in self.aux_layers))

    @property
    def context_width(self) -> int:
        """Width of one position's concatenated auxiliary features."""
        return len(self.aux_layers) * (self.target_hidden or self.hidden)

    @property
    def drafts_per_block(self) -> int:
        """Draft tokens one block forward yields."""
        return self.block_size if self.sample_from_anchor else self.block_size - 1

    def target_layers(self) -> tuple[int, ...]:
        """``aux_layers`` in the target's convention (:func:`target_layer_ids`)."""
        return target_layer_ids(self.aux_layers, self.aux_convention)

    def with_(self, **changes) -> SpeechDraftConfig:
        return replace(self, **changes)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[..., n, head_dim]`` for ``positions [..., n]``."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=positions.device) / head_dim))
    freqs = positions[..., None].float() * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class DraftAttention(nn.Module):
    """q/k/v/o projections (+ Qwen3 per-head q/k norms); speculators key names under ``self_attn``."""

    def __init__(self, cfg: SpeechDraftConfig, in_dim: int) -> None:
        super().__init__()
        hd = cfg.head_dim
        self.q_proj = nn.Linear(in_dim, cfg.heads * hd, bias=False)
        self.k_proj = nn.Linear(in_dim, cfg.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(in_dim, cfg.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.heads * hd, cfg.hidden, bias=False)
        if cfg.qk_norm:
            self.q_norm, self.k_norm = RMSNorm(hd, cfg.rms_eps), RMSNorm(hd, cfg.rms_eps)
        else:
            self.q_norm = self.k_norm = None


class DraftMLP(nn.Module):
    def __init__(self, cfg: SpeechDraftConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """A pre-norm decoder layer: Qwen3 (q/k norms; DSpark / DFlash) or EAGLE-3's Llama layer, whose
    input is ``[embedding; hidden]`` (``2H``, normed by ``input_layernorm`` / ``hidden_norm``).

    Queries come from the layer input; keys/values are ``[prefix; k(input)]`` where the prefix is a
    context (DFlash / DSpark: the projected target features) or a cache of earlier rows.
    """

    def __init__(self, cfg: SpeechDraftConfig, eagle: bool = False) -> None:
        super().__init__()
        h = cfg.hidden
        self.cfg, self.eagle = cfg, eagle
        self.input_layernorm = RMSNorm(h, cfg.rms_eps)
        self.hidden_norm = RMSNorm(h, cfg.rms_eps) if eagle else None
        self.self_attn = DraftAttention(cfg, 2 * h if eagle else h)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_eps)
        self.mlp = DraftMLP(cfg)

    def normed(self, x: torch.Tensor) -> torch.Tensor:
        """The attention input: ``input_layernorm(x)``, or EAGLE-3's ``[norm(embed); norm(hidden)]``."""
        if not self.eagle:
            return self.input_layernorm(x)
        h = self.cfg.hidden
        return torch.cat([self.input_layernorm(x[..., :h]), self.hidden_norm(x[..., h:])], -1)

    def kv(self, xn: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated keys and values ``[B, H_kv, n, D]`` of normed inputs ``xn [B, n, in_dim]``; cos/sin ``[B, n, D]``."""
        b, n, _ = xn.shape
        att, hd = self.self_attn, self.cfg.head_dim
        k = att.k_proj(xn).view(b, n, -1, hd)
        if att.k_norm is not None:
            k = att.k_norm(k)
        v = att.v_proj(xn).view(b, n, -1, hd).transpose(1, 2)
        return apply_rope(k.transpose(1, 2), cos[:, None], sin[:, None]), v

    def forward(self, x: torch.Tensor, residual: torch.Tensor, k_pre: torch.Tensor | None, v_pre: torch.Tensor | None,
                mask: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [B, n, in_dim]``, ``residual [B, n, H]``, ``cos/sin [B, n, D]``, ``mask [B or 1, n, P + n]``
        bool over ``[prefix; x]`` (None: all visible). Returns (out ``[B, n, H]``, k, v of ``x``)."""
        cfg, att = self.cfg, self.self_attn
        b, n, _ = x.shape
        xn = self.normed(x)
        q = att.q_proj(xn).view(b, n, cfg.heads, cfg.head_dim)
        if att.q_norm is not None:
            q = att.q_norm(q)
        q = apply_rope(q.transpose(1, 2), cos[:, None], sin[:, None])  # [B, H, n, D]
        k, v = self.kv(xn, cos, sin)
        k_all = k if k_pre is None else torch.cat([k_pre, k], 2)
        v_all = v if v_pre is None else torch.cat([v_pre, v], 2)
        # grouped-query attention inside SDPA (no repeated copies of the context's K/V)
        a = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=None if mask is None else mask[:, None],
                                           enable_gqa=cfg.heads != cfg.kv_heads)
        h = residual + att.o_proj(a.transpose(1, 2).reshape(b, n, -1))
        return h + self.mlp(self.post_attention_layernorm(h)), k, v


@dataclass
class DraftTrainOutput:
    """One training forward (teacher-forced).

    ``logits[b, a, s]`` is slot ``s`` of block/anchor ``a``: draft-vocabulary logits (the Markov
    bias included for DSpark) for the token at input position ``positions[b, a, s]`` (``-1``: no
    loss for that slot, e.g. DFlash's slot 0 or a block running past the sequence). The target's
    distribution for that token is its logits row ``positions - 1``. ``confidence`` (DSpark with a
    confidence head): acceptance logits ``[B, A, S]`` (before sigmoid).
    """

    logits: torch.Tensor  # [B, A, S, draft_vocab]
    positions: torch.Tensor  # [B, A, S] long
    confidence: torch.Tensor | None = None  # [B, A, S]


class SpeechDraftModule(nn.Module):
    """Base of the three drafters: config, draft vocabulary, frozen target embedding and head."""

    config: SpeechDraftConfig

    def __init__(self, config: SpeechDraftConfig, parts: TargetParts, draft_ids: torch.Tensor | None = None) -> None:
        super().__init__()
        if parts.vocab != config.target_vocab:
            raise ValueError(f"drafter built for a {config.target_vocab}-row head, target has {parts.vocab}")
        if (config.target_hidden or config.hidden) != parts.hidden:
            raise ValueError(f"drafter reads width {config.target_hidden or config.hidden}, target has {parts.hidden}")
        self.config = config
        self.parts = parts  # plain attribute: not a submodule, not saved
        self._ident: bool | None = None  # whether draft_ids are 0..V-1 (found on first use, after loading)
        dev = parts.device
        if draft_ids is None:
            draft_ids = torch.arange(config.draft_vocab, device=dev)
        draft_ids = draft_ids.to(dev).long()
        if draft_ids.numel() != config.draft_vocab:
            raise ValueError(f"{draft_ids.numel()} draft ids for a draft vocabulary of {config.draft_vocab}")
        self.register_buffer("draft_ids", draft_ids.clone())  # [Vd] target id of each draft row
        t2d = torch.full((config.target_vocab,), -1, dtype=torch.long, device=dev)
        t2d[draft_ids] = torch.arange(config.draft_vocab, device=dev)
        self.register_buffer("t2d_rows", t2d, persistent=False)  # [V] draft row of each target id, -1 outside
        w = parts.head_weight.detach().float()[draft_ids]
        self.register_buffer("head_w", w.contiguous(), persistent=False)  # [Vd, H] frozen head rows
        b = parts.head_bias
        self.register_buffer("head_b", None if b is None else b.detach().float()[draft_ids].contiguous(),
                             persistent=False)  # [Vd] or None

    # -- shared pieces -----------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The target's (frozen) input embedding, float32: ``[...] -> [..., H]``."""
        with torch.no_grad():
            return self.parts.embed(ids).float()

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of normed states ``[..., H] -> [..., Vd]`` (the target's head rows)."""
        return F.linear(h, self.head_w, self.head_b if self.config.head_bias else None)

    def to_draft_rows(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Draft row of each target id (``-1`` outside the draft vocabulary)."""
        return self.t2d_rows[target_ids]

    def scatter_full(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits ``[..., Vd]`` -> target vocabulary ``[..., V]`` (``-inf`` outside)."""
        if self.config.draft_vocab == self.config.target_vocab and self._identity_vocab():
            return draft_logits
        full = draft_logits.new_full((*draft_logits.shape[:-1], self.config.target_vocab), float("-inf"))
        return full.index_copy_(-1, self.draft_ids, draft_logits)

    def _identity_vocab(self) -> bool:
        cached = self._ident
        if cached is None:
            ids = self.draft_ids
            cached = bool(torch.equal(ids, torch.arange(ids.numel(), device=ids.device)))
            self._ident = cached
        return cached

    # -- the training interface (each drafter implements it) ---------------------------------------
    def forward_train(self, context: torch.Tensor, input_ids: torch.Tensor,
                      anchors: torch.Tensor | None = None) -> DraftTrainOutput:
        """Teacher-forced logits; ``context [B, T, n_aux*H]``, ``input_ids [B, T]``, ``anchors [B, A]``
        (block drafters: positions whose token fills slot 0; EAGLE-3: ignored, every position)."""
        raise NotImplementedError

def anchor_positions(anchors: torch.Tensor, slots: int, offset: int, length: int) -> torch.Tensor:
    """Positions predicted by each slot: ``anchor + slot + offset``, ``-1`` past ``length``. [B, A, S]"""
    pos = anchors[..., None] + torch.arange(slots, device=anchors.device) + offset
    return torch.where(pos < length, pos, torch.full_like(pos, -1))


def init_linear(module: nn.Module, std: float = 0.02, seed: int | None = None) -> None:
    """Normal(0, std) weights for the trainable linear/embedding layers (zeros for biases)."""
    g = None if seed is None else torch.Generator(device="cpu").manual_seed(seed)
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            with torch.no_grad():
                w = torch.randn(m.weight.shape, generator=g, device="cpu") * std
                m.weight.copy_(w.to(m.weight.device))
                if isinstance(m, nn.Linear) and m.bias is not None:
                    m.bias.zero_()


def attach_aux_layers(target: DraftableTarget, config: SpeechDraftConfig) -> tuple[int, ...]:
    """Have ``target`` return the drafter's auxiliary layers (in its convention) as well as those it already returns
    (:meth:`~specli.core.types.DraftableTarget.request_aux_layers`); the layer ids this drafter picks."""
    want = config.target_layers()
    try:
        return target.request_aux_layers(want)
    except ValueError as exc:
        raise ValueError(f"drafter reads target layers {list(want)} ({config.aux_convention} convention); {exc}") \
            from exc
