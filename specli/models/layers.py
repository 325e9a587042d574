"""Small building blocks of the lean targets: a linear layer with a CPU fast path, layer norm
over ``(weight, bias)`` pairs, cross-attention, and int8 linear layers: weight-only (drafters and the int8
Whisper decoder) and W8A8 with dynamic activation quantisation (VNNI; measured, not used by a target).

CPU fast path (issue "CPU fast path"; numbers from the 2-vCPU Zen4 machines, 2 threads, in
``benchmarks/bench_decoder_step.py``): plain ``F.linear`` (MKL ``x·Wᵀ``) runs one row
single-threaded and 2–7 rows row by row, so scoring 3 tokens cost 2.4x one token. ``Linear``
instead reorders its weight ONCE, at construction, into oneDNN's blocked layout and runs every
product through oneDNN. Measured per shape (whisper-base / tiny.en layers and vocabulary heads,
fp32 and bf16, 1–24 rows and the encoder's 1500), this one layout was the fastest or close to it
everywhere (vs ``F.linear``: 1.1–4x on layer matrices, 2–12x on vocabulary heads, 1.1–1.4x
at 1500 rows; never slower beyond noise), so there is no per-``m`` table of layouts and no
second copy of the weight. The one per-``m`` rule: oneDNN is slower on 1–3 rows than on 4, so
fewer than ``_MIN_ROWS`` rows are zero-padded to ``_MIN_ROWS`` and the result sliced.

Not done on purpose: on AVX2-only CPUs (AMD EPYC Zen 1 / Zen 3, 2 threads) oneDNN costs a fixed ~100 us a call,
so a one-row product of a small layer is 2-5x slower than MKL's ``F.linear`` (256 x 256: 115 vs 17 us; a 6,761-row
head: 279 vs 266 us) and an AR step of specli-en's 6 x 256 LM would be 1.3x faster through ``F.linear`` (7.0 ->
5.4 ms). But oneDNN's rows do not depend on the row count (a row of a 9-row product equals the same row alone,
bitwise), while ``F.linear``'s one-row (gemv) and MKL's packed paths do not match their multi-row rows: a one-row
rule would make AR steps and k + 1-row verifications differ by float noise, and float32 speculative == AR would
hold only up to near-ties. Exactness is kept.

Memory: the blocked weight replaces the plain one (same size). A weight tied to an embedding (the
Whisper vocabulary head) is no longer shared with it: one extra copy of that matrix.
fp32 results match ``F.linear`` to ~1e-6 relative; both paths are deterministic run to run for a
given shape and thread count. The blocked weight cannot be pickled or deep-copied.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_MIN_ROWS = 4  # fewer rows are zero-padded up to this many (oneDNN is slower below 4 rows)
_PACKABLE = (torch.float32, torch.bfloat16)
_ONEDNN = (
    torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    and hasattr(torch.ops.mkldnn, "_linear_pointwise")
)


def bf16_packable() -> bool:
    """Whether oneDNN can reorder and multiply bf16 weights on this CPU (it refuses without AVX-512 BW/VL/DQ or
    AVX-NE-CONVERT: on such a CPU a bf16 ``Linear`` keeps its plain weight and calls ``F.linear``)."""
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return probe is not None and bool(probe())


def _pack(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight [out, in]`` in oneDNN's blocked layout, or None where the fast path does not apply."""
    if not (_ONEDNN and weight.device.type == "cpu" and weight.dtype in _PACKABLE and weight.dim() == 2):
        return None
    if weight.dtype == torch.bfloat16 and not bf16_packable():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


class Linear:
    """``y = x @ W.T + b`` with ``W`` of shape ``[out, in]`` (Hugging Face layout).

    ``fast=True`` (default) keeps only the oneDNN-blocked weight where the CPU fast path applies;
    ``fast=False`` keeps the plain weight and calls ``F.linear`` (the reference and the
    benchmark's baseline).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, fast: bool = True) -> None:
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        self.bias = None if bias is None else bias.contiguous()  # [out] or None
        self._packed = _pack(weight) if fast else None
        self._plain = weight.contiguous() if self._packed is None else None  # [out, in]

    @classmethod
    def from_weights(cls, w: dict[str, torch.Tensor], prefix: str, dtype: torch.dtype) -> Linear:
        bias = w.get(f"{prefix}.bias")
        return cls(w[f"{prefix}.weight"].to(dtype), None if bias is None else bias.to(dtype))

    @property
    def fast(self) -> bool:
        """Whether calls go through the oneDNN fast path."""
        return self._packed is not None

    @property
    def weight(self) -> torch.Tensor:
        """The plain ``[out, in]`` weight (a fresh copy when only the blocked layout is kept)."""
        return self._plain if self._plain is not None else self._packed.to_dense()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if self._packed is None or x.dtype != self.dtype or x.device.type != "cpu":
            return F.linear(x, self.weight, self.bias)  # plain path (and F.linear's dtype errors)
        x2 = x.reshape(-1, self.in_features)
        m = x2.shape[0]
        if m == 0:
            return x.new_empty(*x.shape[:-1], self.out_features)
        if m < _MIN_ROWS:
            x2 = torch.cat([x2, x2.new_zeros(_MIN_ROWS - m, self.in_features)])
        y = torch.ops.mkldnn._linear_pointwise(x2, self._packed, self.bias, "none", [], "")
        return y[:m].view(*x.shape[:-1], self.out_features)

    def _fusable(self, x: torch.Tensor) -> bool:
        """oneDNN post-ops apply: the fast path, and enough rows that no zero padding is needed."""
        return self._packed is not None and x.dtype == self.dtype and x.device.type == "cpu" and \
            x.numel() >= _MIN_ROWS * self.in_features

    def gelu(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        """``F.gelu(self(x))`` (erf GELU), the GELU a oneDNN post-op of the product where the fast path applies:
        one rounding and no second pass over the output. float32: the same bits as the separate ops on the CPUs
        measured, bf16: one rounding instead of two (``tests/test_whisper_encoder.py``)."""
        if not self._fusable(x):
            return F.gelu(self(x))
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features), self._packed, self.bias, "gelu",
                                               [], "none")
        return y.view(*x.shape[:-1], self.out_features)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:  # [..., in], [..., out] -> [..., out]
        """``residual + self(x)``, the add a oneDNN post-op of the product where the fast path applies (bf16: the
        sum rounded once, not the product first)."""
        if not self._fusable(x) or residual.dtype != self.dtype:
            return residual + self(x)
        y = torch.ops.mkldnn._linear_pointwise.binary(x.reshape(-1, self.in_features),
                                                      residual.reshape(-1, self.out_features).contiguous(),
                                                      self._packed, self.bias, "add")
        return y.view(*x.shape[:-1], self.out_features)


def cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, per_row: bool = False) -> torch.Tensor:
    """``softmax(q kᵀ / sqrt(D)) v`` for a few queries ``q [B, H, n, D]`` over a window's ``k, v [B, H, A, D]``,
    computed in the K/V's dtype (the result in ``q``'s). A bfloat16 Whisper keeps its window K/V in bfloat16
    (the projections' own values, half the bytes of float32); PyTorch's CPU SDPA over bf16 accumulates in
    float32 (its flash kernel's float ``accum_t``: scores, softmax and the running sum; the probabilities are
    rounded to bf16 for the product with V) and computes each (row, head) alone, so a row's result does not
    depend on the other rows or the batch size (``tests/test_fast_path.py``). Measured on a 1-thread AMX Xeon
    (torch 2.13, batch 8, 8 heads of 64 over 1,500 frames): 1.04 ms bf16 against 2.1 ms float32.

    ``per_row``: one SDPA call per query row, so that row ``i`` of an ``n``-token forward is computed exactly as
    a one-token forward computes it (SDPA over ``n`` queries differs from ``n`` one-query calls in the last
    bits; after the cast to bf16 that flipped greedy near-ties between verification and AR decoding).
    """
    dtype, q = q.dtype, q.to(k.dtype)
    if per_row and q.shape[2] > 1:
        out = torch.cat([F.scaled_dot_product_attention(q[:, :, i : i + 1], k, v) for i in range(q.shape[2])], 2)
    else:
        out = F.scaled_dot_product_attention(q, k, v)
    return out.to(dtype)


def layer_norm(x: torch.Tensor, params: tuple[torch.Tensor, torch.Tensor], eps: float = 1e-5) -> torch.Tensor:
    weight, bias = params
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


_INT8_KERNEL = hasattr(torch.ops.aten, "_weight_int8pack_mm")


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8 of ``weight [out, in]``: ``(q [out, in] int8, scales [out] float32)``
    with ``weight ~= q * scales[:, None]`` (a zero row gets scale 1)."""
    w = weight.detach().float()
    scales = w.abs().amax(dim=1) / 127.0
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = (w / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scales


def int8_linear_reference(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
                          bias: torch.Tensor | None) -> torch.Tensor:
    """Pure-torch reference of :class:`Int8Linear`: ``x @ (q * scales)ᵀ + b`` in float32, cast to ``x``'s dtype."""
    y = F.linear(x.float(), q.float() * scales.float()[:, None], None if bias is None else bias.float())
    return y.to(x.dtype)


class Int8Linear:
    """Weight-only int8 linear layer: ``y = x @ (q * scales)ᵀ + b``, activations in ``dtype`` (float32 or
    bfloat16), int8 weights with one scale per output channel (:func:`quantize_int8`).

    On the CPU it runs ATen's ``_weight_int8pack_mm`` (gpt-fast's int8 weight-only kernel) when the input
    width is a multiple of 32: half the bytes of a bf16 matrix streamed per call. The kernel computes in
    ``kernel_dtype`` (default ``dtype``): its bfloat16 variant is vectorised (it widens bf16 to float32 by a
    shift, so it needs no native bf16), its float32 variant measured 8-30x slower on the 2-vCPU EPYC machines
    (``benchmarks/bench_int8.py``), so float32 activations may pass ``kernel_dtype=torch.bfloat16``: the
    input is rounded to bf16 and the result widened back. Each output row depends only on its own input row
    (float32 accumulation in the same order whatever the number of rows: ``tests/test_int8_exact.py``), which
    the int8 Whisper target's lossless verification relies on. Its cost grows with the rows (one weight pass
    per row): faster than packed bf16 at one row (a decode step), slower from about 4 rows
    (``benchmarks/bench_int8.py``). Elsewhere (or without the kernel) it computes :func:`int8_linear_reference`,
    which tests compare it with.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
                 kernel_dtype: torch.dtype | None = None) -> None:
        self.out_features, self.in_features = weight.shape
        self.dtype = dtype
        self.kernel_dtype = kernel_dtype or dtype  # the dtype the kernel reads and writes activations in
        self.q, scales = quantize_int8(weight)  # [out, in] int8, [out] float32
        self.scales = scales.to(self.kernel_dtype)  # the kernel takes its scales in its activations' dtype
        self.bias = None if bias is None else bias.detach().to(dtype).contiguous()  # [out] or None
        # the bf16 kernel returned garbage for 24 / 40 input features (multiples of 16 were right): multiples of 32 only
        self.fast = (_INT8_KERNEL and weight.device.type == "cpu" and self.kernel_dtype in _PACKABLE
                     and self.in_features % 32 == 0)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised ``[out, in]`` weight ``q * scales`` in ``dtype`` (a fresh tensor)."""
        return (self.q.float() * self.scales.float()[:, None]).to(self.dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if not self.fast or x.dtype != self.dtype:
            return int8_linear_reference(x.to(self.kernel_dtype), self.q, self.scales, self.bias).to(x.dtype)
        x2 = x.reshape(-1, self.in_features).to(self.kernel_dtype).contiguous()
        if x2.shape[0] == 0:
            return x.new_empty(*x.shape[:-1], self.out_features)
        y = torch.ops.aten._weight_int8pack_mm(x2, self.q, self.scales).to(self.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8 of activations ``x [m, in]``: ``(xq [m, in] int8, scales [m, 1] float32)`` with
    ``x ~= xq * scales`` (a zero row gets scale 1). Each row's result depends on that row alone."""
    xf = x.float()
    scales = xf.abs().amax(dim=1, keepdim=True) / 127.0
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    return (xf / scales).round_().clamp_(-127, 127).to(torch.int8), scales


def dynamic_int8_linear_reference(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
                                  bias: torch.Tensor | None) -> torch.Tensor:
    """Pure-torch reference of :class:`DynamicInt8Linear`: rows of ``x`` quantised by :func:`quantize_rows`, the
    integer products summed exactly in float64, scaled back in float32, plus ``b``; in ``x``'s dtype."""
    x2 = x.reshape(-1, x.shape[-1])
    xq, xs = quantize_rows(x2)
    acc = (xq.double() @ q.double().T).float()  # [m, out] exact: |sum| <= in * 127^2 < 2^53
    y = acc * (xs * scales.float()[None, :])
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).view(*x.shape[:-1], q.shape[0])


class DynamicInt8Linear:
    """int8 x int8 linear layer with dynamic activation quantisation (W8A8): weights as :class:`Int8Linear`
    (per output channel), each input row quantised to int8 at call time (:func:`quantize_rows`), the integer
    product summed in int32 by ``torch._int_mm`` (oneDNN's s8s8 GEMM: AVX512-VNNI / AMX where the CPU has it),
    then ``acc * row_scale * channel_scale + b``. Integer sums are exact, so every row is independent of the
    others. Candidate for the encoder's 1,500-row GEMMs; the target does not use it: with its quantisation
    passes it measured no faster than oneDNN's packed bf16 GEMM here and less exact (``benchmarks/bench_int8.py``).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = weight.shape
        self.q, self.scales = quantize_int8(weight)  # [out, in] int8, [out] float32
        self._qt = self.q.T  # [in, out] a transposed view: _int_mm's oneDNN path took it fastest
        self.bias = None if bias is None else bias.detach().float().contiguous()  # [out] or None
        self.fast = hasattr(torch, "_int_mm") and weight.device.type == "cpu"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out], in x's dtype
        if not self.fast:
            return dynamic_int8_linear_reference(x, self.q, self.scales, self.bias)
        xq, xs = quantize_rows(x.reshape(-1, self.in_features))
        acc = torch._int_mm(xq, self._qt)  # [m, out] int32
        y = acc.float().mul_(xs).mul_(self.scales)
        if self.bias is not None:
            y = y.add_(self.bias)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)
