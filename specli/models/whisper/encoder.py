"""Whisper's audio encoder (issue 45, "encoder near peak"): ``mel [B, n_mels, 3000] -> [B, audio_ctx, d]``.

What runs fused is one decision, :meth:`EncoderFusions.for_dtype`:

- **bfloat16** (CPU, oneDNN bf16): q, k, v as one ``d -> 3d`` GEMM; fc1's bias + GELU and the residual adds after
  the attention output and fc2 as oneDNN post-ops of their GEMMs (``Linear.gelu`` / ``Linear.add``); the conv stem
  as channels-last ``1 x 3`` convolutions with the GELU a post-op (the vocoder's precedent,
  ``tts/acoustic/hifigan.py``). The rounding moves (one bf16 rounding where there were two: closer to float32);
  everything downstream (speculative == AR, batch-N == batch-1) still reads one encoder output.
- **float32** (CPU): only the GELU and residual post-ops, bit-identical to the separate ops. The fused q/k/v GEMM
  and the channels-last stem pick other oneDNN kernels, whose sums round differently.

:data:`SEPARATE` (every op on its own: the computation before these fusions) is the reference the tests compare
with. Attention is PyTorch's SDPA (its CPU flash kernel) over strided views of the projections, in the model's
dtype: against the math backend, contiguous copies, query-chunked ``softmax(q kᵀ) v`` and float32 SDPA over bf16
inputs it was the fastest by 2.4x or more (``docs/benchmarks/whisper-encoder``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specli.models.layers import Linear, bf16_packable, layer_norm

_CONV_POINTWISE = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise")


@dataclass(frozen=True)
class EncoderFusions:
    """Which fusions the encoder runs (see the module docstring)."""

    qkv: bool  # q, k, v projections as one GEMM over concatenated weights
    gelu: bool  # fc1's bias + GELU as a oneDNN post-op
    residual: bool  # the residual adds after the attention output and fc2 as oneDNN post-ops
    conv_stem: bool  # channels-last conv stem with the GELU as a post-op

    @classmethod
    def for_dtype(cls, dtype: torch.dtype, device: torch.device) -> EncoderFusions:
        """bfloat16 on a CPU where oneDNN runs bf16: all four. float32 on the CPU: the two post-ops only, which
        give the same bits as the separate ops (``tests/test_whisper_encoder.py`` checks it exactly); there the fused
        q/k/v GEMM measured no faster and the channels-last stem changes the bits. Elsewhere none."""
        if device.type == "cpu" and dtype == torch.bfloat16 and bf16_packable():
            return cls(qkv=True, gelu=True, residual=True, conv_stem=_CONV_POINTWISE)
        if device.type == "cpu" and dtype == torch.float32:
            return cls(qkv=False, gelu=True, residual=True, conv_stem=False)
        return SEPARATE


SEPARATE = EncoderFusions(qkv=False, gelu=False, residual=False, conv_stem=False)  # the reference: each op alone


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, n, d = x.shape
    return x.view(b, n, heads, d // heads).transpose(1, 2)  # [B, H, n, D]


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d)  # [B, n, H * D]


class EncoderBlock:
    """One pre-norm encoder block (self-attention, MLP) over ``x [B, A, d]``, fused as ``fusions`` says."""

    def __init__(self, w: dict[str, torch.Tensor], prefix: str, dtype: torch.dtype, heads: int,
                 fusions: EncoderFusions) -> None:
        self.heads, self.fusions = heads, fusions
        self.self_ln = (w[f"{prefix}.self_attn_layer_norm.weight"], w[f"{prefix}.self_attn_layer_norm.bias"])
        self.final_ln = (w[f"{prefix}.final_layer_norm.weight"], w[f"{prefix}.final_layer_norm.bias"])
        attn = f"{prefix}.self_attn"
        names = ("q", "k", "v")
        if fusions.qkv:  # one [3d, d] weight; k_proj has no bias: zeros in its third
            ws = [w[f"{attn}.{n}_proj.weight"] for n in names]
            bs = [w.get(f"{attn}.{n}_proj.bias", torch.zeros_like(ws[0][:, 0])) for n in names]
            self.qkv: Linear | None = Linear(torch.cat(ws).to(dtype), torch.cat(bs).to(dtype))  # [3d, d]
            self.proj: dict[str, Linear] = {}
        else:
            self.qkv, self.proj = None, {n: Linear.from_weights(w, f"{attn}.{n}_proj", dtype) for n in names}
        self.out = Linear.from_weights(w, f"{attn}.out_proj", dtype)
        self.fc1, self.fc2 = (Linear.from_weights(w, f"{prefix}.{n}", dtype) for n in ("fc1", "fc2"))

    def qkv_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The plain q, k, v weights and biases stacked: ``([3d, d], [3d])`` (for ``compiled.py``)."""
        if self.qkv is not None:
            return self.qkv.weight, self.qkv.bias
        lins = [self.proj[n] for n in ("q", "k", "v")]
        return (torch.cat([lin.weight for lin in lins]),
                torch.cat([torch.zeros(lin.out_features, dtype=lin.dtype, device=lin.weight.device)
                           if lin.bias is None else lin.bias for lin in lins]))

    def _attention_input(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``h [B, A, d]`` -> q, k, v ``[B, H, A, D]`` (views of one ``[B, A, 3d]`` product when fused)."""
        if self.qkv is None:
            return tuple(split_heads(self.proj[n](h), self.heads) for n in ("q", "k", "v"))
        b, n, _ = h.shape
        qkv = self.qkv(h).view(b, n, 3, self.heads, -1)  # [B, A, 3, H, D]
        return tuple(qkv[:, :, i].transpose(1, 2) for i in range(3))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [B, A, d] -> [B, A, d]
        q, k, v = self._attention_input(layer_norm(x, self.self_ln))
        att = merge_heads(F.scaled_dot_product_attention(q, k, v))
        fused = self.fusions
        x = self.out.add(att, x) if fused.residual else x + self.out(att)
        h = layer_norm(x, self.final_ln)
        h = self.fc1.gelu(h) if fused.gelu else F.gelu(self.fc1(h))
        return self.fc2.add(h, x) if fused.residual else x + self.fc2(h)


def _conv_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int, fused: bool) -> torch.Tensor:
    """``F.gelu(F.conv1d(x, weight, bias, stride, padding=1))``; ``fused``: on ``x [B, C, 1, T]`` channels-last
    as a ``1 x 3`` 2-D convolution with the GELU a oneDNN post-op (returns ``[B, C', 1, T']`` channels-last)."""
    if not fused:
        return F.gelu(F.conv1d(x, weight, bias, stride=stride, padding=1))
    return torch.ops.mkldnn._convolution_pointwise(x, weight, bias, [0, 1], [1, stride], [1, 1], 1, "gelu", [],
                                                   "none")


class WhisperEncoder:
    """Conv stem, positional embeddings, encoder blocks and final layer norm, over the Hugging Face names in ``w``
    (already in ``dtype`` on their device)."""

    def __init__(self, w: dict[str, torch.Tensor], layers: int, heads: int, dtype: torch.dtype,
                 fusions: EncoderFusions) -> None:
        self.fusions = fusions  # what runs fused (EncoderFusions.for_dtype, or SEPARATE for the reference)
        self.conv1 = (w["model.encoder.conv1.weight"], w["model.encoder.conv1.bias"])  # [d, n_mels, 3], [d]
        self.conv2 = (w["model.encoder.conv2.weight"], w["model.encoder.conv2.bias"])  # [d, d, 3], [d]
        # the same weights as [d, C, 1, 3] channels-last, for the fused stem
        self._conv4 = tuple(c[0].unsqueeze(2).contiguous(memory_format=torch.channels_last)
                            for c in (self.conv1, self.conv2)) if fusions.conv_stem else None
        self.pos = w["model.encoder.embed_positions.weight"]  # [audio_ctx, d]
        self.blocks = [EncoderBlock(w, f"model.encoder.layers.{i}", dtype, heads, fusions) for i in range(layers)]
        self.ln = (w["model.encoder.layer_norm.weight"], w["model.encoder.layer_norm.bias"])

    def _stem(self, mel: torch.Tensor) -> torch.Tensor:  # [B, n_mels, 3000] -> [B, audio_ctx, d]
        if self._conv4 is None:
            x = _conv_gelu(mel, *self.conv1, 1, False)
            x = _conv_gelu(x, *self.conv2, 2, False)  # [B, d, audio_ctx]
            return x.transpose(1, 2) + self.pos[: x.shape[2]]
        x = mel.unsqueeze(2).contiguous(memory_format=torch.channels_last)  # [B, n_mels, 1, 3000]
        x = _conv_gelu(x, self._conv4[0], self.conv1[1], 1, True)
        x = _conv_gelu(x, self._conv4[1], self.conv2[1], 2, True)[:, :, 0]  # [B, d, audio_ctx], d innermost
        return x.transpose(1, 2) + self.pos[: x.shape[2]]

    def __call__(self, mel: torch.Tensor) -> torch.Tensor:  # [B, n_mels, 3000] -> [B, audio_ctx, d]
        x = self._stem(mel)
        for blk in self.blocks:
            x = blk(x)
        return layer_norm(x, self.ln)
