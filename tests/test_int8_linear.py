"""int8 linear layers (``layers``): weight-only ``Int8Linear`` (drafters, the int8 Whisper decoder) and the W8A8
``DynamicInt8Linear`` (VNNI, an encoder candidate), each CPU kernel against its pure-torch reference within the
tolerance stated per test, the quantisation error bounds, and the EAGLE head that runs int8 staying lossless."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specli.models.layers import (DynamicInt8Linear, Int8Linear, dynamic_int8_linear_reference, int8_linear_reference,
                                  quantize_int8, quantize_rows)

# (out, in): whisper-base / tiny.en head shapes (block, fusion, draft-vocabulary rows), odd sizes
SHAPES = [(1536, 512), (512, 2048), (512, 1536), (8192, 512), (1152, 384), (40, 64), (37, 21), (16, 8)]


def _weights(out_f: int, in_f: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out_f, in_f, generator=g) / in_f**0.5, torch.randn(out_f, generator=g)


@pytest.mark.parametrize("out_f,in_f", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_the_reference(out_f, in_f, dtype):
    w, b = _weights(out_f, in_f)
    layer = Int8Linear(w, b, dtype)
    assert layer.fast == (in_f % 32 == 0)  # the kernel where it is right, the reference elsewhere
    g = torch.Generator().manual_seed(1)
    for rows in (1, 3, 4, 17):
        x = torch.randn(2, rows, in_f, generator=g).to(dtype)
        got, want = layer(x), int8_linear_reference(x, layer.q, layer.scales, layer.bias)
        assert got.shape == (2, rows, out_f) and got.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: the kernel's products round as bf16
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * want.float().abs().max().item())
    assert layer(torch.zeros(0, in_f, dtype=dtype)).shape == (0, out_f)


@pytest.mark.parametrize("out_f,in_f", SHAPES)
def test_float32_activations_through_the_bf16_kernel_match_the_reference(out_f, in_f):
    """The int8 Whisper target on CPUs without native bf16: float32 activations, the kernel fed bf16 (its float32
    variant is 10-30x slower). Reference: the same input rounded to bf16, float32 products; tolerance 2e-2 of the
    output range (the kernel's bf16 output rounding)."""
    w, b = _weights(out_f, in_f)
    layer = Int8Linear(w, b, torch.float32, kernel_dtype=torch.bfloat16)
    assert layer.fast == (in_f % 32 == 0) and layer.scales.dtype == torch.bfloat16
    x = torch.randn(3, 5, in_f, generator=torch.Generator().manual_seed(1))
    got = layer(x)
    want = int8_linear_reference(x.bfloat16().float(), layer.q, layer.scales.float(), layer.bias)
    assert got.dtype == torch.float32 and got.shape == (3, 5, out_f)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
    torch.testing.assert_close(layer.weight, layer.q.float() * layer.scales.float()[:, None])


@pytest.mark.parametrize("out_f,in_f", [*SHAPES, (2048, 512)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dynamic_int8_kernel_matches_the_reference(out_f, in_f, dtype):
    """``torch._int_mm`` (oneDNN s8s8, VNNI) sums int8 products exactly in int32 as the float64 reference does:
    the two differ only by the float32 rescale's rounding (tolerance 1e-5 relative; bf16 outputs one bf16 ulp)."""
    w, b = _weights(out_f, in_f)
    layer = DynamicInt8Linear(w, b)
    g = torch.Generator().manual_seed(3)
    for rows in (1, 4, 17, 300):
        x = torch.randn(2, rows, in_f, generator=g).to(dtype)
        got, want = layer(x), dynamic_int8_linear_reference(x, layer.q, layer.scales, layer.bias)
        assert got.shape == (2, rows, out_f) and got.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else 8e-3
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * want.float().abs().max().item())


def test_dynamic_int8_rows_are_independent_and_close_to_float():
    w, b = _weights(512, 512)
    layer = DynamicInt8Linear(w, b)
    x = torch.randn(40, 512, generator=torch.Generator().manual_seed(4))
    x[7] = 0.0  # a zero row: scale 1, the bias alone
    full = layer(x)
    assert torch.equal(torch.cat([layer(x[i : i + 1]) for i in range(40)]), full)
    torch.testing.assert_close(full[7], b)
    want = F.linear(x, w, b)
    assert (full - want).abs().max() < 0.03 * want.abs().max()  # 8-bit weights and activations: under 3%
    xq, xs = quantize_rows(x)
    assert xq.dtype == torch.int8 and int(xq.abs().max()) == 127 and xs.shape == (40, 1)
    assert bool(((xq.float() * xs - x).abs() <= xs / 2 + 1e-7).all())


def test_quantisation_error_is_at_most_half_a_step_per_channel():
    w, _ = _weights(64, 96)
    w[3] = 0.0  # a zero row: scale 1, all zeros
    q, scales = quantize_int8(w)
    assert q.dtype == torch.int8 and scales.shape == (64,) and int(q.abs().max()) == 127
    err = (q.float() * scales[:, None] - w).abs()
    assert bool((err <= scales[:, None] / 2 + 1e-7).all()) and not q[3].any() and scales[3] == 1.0


def test_int8_output_is_close_to_the_float_layer():
    w, b = _weights(512, 512)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(2))
    got, want = Int8Linear(w, b, torch.float32)(x), F.linear(x, w, b)
    assert (got - want).abs().max() < 0.02 * want.abs().max()  # 8-bit weights: under 2% of the output range


@pytest.mark.parametrize("weights,want", [("auto", True), ("int8", True), ("float", False)])
def test_preset_head_weights_reach_the_drafter(whisper_models, weights, want):
    from specli.asr.strategies import build_drafter
    from specli.presets import preset_from_dict

    preset = preset_from_dict("p", {"model": "whisper-base", "strategy": "adaptive", "drafter": "eagle",
                                    "head": "whisper-base-eagle", "confidence_threshold": 0.7, "head_weights": weights})
    drafter = build_drafter(preset, whisper_models("whisper-base"))
    assert isinstance(drafter.head.fc1.linear, Int8Linear) == want  # auto: int8 on the CPU


def test_preset_rejects_unknown_head_weights():
    from specli.errors import PresetError
    from specli.presets import preset_from_dict

    with pytest.raises(PresetError, match="head_weights"):
        preset_from_dict("p", {"model": "whisper-base", "strategy": "adaptive", "drafter": "eagle", "head": "h",
                               "confidence_threshold": 0.7, "head_weights": "int4"})
