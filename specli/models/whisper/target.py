"""Lean Whisper target built for draft-and-verify.

The encoder runs once per 30-second window. The decoder keeps a preallocated, position-indexed
self-attention cache (:class:`~specli.core.kv_cache.KVCache`) and the cross-attention keys and
values of the window, computed once by :meth:`WhisperTarget.start`. One :meth:`WhisperTarget.score`
forward takes a chain or a tree of candidate tokens (explicit positions and tree mask) and returns
logits plus the low / middle / last decoder hidden states that drafters read.

Weights use Hugging Face ``WhisperForConditionalGeneration`` names, loaded from a directory that
:func:`specli.models.whisper.resolve.resolve_model` returns.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from specli.core.device import activation_dtype
from specli.core.kv_cache import KVCache, RaggedKVCache, RowPlan, attend_by_rows, row_plan
from specli.core.types import HiddenStates, ScoreOutput
from specli.models.whisper.compiled import CompiledEncoder, compile_encoder
from specli.models.whisper.encoder import EncoderFusions, WhisperEncoder
from specli.models.whisper.encoder import merge_heads as _merge_heads, split_heads as _split_heads
from specli.models.layers import Int8Linear, Linear, cross_attention, layer_norm

N_FRAMES = 3000  # mel frames in one 30-second window


@dataclass(frozen=True)
class WhisperDims:
    """Architecture sizes, read from a Hugging Face ``config.json``."""

    n_mels: int  # mel bins of the input features (80 or 128)
    vocab: int  # vocabulary size
    d_model: int  # hidden size of encoder and decoder
    encoder_layers: int  # encoder blocks
    encoder_heads: int  # encoder attention heads
    decoder_layers: int  # decoder blocks
    decoder_heads: int  # decoder attention heads
    audio_ctx: int  # encoder positions per window (1500)
    text_ctx: int  # decoder positions (448)

    @classmethod
    def from_hf_config(cls, cfg: dict) -> WhisperDims:
        return cls(
            n_mels=cfg["num_mel_bins"],
            vocab=cfg["vocab_size"],
            d_model=cfg["d_model"],
            encoder_layers=cfg["encoder_layers"],
            encoder_heads=cfg["encoder_attention_heads"],
            decoder_layers=cfg["decoder_layers"],
            decoder_heads=cfg["decoder_attention_heads"],
            audio_ctx=cfg.get("max_source_positions", 1500),
            text_ctx=cfg.get("max_target_positions", 448),
        )


@dataclass(frozen=True)
class DecoderState:
    """Whisper's per-window decoder state (a :class:`~specli.core.types.TargetState`): the
    self-attention cache and the window's cross-attention K/V."""

    audio_features: torch.Tensor  # [batch, audio_ctx, d_model] encoder output
    cross_kv: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per layer ([B, H, audio_ctx, D],) * 2
    cache: KVCache | RaggedKVCache  # a batch state (start_batch) holds one row per slot
    features: torch.Tensor | None = None  # [batch, n_mels, 3000] the window's input (for drafters)

    @property
    def length(self) -> int:
        return self.cache.length


@dataclass(frozen=True)
class CrossAttention:
    """What :meth:`WhisperTarget.cross_attention_weights` returns."""

    weights: torch.Tensor  # [batch, n_heads, n, n_frames] float32, softmax over the encoder positions
    logits: torch.Tensor  # [batch, n, vocab] float32, the same forward's logits


def default_alignment_heads(dims: WhisperDims) -> tuple[tuple[int, int], ...]:
    """Every head of the second half of the decoder layers (openai-whisper's default)."""
    first = dims.decoder_layers // 2
    return tuple((layer, head) for layer in range(first, dims.decoder_layers) for head in range(dims.decoder_heads))


def _read_alignment_heads(path: Path, dims: WhisperDims) -> tuple[tuple[int, int], ...]:
    """``alignment_heads`` of ``generation_config.json`` (official repos carry them), else the default."""
    gen_path = path / "generation_config.json"
    heads = json.loads(gen_path.read_text()).get("alignment_heads") if gen_path.is_file() else None
    if not heads:
        return default_alignment_heads(dims)
    return tuple((int(layer), int(head)) for layer, head in heads)


def _int8(w: dict[str, torch.Tensor], prefix: str, dtype: torch.dtype) -> Int8Linear:
    """Weight-only int8 layer ``prefix`` of the float32 weights ``w``, activations in ``dtype``; the kernel runs
    in bfloat16 either way (its float32 variant measured 8-30x slower: ``layers.Int8Linear``)."""
    bias = w.get(f"{prefix}.bias")
    return Int8Linear(w[f"{prefix}.weight"], None if bias is None else bias.float(), dtype,
                      kernel_dtype=torch.bfloat16)


def _attn_proj(w: dict, prefix: str, dtype: torch.dtype, int8: dict | None = None) -> dict[str, Linear | Int8Linear]:
    """q, k, v, out projections; with ``int8`` (the float32 weights) q and out are int8, and k, v too unless this
    is cross-attention (its k, v run once a window over 1,500 rows, where oneDNN's float GEMM is faster)."""
    cross = prefix.endswith("encoder_attn")
    return {
        name: _int8(int8, f"{prefix}.{name}_proj", dtype) if int8 is not None and not (cross and name in ("k", "v"))
        else Linear.from_weights(w, f"{prefix}.{name}_proj", dtype)
        for name in ("q", "k", "v", "out")
    }


class _Block:
    """One pre-norm Transformer block (self-attention, optional cross-attention, MLP); ``int8`` (the float32
    weights) makes its matrices weight-only int8 (all but cross-attention's k, v)."""

    def __init__(self, w: dict, prefix: str, dtype: torch.dtype, cross: bool, int8: dict | None = None) -> None:
        self.self_attn = _attn_proj(w, f"{prefix}.self_attn", dtype, int8)
        self.self_ln = (w[f"{prefix}.self_attn_layer_norm.weight"], w[f"{prefix}.self_attn_layer_norm.bias"])
        self.cross_attn = _attn_proj(w, f"{prefix}.encoder_attn", dtype, int8) if cross else None
        if cross:
            self.cross_ln = (
                w[f"{prefix}.encoder_attn_layer_norm.weight"],
                w[f"{prefix}.encoder_attn_layer_norm.bias"],
            )
        self.fc1, self.fc2 = (Linear.from_weights(w, f"{prefix}.{n}", dtype) if int8 is None
                              else _int8(int8, f"{prefix}.{n}", dtype) for n in ("fc1", "fc2"))
        self.final_ln = (w[f"{prefix}.final_layer_norm.weight"], w[f"{prefix}.final_layer_norm.bias"])

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(layer_norm(x, self.final_ln))))


class WhisperTarget:
    """Whisper encoder + cached decoder. Stateless apart from its weights.

    ``dtype`` is the numeric type as presets name it. ``torch.int8`` is weight-only int8 (CPU): every decoder
    matrix but cross-attention's k, v, and the tied vocabulary projection, int8 with per-output-channel scales
    (``layers.Int8Linear``); activations, caches and the encoder in ``compute_dtype``
    (``core.device.activation_dtype``: bfloat16 on native-bf16 CPUs). The encoder stays float: an int8 encoder
    with dynamically quantised activations was no faster here and much less exact (``benchmarks/bench_int8.py``).
    """

    def __init__(self, dims: WhisperDims, weights: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        self.dims = dims
        self.dtype = dtype  # numeric type as presets name it (torch.int8: weight-only int8 decoder)
        self.compute_dtype = activation_dtype(dtype)  # activations, caches, encoder and float matrices
        self.device = torch.device(device)  # where weights, caches and every decode tensor live
        self.alignment_heads = default_alignment_heads(dims)  # (layer, head) pairs for word timing
        cdt = self.compute_dtype
        w = {k: (v.to(self.device, cdt) if v.is_floating_point() else v.to(self.device)) for k, v in weights.items()}
        # int8: quantised from the float32 weights (not from their compute-dtype rounding)
        raw = {k: v.to(self.device) for k, v in weights.items()} if dtype == torch.int8 else None
        # which fusions run: EncoderFusions.for_dtype (all in bf16; float32 only those that keep its bits)
        self.encoder = WhisperEncoder(w, dims.encoder_layers, dims.encoder_heads, cdt,
                                      EncoderFusions.for_dtype(cdt, self.device))
        self.embed = w["model.decoder.embed_tokens.weight"]  # [vocab, d]
        self.dec_pos = w["model.decoder.embed_positions.weight"]  # [text_ctx, d]
        self.dec_blocks = [_Block(w, f"model.decoder.layers.{i}", cdt, True, raw) for i in range(dims.decoder_layers)]
        self.dec_ln = (w["model.decoder.layer_norm.weight"], w["model.decoder.layer_norm.bias"])
        head = "proj_out.weight" if "proj_out.weight" in weights else "model.decoder.embed_tokens.weight"
        self.proj_out = Linear(w[head], None) if raw is None else _int8(raw, head.removesuffix(".weight"), cdt)
        # a verified chain scored row by row as one-token steps score it (bf16 rounding, int8's bf16 kernel input)
        self.exact_rows = cdt == torch.bfloat16 or dtype == torch.int8
        self.mid_layer = (dims.decoder_layers - 1) // 2
        self.compiled_encoder: CompiledEncoder | None = None  # set by compile_encoder(); None = eager
        self.experts = None  # a dense decoder: no expert tally (models/speech.SpeechTarget)

    def compile_encoder(self) -> float:
        """Run the encoder through ``torch.compile`` from now on; returns the compile time in seconds."""
        self.compiled_encoder = compile_encoder(self)
        return self.compiled_encoder.compile_seconds

    @classmethod
    def from_dir(cls, path: str | Path, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> WhisperTarget:
        """Load from a Hugging Face layout directory (``config.json`` + ``model.safetensors``) onto ``device``."""
        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        target = cls(WhisperDims.from_hf_config(cfg), load_file(str(path / "model.safetensors")), dtype, device)
        target.alignment_heads = _read_alignment_heads(path, target.dims)
        return target

    @torch.inference_mode()
    def encode(self, mel: torch.Tensor, frames: Sequence[int] | None = None) -> torch.Tensor:
        """Encoder forward: ``mel [B, n_mels, 3000]`` -> ``[B, audio_ctx, d_model]``. ``frames`` (each row's real
        frames, the encode contract of ``specli.asr``) is not read: Whisper sees the padded window, as trained."""
        if self.compiled_encoder is not None:
            return self.compiled_encoder.fn(mel.to(self.device, self.compute_dtype))
        return self.encoder(mel.to(self.device, self.compute_dtype))

    @torch.inference_mode()
    def start(
        self, audio_features: torch.Tensor, max_len: int | None = None, features: torch.Tensor | None = None
    ) -> DecoderState:
        """New decoder state for one window: an empty cache and the cross-attention K/V."""
        d, heads, dtype = self.dims, self.dims.decoder_heads, self.compute_dtype
        feats = audio_features.to(self.device, dtype)
        cross = self._cross_kv(feats)
        cache = KVCache(d.decoder_layers, feats.shape[0], heads, max_len or d.text_ctx, d.d_model // heads, dtype,
                        feats.device)
        return DecoderState(feats, cross, cache, features)

    def widen(self, state: DecoderState, rows: int) -> DecoderState:
        """Beam search's ``rows``-row state of a one-row window state: the cache's filled slots copied to every
        row, the encoder output and cross-attention K/V broadcast (views, no copy)."""
        cross = tuple((k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in state.cross_kv)
        return replace(state, audio_features=state.audio_features.expand(rows, -1, -1), cross_kv=cross,
                       cache=state.cache.widened(rows), features=None)

    def _cross_kv(self, feats: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """Cross-attention K/V of every decoder layer for encoder output ``feats [B, A, d]``, contiguous, in
        the compute dtype (a bf16 model: bf16, the projections' own values; see ``layers.cross_attention``)."""
        heads, dtype = self.dims.decoder_heads, self.compute_dtype
        return tuple(tuple(_split_heads(blk.cross_attn[n](feats), heads).to(dtype).contiguous() for n in ("k", "v"))
                     for blk in self.dec_blocks)

    def moe_profile(self) -> None:
        """None: a dense decoder (models/speech.SpeechTarget)."""
        return None

    # ---- the batch contract (core/batched.py): slots of one preallocated state, rows [0, B) score
    def batch_target(self) -> WhisperTarget:
        """Whisper batches: itself (models/speech.SpeechTarget)."""
        return self

    @torch.inference_mode()
    def start_batch(self, capacity: int, max_len: int | None = None, spare: int = 0) -> DecoderState:
        """An empty state of ``capacity`` slots: a ragged cache of ``max_len`` positions a row (+ ``spare``
        padding slots) and room for each slot's encoder output and cross-attention K/V."""
        d, heads = self.dims, self.dims.decoder_heads
        hd = d.d_model // heads
        feats = torch.zeros(capacity, d.audio_ctx, d.d_model, dtype=self.compute_dtype, device=self.device)
        cross = tuple(tuple(feats.new_zeros(capacity, heads, d.audio_ctx, hd) for _kv in range(2))
                      for _ in self.dec_blocks)
        cache = RaggedKVCache(d.decoder_layers, capacity, heads, min(max_len or d.text_ctx, d.text_ctx), hd, spare,
                              self.compute_dtype, self.device)
        return DecoderState(feats, cross, cache)

    @torch.inference_mode()
    def admit(self, state: DecoderState, slot: int, context: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> None:
        """Slot ``slot`` starts a new window: its encoder output and cross K/V; empty cache.

        ``context`` is the window's encoder output ``[1, A, d]``, or ``(encoder output, mel [1, n_mels,
        3000])`` when a drafter encodes the window itself (the mel is handed to it by :meth:`row_state`).
        """
        feats = (context[0] if isinstance(context, tuple) else context).to(self.device, self.compute_dtype)
        if feats.shape[1:] != state.audio_features.shape[1:]:
            raise ValueError(f"encoder output {tuple(feats.shape)} does not fit {tuple(state.audio_features.shape)}")
        state.audio_features[slot] = feats[0]
        for (ck, cv), (k, v) in zip(state.cross_kv, self._cross_kv(feats)):
            ck[slot], cv[slot] = k[0], v[0]
        state.cache.set_length(slot, 0)

    def row_state(self, state: DecoderState, slot: int, context: object = None) -> DecoderState:
        """Slot ``slot`` as a batch-1 state over the same memory (prefill, drafters); the row's
        ``context`` (as given to :meth:`admit`) supplies the mel features when it carries them."""
        cross = tuple((k[slot : slot + 1], v[slot : slot + 1]) for k, v in state.cross_kv)
        mel = context[1] if isinstance(context, tuple) else None
        return DecoderState(state.audio_features[slot : slot + 1], cross, state.cache.row(slot), mel)

    @torch.inference_mode()
    def move(self, state: DecoderState, src: int, dst: int) -> None:
        """Copy slot ``src`` into slot ``dst`` (the batch stays compacted when a row leaves)."""
        state.audio_features[dst] = state.audio_features[src]
        for k, v in state.cross_kv:
            k[dst], v[dst] = k[src], v[src]
        state.cache.move(src, dst)

    @torch.inference_mode()
    def score(
        self,
        state: DecoderState,
        tokens: torch.Tensor,  # [B, n] candidate tokens, written to slots [length, length + n)
        positions: torch.Tensor | None = None,  # [B, n] decoder positions; default length + arange(n)
        tree_mask: torch.Tensor | None = None,  # [B, n, n] bool, True where node i may see node j
        logit_rows: Sequence[int] | None = None,  # rows whose logits are returned (a prefill); None: all n
    ) -> ScoreOutput:
        """One decoder forward over a chain (default, causal) or a tree of candidate tokens.

        The K/V of all ``n`` tokens are appended to the cache; the caller keeps what it accepts
        with ``state.cache.crop`` / ``state.cache.compact``. On a batch state (:meth:`start_batch`)
        rows ``[0, B)`` score, each at its own length, and the lengths stay for the caller to set.
        """
        cache, heads = state.cache, self.dims.decoder_heads
        b, n = tokens.shape
        tokens = tokens.to(self.device)  # a no-op when the caller built them on the target's device
        if positions is None:
            if cache.span(b, n) > self.dims.text_ctx:
                raise ValueError(f"decoder position {cache.span(b, n) - 1} beyond {self.dims.text_ctx}")
            positions = cache.positions(b, n, self.device)
        elif positions.device.type == "cpu" or cache.max_len > self.dims.text_ctx:
            # elsewhere the cache bound (tree positions < start + n <= max_len <= text_ctx) implies
            # this check, which would cost a host sync on an accelerator
            if int(positions.max()) >= self.dims.text_ctx:
                raise ValueError(f"decoder position {int(positions.max())} beyond {self.dims.text_ctx}")
        positions = positions.to(self.device)
        x = self.embed[tokens] + self.dec_pos[positions]  # [B, n, d]
        mask = cache.begin(b, n, None if tree_mask is None else tree_mask.to(self.device), self.device)
        # bf16 / int8 rows at one length: attention row by row, each exactly as a one-token step computes it
        # (SDPA over n masked queries rounds differently where the key count crosses its block boundaries). A prompt
        # prefill (``logit_rows`` given) is no chain that one-token steps reproduce: every decode path prefills
        # through the same call (core/job.prefill), so it attends in one call a layer
        by_rows = self.exact_rows and logit_rows is None
        lengths = cache.lengths[:b] if isinstance(cache, RaggedKVCache) else None
        exact = row_plan(mask, tree_mask is not None, lengths) if by_rows and mask is not None else None
        low = mid = x
        for i, blk in enumerate(self.dec_blocks):
            x = self._decoder_block(blk, i, x, state, mask, heads, exact, by_rows)
            if i == 0:
                low = x
            if i == self.mid_layer:
                mid = x
        cache.end(n)
        last = layer_norm(x, self.dec_ln)
        # [B, n or len(logit_rows), vocab]: a prompt's 51,865-column projection only for the rows read
        logits = self.proj_out(last if logit_rows is None else last[:, list(logit_rows)]).float()
        return ScoreOutput(logits, HiddenStates(low, mid, last))

    @torch.inference_mode()
    def cross_attention_weights(
        self,
        state: DecoderState,
        tokens: torch.Tensor,  # [B, n] a whole sequence, decoder positions 0..n-1
        heads: Sequence[tuple[int, int]],  # (decoder layer, head) pairs to return
        n_frames: int | None = None,  # softmax over the first n_frames encoder positions (None: all)
        scale: float = 1.0,  # multiplies the attention logits before the softmax
    ) -> CrossAttention:
        """Cross-attention weights of chosen heads over a token sequence (for word timing).

        Runs the decoder over ``tokens`` from position 0 with its own causal self-attention (the
        state's cache is neither read nor written; only its cross-attention K/V are used) and
        returns the chosen heads' ``softmax(scale * q k^T / sqrt(D))`` over the first ``n_frames``
        encoder positions, in float32, plus the logits of the same forward.
        """
        n, n_heads = tokens.shape[1], self.dims.decoder_heads
        if n > self.dims.text_ctx:
            raise ValueError(f"{n} tokens exceed the decoder's {self.dims.text_ctx} positions")
        frames = self.dims.audio_ctx if n_frames is None else n_frames
        heads = [(int(layer), int(head)) for layer, head in heads]
        by_layer: dict[int, list[int]] = {}
        for layer, head in heads:
            by_layer.setdefault(layer, []).append(head)
        found: dict[tuple[int, int], torch.Tensor] = {}
        x = self.embed[tokens] + self.dec_pos[:n]  # [B, n, d]
        for i, blk in enumerate(self.dec_blocks):
            a = blk.self_attn
            h = layer_norm(x, blk.self_ln)
            q, k, v = (_split_heads(a[p](h), n_heads) for p in ("q", "k", "v"))
            x = x + a["out"](_merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=True)))
            c = blk.cross_attn
            q = _split_heads(c["q"](layer_norm(x, blk.cross_ln)), n_heads)  # [B, H, n, D]
            ck, cv = state.cross_kv[i]
            ck, cv = ck[: q.shape[0]], cv[: q.shape[0]]
            x = x + c["out"](_merge_heads(cross_attention(q, ck, cv)))
            if i in by_layer:
                qk = q.float() @ ck[:, :, :frames].float().transpose(-1, -2) * (q.shape[-1] ** -0.5)
                for head in by_layer[i]:
                    found[(i, head)] = (qk[:, head] * scale).softmax(dim=-1)  # [B, n, frames]
            x = blk.mlp(x)
        logits = self.proj_out(layer_norm(x, self.dec_ln)).float()
        return CrossAttention(torch.stack([found[pair] for pair in heads], dim=1), logits)

    def _decoder_block(self, blk: _Block, i: int, x: torch.Tensor, state: DecoderState, mask, heads: int,
                       exact: RowPlan | None = None, by_rows: bool = False) -> torch.Tensor:
        a = blk.self_attn
        h = layer_norm(x, blk.self_ln)
        q, k, v = (_split_heads(a[n](h), heads) for n in ("q", "k", "v"))
        k_all, v_all = state.cache.update(i, k, v)
        if exact is not None:  # each query over its own keys only, unmasked: a batch-1 one-token step's call
            att = attend_by_rows(q, k_all, v_all, exact, F.scaled_dot_product_attention)
        else:
            att = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
        x = x + a["out"](_merge_heads(att))
        c = blk.cross_attn
        h = layer_norm(x, blk.cross_ln)
        ck, cv = state.cross_kv[i]
        ck, cv = ck[: x.shape[0]], cv[: x.shape[0]]  # a batch state holds every slot; rows [0, B) score
        q = _split_heads(c["q"](h), heads)  # by_rows (bf16): row by row, so verifying n tokens equals n AR steps
        x = x + c["out"](_merge_heads(cross_attention(q, ck, cv, per_row=by_rows)))
        return blk.mlp(x)
