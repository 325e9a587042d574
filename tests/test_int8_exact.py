"""int8 (weight-only) targets are their own greedy reference: a verified chain is computed row by row exactly as
one-token steps compute it, so speculative greedy decoding gives int8 AR's tokens bit for bit, and speculative
sampling keeps the int8 target's distribution.

Why it holds: the int8 kernel (``layers.Int8Linear``, ATen's ``_weight_int8pack_mm``) computes each output row
from its own input row in the same order whatever the number of rows (checked here bit for bit), and the
target scores a chain's attention row by row as for bf16 (``WhisperTarget.exact_rows``).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import examples

import specli.core.device as device
from specli.asr.drafters.model import ModelDrafter
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob
from specli.core.speculative import SpecOptions, speculative_decode
from specli.errors import PresetError, UsageError
from specli.models.layers import Int8Linear, quantize_int8
from specli.presets import preset_from_dict
from test_bf16_exact import ListDrafter
from test_sampling import _exact_two_token_marginals, assert_two_token_marginals, tv
from tiny_models import EOT, NO_TS, SOT, AlwaysWrongDrafter, tiny_rules, tiny_target, window

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
    assert not isinstance(TARGET.enc_blocks[0].fc1, Int8Linear)  # the encoder stays float


def _chain_equals_steps(target) -> None:
    prompt = [SOT, NO_TS]
    ref = greedy_decode(target, window(target, 4), DecodeJob(prompt, tiny_rules(False), EOT, 40)).tokens
    for start in range(0, 30, 3):
        for n in range(2, 8):
            chain = ref[start : start + n]
            state = window(target, 4)
            target.score(state, torch.tensor([prompt + ref[:start]]))
            together = target.score(state, torch.tensor([chain])).logits[0]
            state = window(target, 4)
            target.score(state, torch.tensor([prompt + ref[:start]]))
            steps = torch.cat([target.score(state, torch.tensor([[t]])).logits[0] for t in chain])
            assert torch.equal(together, steps), (start, n)


def test_scoring_a_chain_equals_one_token_steps_bit_for_bit():
    _chain_equals_steps(TARGET)


# a token tree: node i's parent (-1: a root on the cached prefix), in topological order as drafters build them
PARENTS = [-1, 0, 0, 1, 1, 2, 3, 3, 5, 6, 8]


def _path(node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = PARENTS[node]
    return path[::-1]


@pytest.mark.parametrize("dtype", [torch.int8, torch.bfloat16])
@pytest.mark.parametrize("start", [0, 5, 17])
def test_scoring_a_tree_equals_one_token_steps_along_each_path(dtype, start):
    """Trees (sparse-tree, dynamic-tree, recycling presets): each node's logits are those of one-token steps along
    its root-to-node path, bit for bit, so tree speculation at int8 (and bf16) is lossless against AR too."""
    target = TARGET if dtype == torch.int8 else tiny_target(0, dtype=dtype)
    prompt = [SOT, NO_TS]
    ref = greedy_decode(target, window(target, 4), DecodeJob(prompt, tiny_rules(False), EOT, 40)).tokens
    prefix = torch.tensor([prompt + ref[:start]])
    g = torch.Generator().manual_seed(start)
    tokens = [ref[start + len(_path(i)) - 1] if i in _path(len(PARENTS) - 1) else int(torch.randint(6, 36, (1,),
              generator=g)) for i in range(len(PARENTS))]
    mask = torch.tensor([[j in _path(i) for j in range(len(PARENTS))] for i in range(len(PARENTS))])
    depth = torch.tensor([len(_path(i)) - 1 for i in range(len(PARENTS))])
    state = window(target, 4)
    target.score(state, prefix)
    base = prefix.shape[1]
    tree = target.score(state, torch.tensor([tokens]), positions=(base + depth)[None], tree_mask=mask[None]).logits[0]
    for node in range(len(PARENTS)):
        state = window(target, 4)
        target.score(state, prefix)
        for j in _path(node):
            step = target.score(state, torch.tensor([[tokens[j]]])).logits[0, 0]
        assert torch.equal(tree[node], step), node


def test_float32_activations_too(monkeypatch):
    """CPUs without native bf16: activations float32, the kernel still fed bf16; still exact row by row."""
    monkeypatch.setattr(device, "cpu_native_bf16", lambda: False)
    target = tiny_target(0, dtype=torch.int8)
    assert target.compute_dtype == torch.float32 and target.proj_out.kernel_dtype == torch.bfloat16
    _chain_equals_steps(target)


@examples(30)
@given(seed=st.integers(0, 40), kind=st.sampled_from(["right", "wrong", "random"]), max_draft=st.integers(1, 9),
       timestamps=st.booleans())
def test_int8_speculative_greedy_equals_int8_greedy(seed, kind, max_draft, timestamps):
    prompt = [SOT] if timestamps else [SOT, NO_TS]
    rules = tiny_rules(timestamps)
    ref = greedy_decode(TARGET, window(TARGET, seed), DecodeJob(prompt, rules, EOT, 40))
    drafter = AlwaysWrongDrafter() if kind == "wrong" else ListDrafter(kind, ref.tokens, seed)
    out = speculative_decode(TARGET, window(TARGET, seed), DecodeJob(prompt, rules, EOT, 40), drafter,
                             SpecOptions(max_draft=max_draft))
    assert out.tokens == ref.tokens and out.finished == ref.finished


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
