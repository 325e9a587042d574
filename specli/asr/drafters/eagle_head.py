"""EAGLE-ASR Speech-Draft head: a one-block drafter that reads the target's own hidden states (the module,
its checkpoint format and loading; :mod:`specli.asr.drafters.eagle` drafts with it).

Design (issue "EAGLE-ASR Speech-Draft drafter"):

* **First step.** The target state that predicted the pending token is fused from three depths,
  ``f = fuse([LN(low); LN(mid); LN(last)])`` (Linear 3d -> d; the head's own LayerNorms, because
  Whisper's intermediate residual streams are large and made the first AdamW steps diverge), then
  combined with the embedding of the pending token, ``x = combine([f; e(pending)])`` (Linear 2d -> d).
  ``e(t)`` is the target's frozen token embedding plus its frozen positional embedding at the token's
  decoder position, exactly what the target's own decoder reads.
* **Later steps.** ``x = combine([LN(h); e(draft)])`` with ``h`` the head's own previous output
  (the block's residual stream, before the output norm). The first step and the later steps share
  ``combine``: the fused target state plays the role of the head's "previous hidden state".
* **Block.** One pre-norm Transformer decoder block: causal self-attention over the head's own
  draft steps (a small preallocated :class:`~specli.core.kv_cache.KVCache`, reset every
  proposal), cross-attention to the target's encoder output (K/V once per window), an MLP.
* **Output.** The head's own trainable LayerNorm (initialised from the target's final layer norm)
  then the target's frozen vocabulary projection: ``logits = proj_out(ln_out(h))`` (as EAGLE, the
  target's LM head reads a state in the space of its final-normed hidden state).
* **Draft vocabulary** (EAGLE-3). The projection keeps only the rows of ``vocab_ids`` (the tokens
  the target emitted most often in the training data, plus every special and timestamp token):
  on this CPU Whisper's 51,865-row projection is most of a step, and 8k rows cost a sixth of it.
  The drafter applies the shared logit filter inside the draft vocabulary (``filter_logits(...,
  vocab=)``: the full filter restricted to those columns), so a token outside the draft vocabulary
  is never proposed; only sampling mode scatters a node's distribution ``q`` into the full
  vocabulary for rejection sampling. The target still verifies over its full vocabulary, so
  decoding stays lossless.
* **Inference.** :class:`EagleDrafter` runs a packed copy of the head (``packed_for_inference``: the
  target's oneDNN layout) in the target's dtype, or in bfloat16 under a float32 target on a CPU
  with native bf16 (a step is the head's matrices streamed from memory), cross-attention K/V once
  per window, the step's index tensors preallocated (``benchmarks/profile_draft_step.py``).
  ``torch.compile`` of the step (Inductor, weights frozen) measured no faster than this eager
  packed step, so it is not used.

Token embedding, positional embedding and LM head are shared with the target, frozen, and never
stored in the head's checkpoint (non-persistent buffers, passed in at load).
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from specli.models.layers import Int8Linear, Linear, cross_attention
from specli.models.whisper.target import WhisperDims, WhisperTarget
from specli.errors import ModelLoadError
from specli.io.atomic import write_atomic
from specli.io.locate import Lookup, locate

FORMAT = "specli-eagle-head/1"
MAX_STEPS = 32  # draft steps the head's self-attention cache holds (max_draft is capped at 24)


def target_fingerprint(dims: WhisperDims) -> str:
    """A short hash of the target's architecture and vocabulary (what a head depends on)."""
    return hashlib.sha256(json.dumps(asdict(dims), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class EagleConfig:
    """Sizes of a Speech-Draft head and the target it was built for."""

    d_model: int  # hidden size (= the target decoder's)
    heads: int  # attention heads of the block
    ffn: int  # MLP hidden size
    vocab: int  # vocabulary size of the shared LM head
    text_ctx: int  # decoder positions of the shared positional embedding
    target_model: str  # name of the target it was trained against (informative)
    target_fingerprint: str  # target_fingerprint(dims) of that target (checked at load)
    max_steps: int = MAX_STEPS  # draft steps per proposal the self-attention cache holds
    draft_vocab: int = 0  # rows of the draft vocabulary (0 = the whole vocabulary)

    @classmethod
    def for_target(cls, target: WhisperTarget, name: str, draft_vocab: int = 0) -> EagleConfig:
        d = target.dims
        ffn = target.dec_blocks[-1].fc1.out_features  # as the target's layers (4 * d_model in Whisper)
        return cls(d.d_model, d.decoder_heads, ffn, d.vocab, d.text_ctx, name, target_fingerprint(d),
                   draft_vocab=draft_vocab)


def draft_vocabulary(counts: torch.Tensor, size: int, first_special: int) -> torch.Tensor:
    """Token ids of a draft vocabulary of ``size`` rows: every id from ``first_special`` on (special
    and timestamp tokens), then the most frequent other ids of ``counts [V]``; sorted ascending."""
    vocab = counts.numel()
    special = torch.arange(first_special, vocab, device=counts.device)
    room = max(size - special.numel(), 0)
    text = counts[:first_special].float().topk(min(room, first_special)).indices
    return torch.cat([text, special]).sort().values


class SpeechDraftHead(nn.Module):
    """Fusion layers + one decoder block + output norm; the target's embeddings and LM head frozen."""

    def __init__(self, cfg: EagleConfig, target: WhisperTarget, vocab_ids: torch.Tensor | None = None) -> None:
        super().__init__()
        d = cfg.d_model
        if vocab_ids is None:
            vocab_ids = torch.arange(cfg.vocab, device=target.device)
        if vocab_ids.numel() != (cfg.draft_vocab or cfg.vocab):
            raise ValueError(f"draft vocabulary has {vocab_ids.numel()} ids, config says {cfg.draft_vocab}")
        self.cfg = cfg
        self.ln_fuse = nn.ModuleList(nn.LayerNorm(d) for _ in range(3))  # low / mid residual streams are large
        self.fuse = nn.Linear(3 * d, d)
        self.ln_rec = nn.LayerNorm(d)  # the head's own residual stream, before it re-enters
        self.combine = nn.Linear(2 * d, d)
        self.ln_self, self.ln_cross, self.ln_mlp = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.cross_q, self.cross_kv_proj, self.cross_out = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, cfg.ffn), nn.Linear(cfg.ffn, d)
        self.ln_out = nn.LayerNorm(d)
        with torch.no_grad():
            self.ln_out.weight.copy_(target.dec_ln[0].float())
            self.ln_out.bias.copy_(target.dec_ln[1].float())
        # frozen and read-only: shared with an fp32 target, not copied
        self.register_buffer("embed", target.embed.detach().float(), persistent=False)  # [V, d]
        self.register_buffer("dec_pos", target.dec_pos.detach().float(), persistent=False)  # [ctx, d]
        self.register_buffer("vocab_ids", vocab_ids.to(target.device).long().clone())  # [Vd] draft row -> token id
        to_draft = torch.full((cfg.vocab,), -100, dtype=torch.long, device=target.device)
        to_draft[self.vocab_ids] = torch.arange(self.vocab_ids.numel(), device=target.device)
        self.register_buffer("to_draft", to_draft, persistent=False)  # [V] target token id -> draft row or -100
        self.lm_head = FrozenLinear(target.proj_out.weight.detach()[self.vocab_ids])  # [Vd, d], not stored
        self.to(target.device)  # the trainable layers join the target's device (shared tables stay shared)

    @classmethod
    def for_target(cls, target: WhisperTarget, name: str, vocab_ids: torch.Tensor | None = None) -> SpeechDraftHead:
        """A fresh head for ``target`` over the draft vocabulary ``vocab_ids`` (None = the whole one)."""
        rows = 0 if vocab_ids is None or vocab_ids.numel() == target.dims.vocab else vocab_ids.numel()
        return cls(EagleConfig.for_target(target, name, rows), target, vocab_ids)

    @torch.no_grad()
    def init_from_target(self, target: WhisperTarget) -> SpeechDraftHead:
        """Start the block from the target's last decoder layer (same shapes: self-attention,
        cross-attention, MLP and their norms), so the head reads the audio from its first step."""
        blk = target.dec_blocks[-1]

        def bias(lin) -> torch.Tensor:
            return torch.zeros(lin.out_features, device=target.device) if lin.bias is None else lin.bias.float()

        a, c = blk.self_attn, blk.cross_attn
        self.qkv.weight.copy_(torch.cat([a[n].weight.float() for n in ("q", "k", "v")]))
        self.qkv.bias.copy_(torch.cat([bias(a[n]) for n in ("q", "k", "v")]))
        pairs = [(self.out, a["out"]), (self.cross_q, c["q"]), (self.cross_out, c["out"]),
                 (self.fc1, blk.fc1), (self.fc2, blk.fc2)]
        for mine, theirs in pairs:
            mine.weight.copy_(theirs.weight.float())
            mine.bias.copy_(bias(theirs))
        self.cross_kv_proj.weight.copy_(torch.cat([c["k"].weight.float(), c["v"].weight.float()]))
        self.cross_kv_proj.bias.copy_(torch.cat([bias(c["k"]), bias(c["v"])]))
        for ln, (w, b) in ((self.ln_self, blk.self_ln), (self.ln_cross, blk.cross_ln), (self.ln_mlp, blk.final_ln)):
            ln.weight.copy_(w.float())
            ln.bias.copy_(b.float())
        return self

    def embed_tokens(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The target's input embedding: token + position, ``[...] -> [..., d]``."""
        return self.embed[tokens] + self.dec_pos[positions.clamp(max=self.cfg.text_ctx - 1)]

    def first_input(self, low, mid, last, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Step one: fuse the target's states ``[..., d]`` x3, combine with the pending token."""
        dt = self.ln_rec.weight.dtype  # float32 when training; the target's dtype in a packed inference copy
        fused = self.fuse(torch.cat([ln(h.to(dt)) for ln, h in zip(self.ln_fuse, (low, mid, last))], -1))
        return self.combine(torch.cat([fused, self.embed_tokens(tokens, positions).to(dt)], -1))

    def next_input(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Later steps: the head's own previous output with the previous draft token."""
        return self.combine(torch.cat([self.ln_rec(hidden), self.embed_tokens(tokens, positions).to(hidden.dtype)], -1))

    def cross_kv(self, audio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention K/V of a window's encoder output ``[B, A, d]`` -> ``[B, H, A, hd]`` x2."""
        k, v = self.cross_kv_proj(audio.to(self.ln_rec.weight.dtype)).chunk(2, -1)
        return _heads(k, self.cfg.heads), _heads(v, self.cfg.heads)

    def block(
        self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None, cross: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None = None,  # [B, S, k + S] bool: tree ancestry (True = may attend), or None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step for ``[B, S, d]`` independent drafts (S per window); ``past`` is ``[B*S, H, k, hd]``.

        Returns the block output ``[B, S, d]`` and this step's self-attention K/V ``[B*S, H, 1, hd]``.
        With ``mask``, the S rows are nodes of one draft tree per batch row, expanded in one forward:
        ``past`` is ``[B, H, k, hd]`` (the tree's expanded nodes so far), row ``i`` attends to the
        slots where ``mask[:, i]`` is True (its ancestors, then itself), and K/V are ``[B, H, S, hd]``.
        """
        b, s, d = x.shape
        h = self.cfg.heads
        rows, n = (b * s, 1) if mask is None else (b, s)
        q, k, v = (t.reshape(rows, n, h, d // h).transpose(1, 2) for t in self.qkv(self.ln_self(x)).chunk(3, -1))
        k_all, v_all = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        att = F.scaled_dot_product_attention(  # [B*S, H, 1, hd], or [B, H, S, hd] with a mask
            q, k_all, v_all, attn_mask=None if mask is None else mask[:, None])
        x = x + self.out(att.transpose(1, 2).reshape(b, s, d))
        cq = _heads(self.cross_q(self.ln_cross(x)), h)  # [B, H, S, hd]
        ca = cross_attention(cq, *cross)
        x = x + self.cross_out(ca.transpose(1, 2).reshape(b, s, d))
        x = x + self.fc2(F.gelu(self.fc1(self.ln_mlp(x))))
        return x, k, v

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Shared, frozen LM head rows of the draft vocabulary: ``[..., d] -> [..., Vd]``."""
        return self.lm_head(self.ln_out(hidden))

    def full_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits in the target's vocabulary, ``-inf`` outside the draft vocabulary: ``[..., V]``."""
        small = self.logits(hidden)
        if small.shape[-1] == self.cfg.vocab:
            return small
        full = small.new_full((*small.shape[:-1], self.cfg.vocab), float("-inf"))
        return full.index_copy_(-1, self.vocab_ids, small)


class FrozenLinear(nn.Module):
    """``x @ W.T`` with a frozen weight kept as a non-persistent buffer (the target's LM-head rows)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight.float().contiguous(), persistent=False)  # [out, in]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class PackedLinear(nn.Module):
    """Inference only: a trained linear layer in ``dtype`` through the target's oneDNN fast path
    (``layers.Linear``: on this CPU plain ``F.linear`` runs one row single-threaded), or with ``int8`` its
    matrix int8 weight-only (``layers.Int8Linear``, quantised from the float32 weight; activations in ``dtype``)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, int8: bool = False) -> None:
        super().__init__()
        bias = _cast(bias, dtype)
        w = weight.detach()
        self.linear = Int8Linear(w.float(), bias, dtype) if int8 else Linear(w.to(dtype), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def packed_for_inference(head: SpeechDraftHead, dtype: torch.dtype = torch.float32,
                         int8: bool = False) -> SpeechDraftHead:
    """A copy of ``head`` in eval mode whose linear layers and LM head run through ``PackedLinear``
    in ``dtype`` (its layer norms too; float32: same results to ~1e-6 relative), their matrices int8
    weight-only with ``int8`` (all but ``cross_kv_proj``: once per window over 1,500 frames, a
    compute-bound product where oneDNN's bf16 GEMM took 3.5 ms and the int8 kernel 10.8). The frozen
    embedding tables stay shared (float32; a step's one embedding row is cast). The packed copy cannot
    be trained or saved."""
    shared = {id(t): t for t in (head.embed, head.dec_pos)}  # frozen tables: shared, not copied
    fast = copy.deepcopy(head, memo=shared).eval()
    for name, module in list(fast.named_children()):
        if isinstance(module, (nn.Linear, FrozenLinear)):
            bias = module.bias if isinstance(module, nn.Linear) else None
            setattr(fast, name, PackedLinear(module.weight, bias, dtype, int8 and name != "cross_kv_proj"))
        elif isinstance(module, (nn.LayerNorm, nn.ModuleList)):
            module.to(dtype)
    return fast


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.detach().to(dtype)


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, n, d = x.shape
    return x.view(b, n, heads, d // heads).transpose(1, 2)


def save_head(head: SpeechDraftHead, out: str | Path, training: dict | None = None) -> Path:
    """Write ``model.safetensors`` (the head's own weights only) and ``config.json``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # fp16 on disk (half the size; a drafter's rounding cannot change the lossless output), fp32 in memory
    state = {k: (v.half() if v.is_floating_point() else v).detach().contiguous()
             for k, v in head.state_dict().items()}
    save_file(state, str(out / "model.safetensors"))
    meta = {"format": FORMAT, "config": asdict(head.cfg), "training": training or {}}
    write_atomic(out / "config.json", json.dumps(meta, indent=2, sort_keys=True))
    return out


def _head_missing(path: Path) -> list[str]:
    return [f for f in ("config.json", "model.safetensors") if not (path / f).is_file()]


def resolve_head(name_or_path: str) -> Path:
    """A head directory by path, a head shipped with specli (``specli/heads/<name>``), or one found offline by
    :func:`~specli.io.locate.locate` (``$SPECLI_MODELS_DIR/<name>``, the local Hugging Face cache)."""
    shipped = Path(str(resources.files("specli") / "heads" / name_or_path))
    return locate(name_or_path, Lookup("EAGLE head", required=_head_missing, shipped=(shipped,)))


def load_head(name_or_path: str | Path, target: WhisperTarget) -> SpeechDraftHead:
    """Load a head for ``target``; refuses a head trained against another architecture or vocabulary."""
    path = resolve_head(str(name_or_path))
    try:
        meta = json.loads((path / "config.json").read_text())
        weights = load_file(str(path / "model.safetensors"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"EAGLE head {path}: cannot read config.json / model.safetensors: {exc}") from exc
    if meta.get("format") != FORMAT:
        raise ModelLoadError(f"EAGLE head {path}: unknown format {meta.get('format')!r}")
    cfg = EagleConfig(**meta["config"])
    if cfg.target_fingerprint != target_fingerprint(target.dims):
        raise ModelLoadError(
            f"EAGLE head {path} was trained for {cfg.target_model!r} (fingerprint {cfg.target_fingerprint}), "
            f"which does not match this target (fingerprint {target_fingerprint(target.dims)})"
        )
    head = SpeechDraftHead(cfg, target, weights.get("vocab_ids"))
    head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in weights.items()}, strict=True)
    head.to(target.device)
    return head.eval()
