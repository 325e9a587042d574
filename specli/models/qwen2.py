"""Lean Qwen2 / Qwen3 (/ Qwen3-MoE) decoder target built for draft-and-verify (same contract as the Whisper
target).

A decoder-only transformer (GQA attention with q/k/v biases (Qwen2) or per-head q/k RMSNorm and an explicit
``head_dim`` (Qwen3), RoPE, RMSNorm, SwiGLU MLP or a sparse mixture of experts (:mod:`specli.models.moe`))
over a preallocated, position-indexed :class:`~specli.core.kv_cache.KVCache`. One
:meth:`Qwen2Target.score` forward takes a chain or a tree of tokens (explicit positions and tree
mask), given as token ids or directly as input embeddings (CosyVoice feeds embeddings built from
several tables), and returns float32 logits plus hidden states.

Hidden states. ``low`` / ``mid`` / ``last`` follow the Whisper target (output of block 0, of block
``(L - 1) // 2``, and the final normed state). ``aux`` holds the layers a drafter asked for at
construction (``aux_layers``), numbered like Hugging Face's ``hidden_states`` tuple and vLLM /
speculators' EAGLE-3 ``aux_hidden_state_layers``: layer id ``i`` is the *input* of block ``i``,
i.e. ``0`` the embeddings and ``i >= 1`` the output of block ``i - 1`` (``L`` = output of the last
block, before the final norm). The speculators default for a 24-block model is ``(2, 12, 21)``.

GQA without copying K/V: the query heads that share one K/V head are folded into the query-length
axis (``[B, H_kv, groups * n, D]``), so attention reads the cache as stored. Matrix products go
through the oneDNN-packed :class:`~specli.models.layers.Linear` (q/k/v fused into one
product, gate/up into another).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specli.core.goodput import MoEProfile
from specli.core.kv_cache import KVCache, RaggedKVCache, RowPlan, attend_by_rows, row_plan
from specli.models.layers import Linear
from specli.models.moe import MoE
from specli.core.types import HiddenStates, ScoreOutput, TargetParts


@dataclass(frozen=True)
class MoEDims:
    """Routing of sparse MoE blocks (transformers' ``TopKRouter``)."""

    top_k: int  # experts per token (num_experts_per_tok)
    norm_topk_prob: bool  # the top-k probabilities renormalised to sum to one


@dataclass(frozen=True)
class Qwen2Dims:
    """Architecture sizes, read from a Hugging Face ``config.json``."""

    vocab: int  # rows of the token embedding
    hidden: int  # model width
    layers: int  # decoder blocks
    heads: int  # query heads
    kv_heads: int  # key/value heads (GQA groups = heads // kv_heads)
    head_dim: int  # width of one head
    intermediate: int  # MLP width
    rope_theta: float  # RoPE base
    rms_eps: float  # RMSNorm epsilon
    max_positions: int  # longest sequence the config allows
    tie_embeddings: bool  # the LM head shares the token embedding
    moe: MoEDims = MoEDims(0, True)  # sparse MoE blocks' routing (Qwen3-MoE / Omni thinker; dense: unused)

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.heads} query heads are not a multiple of {self.kv_heads} KV heads")

    @classmethod
    def from_hf_config(cls, cfg: dict) -> Qwen2Dims:
        if cfg.get("use_sliding_window"):
            raise ValueError("sliding-window attention is not supported (use_sliding_window is true)")
        heads = cfg["num_attention_heads"]
        return cls(
            vocab=cfg["vocab_size"],
            hidden=cfg["hidden_size"],
            layers=cfg["num_hidden_layers"],
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate=cfg["intermediate_size"],
            rope_theta=rope_theta(cfg),
            rms_eps=cfg.get("rms_norm_eps", 1e-6),
            max_positions=cfg.get("max_position_embeddings", 32768),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            moe=MoEDims(cfg.get("num_experts_per_tok") or 0, bool(cfg.get("norm_topk_prob", True))),
        )


def rope_theta(cfg: dict) -> float:
    """RoPE base: transformers-4 ``rope_theta`` or transformers-5 ``rope_parameters``."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise ValueError(f"RoPE type {kind!r} is not supported (only the default RoPE)")
    if "rope_theta" in params:
        return float(params["rope_theta"])
    return float(cfg.get("rope_theta", 10000.0))


@dataclass(frozen=True)
class Qwen2State:
    """A decoder-only target's per-sequence state: the self-attention cache alone."""

    cache: KVCache | RaggedKVCache  # a batch state (start_batch) holds one row per slot

    @property
    def length(self) -> int:
        return self.cache.length


class _Block:
    """One pre-norm Qwen2 / Qwen3 block: fused q/k/v, (Qwen3: RMSNorm of each q and k head), output projection,
    fused gate/up, down."""

    def __init__(self, w: dict, prefix: str, dtype: torch.dtype, moe: MoEDims) -> None:
        a = f"{prefix}.self_attn"
        self.ln1 = w[f"{prefix}.input_layernorm.weight"].to(dtype)
        self.ln2 = w[f"{prefix}.post_attention_layernorm.weight"].to(dtype)
        parts = [w[f"{a}.{n}_proj.weight"].to(dtype) for n in ("q", "k", "v")]
        biases = [w.get(f"{a}.{n}_proj.bias") for n in ("q", "k", "v")]
        bias = None if any(b is None for b in biases) else torch.cat(biases).to(dtype)
        self.qkv = Linear(torch.cat(parts), bias)
        self.split = [p.shape[0] for p in parts]
        self.o = Linear.from_weights(w, f"{a}.o_proj", dtype)
        q_norm, k_norm = w.get(f"{a}.q_norm.weight"), w.get(f"{a}.k_norm.weight")  # Qwen3 (None: Qwen2)
        self.q_norm = None if q_norm is None else q_norm.to(dtype)
        self.k_norm = None if k_norm is None else k_norm.to(dtype)
        m = f"{prefix}.mlp"
        self.moe = None  # a sparse MoE block (its router's weight present) instead of the dense MLP
        if f"{m}.gate.weight" in w:
            self.moe = MoE(w, m, dtype, moe.top_k, moe.norm_topk_prob)
            return
        gate, up = w[f"{m}.gate_proj.weight"].to(dtype), w[f"{m}.up_proj.weight"].to(dtype)
        self.gate_up = Linear(torch.cat([gate, up]), None)
        self.width = gate.shape[0]
        self.down = Linear.from_weights(w, f"{m}.down_proj", dtype)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.moe is not None:
            return self.moe(x)
        gate, up = self.gate_up(x).split([self.width, self.width], dim=-1)
        return self.down(F.silu(gate) * up)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen2 RMSNorm: normalise in float32, cast back, then scale (as transformers does)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Qwen2Target:
    """Qwen2 decoder with a static cache. Stateless apart from its weights.

    ``weights`` use Hugging Face ``Qwen2ForCausalLM`` names under ``prefix`` (``model.`` for a
    plain checkpoint). ``head`` replaces the vocabulary projection (CosyVoice's speech head);
    by default it is ``lm_head`` (or the tied embedding).
    """

    def __init__(self, dims: Qwen2Dims, weights: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32,
                 *, prefix: str = "model.", head: Linear | None = None, aux_layers: Sequence[int] = (),
                 device: torch.device | str = "cpu") -> None:
        self.dims, self.dtype = dims, dtype
        # half precision: a scored chain or tree attends row by row, as one-token steps do (bit-equal logits)
        self.exact_rows = dtype in (torch.bfloat16, torch.float16)
        self.device = torch.device(device)  # weights, caches and decode tensors live there (head: the caller's)
        weights = {k: v.to(self.device) for k, v in weights.items() if k.startswith((prefix, "lm_head."))}
        if any(not 0 <= i <= dims.layers for i in aux_layers):
            raise ValueError(f"aux layers {list(aux_layers)} outside 0..{dims.layers}")
        self.aux_layers = tuple(aux_layers)  # layer ids (0 = embeddings, i = output of block i - 1)
        self.embed_tokens = weights[f"{prefix}embed_tokens.weight"].to(dtype)  # [vocab, hidden]
        self.blocks = [_Block(weights, f"{prefix}layers.{i}", dtype, dims.moe) for i in range(dims.layers)]
        self.norm = weights[f"{prefix}norm.weight"].to(dtype)
        if head is None:
            w = weights.get("lm_head.weight", self.embed_tokens if dims.tie_embeddings else None)
            if w is None:
                raise ValueError("no lm_head.weight and the config does not tie embeddings")
            bias = weights.get("lm_head.bias")
            head = Linear(w.to(dtype), None if bias is None else bias.to(dtype))
        self.head = head
        self.mid_layer = (dims.layers - 1) // 2
        self.inv_freq = 1.0 / (dims.rope_theta ** (
            torch.arange(0, dims.head_dim, 2, dtype=torch.float, device=self.device) / dims.head_dim))

    @classmethod
    def from_dir(cls, path: str | Path, dtype: torch.dtype = torch.float32, aux_layers: Sequence[int] = (),
                 device: torch.device | str = "cpu") -> Qwen2Target:
        """Load a Hugging Face ``Qwen2ForCausalLM`` directory (``config.json`` + ``*.safetensors``)."""
        from safetensors.torch import load_file

        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        weights: dict[str, torch.Tensor] = {}
        for f in sorted(path.glob("*.safetensors")):
            weights.update(load_file(str(f)))
        return cls(Qwen2Dims.from_hf_config(cfg), weights, dtype, aux_layers=aux_layers, device=device)

    @property
    def has_moe(self) -> bool:
        """Whether any block is a sparse mixture of experts."""
        return any(blk.moe is not None for blk in self.blocks)

    def moe_profile(self) -> MoEProfile | None:
        """Routing and the experts' share of the weights a one-token forward reads (None: a dense decoder): what
        the goodput rule scales a verification's cost by (:class:`specli.core.goodput.MoECosts`)."""
        moes = [blk.moe for blk in self.blocks if blk.moe is not None]
        if not moes:
            return None
        d = self.dims
        attention = d.hidden * d.head_dim * 2 * (d.heads + d.kv_heads)  # q, k, v, o
        experts = moes[0].router.shape[0]
        dense = (self.head.out_features * self.head.in_features + d.layers * attention
                 + (d.layers - len(moes)) * 3 * d.hidden * d.intermediate + len(moes) * experts * d.hidden)
        active = sum(m.top_k * 3 * d.hidden * m.width for m in moes)  # top_k experts' gate, up and down
        return MoEProfile(experts, d.moe.top_k, len(moes), active / (active + dense))

    def experts_touched(self) -> int:
        """Distinct experts the last forward touched, summed over the MoE blocks (0 for a dense decoder)."""
        return sum(blk.moe.experts_touched for blk in self.blocks if blk.moe is not None)

    # ---- the draftable-target protocol (core/types.DraftableTarget): what block drafters read
    def draft_parts(self, embed: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    mask_token_id: int | None = None) -> TargetParts:
        """Sizes, head and ``embed`` (default: :meth:`embed`) for a drafter; the mask token defaults to the last id."""
        d = self.dims
        return TargetParts(hidden=d.hidden, layers=d.layers, vocab=self.head.out_features,
                           embed=self.embed if embed is None else embed, head_weight=self.head.weight,
                           head_bias=self.head.bias, heads=d.heads, kv_heads=d.kv_heads, head_dim=d.head_dim,
                           intermediate=d.intermediate, rms_eps=d.rms_eps, rope_theta=d.rope_theta,
                           max_positions=d.max_positions,
                           mask_token_id=d.vocab - 1 if mask_token_id is None else mask_token_id, device=self.device)

    def request_aux_layers(self, layers: Sequence[int]) -> tuple[int, ...]:
        """Return the states of ``layers`` too from now on (after those already returned); the ids asked for."""
        want = tuple(int(i) for i in layers)
        if any(not 0 <= i <= self.dims.layers for i in want):
            raise ValueError(f"the target has {self.dims.layers} blocks")
        self.aux_layers = (*self.aux_layers, *(i for i in want if i not in self.aux_layers))
        return want

    def token_layout(self, record: dict) -> None:
        """A plain decoder has its native ids only."""
        return None

    def start(self, max_len: int, batch: int = 1, device: torch.device | str | None = None) -> Qwen2State:
        """An empty state whose cache holds ``max_len`` positions (on the target's device by default)."""
        d = self.dims
        dev = self.device if device is None else device
        return Qwen2State(KVCache(d.layers, batch, d.kv_heads, max_len, d.head_dim, self.dtype, dev))

    # ---- the batch contract (core/batched.py): slots of one preallocated state, rows [0, B) score
    def start_batch(self, capacity: int, max_len: int | None, spare: int = 0) -> Qwen2State:
        """An empty state of ``capacity`` slots, each ``max_len`` positions (+ ``spare`` padding slots)."""
        d = self.dims
        if max_len is None or not 0 < max_len <= d.max_positions:
            raise ValueError(f"a batch needs max_len within 1..{d.max_positions} (prompt + new tokens of a row)")
        return Qwen2State(RaggedKVCache(d.layers, capacity, d.kv_heads, max_len, d.head_dim, spare, self.dtype,
                                        self.device))

    def admit(self, state: Qwen2State, slot: int, context: None = None) -> None:
        """Slot ``slot`` starts a new sequence (a decoder-only LM has no per-row context: the prompt is it)."""
        if context is not None:
            raise ValueError("a decoder-only target takes no context (prefill the prompt instead)")
        state.cache.set_length(slot, 0)

    def row_state(self, state: Qwen2State, slot: int, context: None = None) -> Qwen2State:
        """Slot ``slot`` as a batch-1 state over the same memory (prefill of the row's prompt)."""
        return Qwen2State(state.cache.row(slot))

    def move(self, state: Qwen2State, src: int, dst: int) -> None:
        """Copy slot ``src`` into slot ``dst`` (the batch stays compacted when a row leaves)."""
        state.cache.move(src, dst)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token embeddings ``[B, n, hidden]`` of ids ``tokens [B, n]``."""
        return self.embed_tokens[tokens]

    @torch.inference_mode()
    def score(
        self,
        state: Qwen2State,
        tokens: torch.Tensor | None,  # [B, n] token ids (or None when ``embeds`` is given)
        positions: torch.Tensor | None = None,  # [B, n] positions; default length + arange(n)
        tree_mask: torch.Tensor | None = None,  # [B, n, n] bool, True where node i may see node j
        embeds: torch.Tensor | None = None,  # [B, n, hidden] input embeddings instead of token ids
        logit_rows: Sequence[int] | None = None,  # rows whose logits are returned; None: all n
    ) -> ScoreOutput:
        """One forward over a chain (default, causal) or a tree; K/V of all ``n`` inputs are appended.

        The caller keeps what it accepts with ``state.cache.crop`` / ``state.cache.compact``. On a batch
        state (:meth:`start_batch`) rows ``[0, B)`` score, each at its own length (and RoPE position),
        and the lengths stay for the caller to set.
        """
        x = (self.embed(tokens) if embeds is None else embeds).to(self.dtype)  # [B, n, hidden]
        cache, (b, n) = state.cache, x.shape[:2]
        if positions is None:
            positions = cache.positions(b, n, x.device)
        cos, sin = self._rope(positions)  # [B, 1, n, head_dim] each
        mask = cache.begin(b, n, tree_mask, x.device)
        exact = self._exact_rows(mask, n, tree_mask is not None)
        states = {0: x}
        low = mid = x
        for i, blk in enumerate(self.blocks):
            x = self._block(blk, i, x, cache, mask, cos, sin, exact)
            states[i + 1] = x
            if i == 0:
                low = x
            if i == self.mid_layer:
                mid = x
        cache.end(n)
        last = rms_norm(x, self.norm, self.dims.rms_eps)
        logits = self.head(last).float()  # [B, n, vocab]: every row, so bf16 rows round as in a full forward
        if logit_rows is not None:
            logits = logits[:, list(logit_rows)]  # [B, len(logit_rows), vocab]
        return ScoreOutput(logits, HiddenStates(low, mid, last, tuple(states[i] for i in self.aux_layers),
                                                 self.aux_layers))

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq.to(positions.device)  # [B, n, D/2]
        emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)  # [B, 1, n, D]
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def _block(self, blk: _Block, i: int, x, cache: KVCache | RaggedKVCache, mask, cos, sin,
               exact: list[int | torch.Tensor] | None = None) -> torch.Tensor:
        d = self.dims
        b, n, _ = x.shape
        q, k, v = blk.qkv(rms_norm(x, blk.ln1, d.rms_eps)).split(blk.split, dim=-1)
        q = q.view(b, n, d.heads, d.head_dim).transpose(1, 2)  # [B, H, n, D]
        k = k.view(b, n, d.kv_heads, d.head_dim).transpose(1, 2)  # [B, H_kv, n, D]
        v = v.view(b, n, d.kv_heads, d.head_dim).transpose(1, 2)
        if blk.q_norm is not None:  # Qwen3: over each head's width, before RoPE
            q, k = rms_norm(q, blk.q_norm, d.rms_eps), rms_norm(k, blk.k_norm, d.rms_eps)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k_all, v_all = cache.update(i, k, v)  # [B, H_kv, T, D]
        if exact is None:
            a = self._attend(q, k_all, v_all, mask)  # [B, H, n, D]
        else:  # query r of row b alone over its own keys, unmasked: a batch-1 one-token step's call
            a = attend_by_rows(q, k_all, v_all, exact, lambda qr, kr, vr: self._attend(qr, kr, vr, None))
        a = a.transpose(1, 2).reshape(b, n, d.heads * d.head_dim)
        x = x + blk.o(a)
        return x + blk.mlp(rms_norm(x, blk.ln2, d.rms_eps))

    def _exact_rows(self, mask: torch.Tensor | None, n: int, tree: bool) -> RowPlan | None:
        """Half precision after a prefix: ``(batch rows, per query row the keys it attends to)`` for row-by-row
        attention, each query computed exactly as a batch-1 one-token step computes it (so verification and
        batched rows equal AR at batch 1 bit for bit); None for masked SDPA (float32, or a prefill into an empty
        cache: the same call in every decoding mode)."""
        if not self.exact_rows or mask is None or mask.shape[-1] <= n:
            return None
        return row_plan(mask, tree)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Grouped-query attention of ``q [B, H, n, D]`` over ``k``/``v [B, H_kv, T, D]`` -> ``[B, H, n, D]``."""
        d = self.dims
        b, _, n, _ = q.shape
        groups = d.heads // d.kv_heads
        qg = q.reshape(b, d.kv_heads, groups * n, d.head_dim)  # query heads of one group share K/V
        mg = None if mask is None else mask.expand(-1, groups, -1, -1).reshape(mask.shape[0], 1, groups * n, -1)
        a = F.scaled_dot_product_attention(qg, k, v, attn_mask=mg)  # [B, H_kv, groups * n, D]
        return a.view(b, d.heads, n, d.head_dim)
