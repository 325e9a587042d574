"""int8 (weight-only) targets are their own greedy reference: a verified chain is computed row by row exactly as
one-token steps compute it, so speculative greedy decoding gives int8 AR's tokens bit for bit (test_exact_matrix's
whisper-int8 row: chains, trees, speculative greedy, ragged batches), and speculative sampling keeps the int8
target's distribution. This file holds what only int8 has: its kernel, its name, its layers, float32 activations.

Why it holds: the int8 kernel (``layers.Int8Linear``, ATen's ``_weight_int8pack_mm``) computes each output row
from its own input row in the same order whatever the number of rows (checked here bit for bit), and the
target scores a chain's attention row by row as for bf16 (``WhisperTarget.exact_rows``).
"""

from __future__ import annotations

import pytest
import torch

import specli.core.device as device
from specli.asr.drafters.model import ModelDrafter
from specli.errors import PresetError, UsageError
from specli.models.layers import Int8Linear, quantize_int8
from specli.presets import preset_from_dict
from test_exact_matrix import WhisperCase, chain_equals_steps
from test_sampling import _exact_two_token_marginals, assert_two_token_marginals, tv
from tiny_models import NO_TS, SOT, tiny_rules, tiny_target

TARGET = tiny_target(0, dtype=torch.int8)


@pytest.mark.parametrize("out_f,in_f", [(512, 512), (2048, 512), (512, 2048), (51865, 512), (1536, 384)])
def test_int8_kernel_rows_do_not_depend_on_the_row_count(out_f, in_f):
    g = torch.Generator().manual_seed(out_f + in_f)
    q, scales = quantize_int8(torch.randn(out_f, in_f, generator=g))
    x = torch.randn(40, in_f, generator=g).to(torch.bfloat16)
    one = torch.cat([torch.ops.aten._weight_int8pack_mm(x[i : i + 1], q, scales.bfloat16()) for i in range(40)])
    for rows in (2, 3, 4, 5, 8, 9, 17, 25, 40):
        assert torch.equal(torch.ops.aten._weight_int8pack_mm(x[:rows], q, scales.bfloat16()), one[:rows]), rows


def test_int8_by_name_on_the_cpu_only_and_never_auto():
    cpu = torch.device("cpu")
    assert device.resolve_dtype("int8", cpu) == torch.int8 and device.dtype_name(torch.int8) == "int8"
    assert device.auto_dtype(cpu, native_bf16=True) == torch.bfloat16  # auto never picks int8 (device.py's note)
    with pytest.raises(UsageError, match="CPU only"):
        device.resolve_dtype("int8", torch.device("cuda"))
    assert device.activation_dtype(torch.int8, native_bf16=True) == torch.bfloat16
    assert device.activation_dtype(torch.int8, native_bf16=False) == torch.float32
    assert device.activation_dtype(torch.float16) == torch.float16
    assert preset_from_dict("x", {"model": "whisper-base", "dtype": "int8"}).dtype == "int8"
    with pytest.raises(PresetError, match="dtype"):
        preset_from_dict("x", {"model": "whisper-base", "dtype": "int4"})


def test_the_int8_target_is_int8_where_it_should_be():
    assert TARGET.dtype == torch.int8 and TARGET.compute_dtype == device.activation_dtype(torch.int8)
    blk = TARGET.dec_blocks[0]
    assert isinstance(TARGET.proj_out, Int8Linear) and TARGET.proj_out.fast
    assert all(isinstance(blk.self_attn[n], Int8Linear) for n in ("q", "k", "v", "out"))
    assert isinstance(blk.cross_attn["q"], Int8Linear) and isinstance(blk.fc2, Int8Linear)
    assert not isinstance(blk.cross_attn["k"], Int8Linear)  # once a window over 1,500 rows: float GEMM
    assert not isinstance(TARGET.encoder.blocks[0].fc1, Int8Linear)  # the encoder stays float


def test_float32_activations_too(monkeypatch):
    """CPUs without native bf16: activations float32, the kernel still fed bf16; still exact row by row."""
    monkeypatch.setattr(device, "cpu_native_bf16", lambda: False)
    case = WhisperCase(torch.int8)
    assert case.target.compute_dtype == torch.float32 and case.target.proj_out.kernel_dtype == torch.bfloat16
    chain_equals_steps(case)


def test_int8_speculative_sampling_keeps_the_int8_distribution():
    """Statistical (bounds as in test_sampling): the first two sampled tokens' frequencies within 3x the expected
    TV distance of the int8 target's exact marginals, and the draft's distribution farther away than that."""
    target = tiny_target(0, init_std=0.15, dtype=torch.int8)
    drafter_model = tiny_target(1, layers=1, init_std=0.15, dtype=torch.int8)
    c1, p1, bound1 = assert_two_token_marginals(target, ModelDrafter(drafter_model, share_encoder=True), runs=1000,
                                                max_draft=3)
    q1, _ = _exact_two_token_marginals(drafter_model, [SOT, NO_TS], tiny_rules(False), 11)
    assert tv(p1, q1) > 2 * bound1, "the drafter must differ from the target for this test to have power"
    assert tv(c1, q1) > bound1
