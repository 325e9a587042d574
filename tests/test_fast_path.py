"""CPU fast path of :class:`Linear`: equal to ``F.linear`` for every row count the decoder and
encoder use, deterministic in bf16, and the whole lean decoder still matches transformers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers

from specli.models.layers import Linear
from specli.models.whisper.target import WhisperDims, WhisperTarget
from tiny_models import tiny_target

ROWS = [*range(1, 25), 1500]
# (out, in, bias): whisper-base and tiny.en layer shapes, plus reduced vocabulary heads
SHAPES = [
    (512, 512, True), (2048, 512, True), (512, 2048, True), (5000, 512, False),
    (384, 384, True), (1536, 384, True), (384, 1536, True), (5000, 384, False),
]


def _weights(out_f: int, in_f: int, bias: bool, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g) / in_f**0.5
    return w, (torch.randn(out_f, generator=g) if bias else None)


def _assert_close(got: torch.Tensor, ref: torch.Tensor, rel: float = 1e-4) -> None:
    assert got.shape == ref.shape and got.dtype == ref.dtype
    scale = ref.abs().max().clamp_min(1.0)
    err = (got - ref).abs().max()
    assert err <= rel * scale, f"max error {float(err):.3g} > {rel} * {float(scale):.3g}"


@pytest.mark.parametrize(("out_f", "in_f", "bias"), SHAPES)
def test_fp32_matches_f_linear(out_f: int, in_f: int, bias: bool) -> None:
    w, b = _weights(out_f, in_f, bias)
    lin = Linear(w, b)
    g = torch.Generator().manual_seed(1)
    for m in ROWS:
        x = torch.randn(1, m, in_f, generator=g)
        got = lin(x)
        _assert_close(got, F.linear(x, w, b))
        assert torch.equal(got, lin(x.clone())), m  # deterministic run to run


def test_real_size_vocab_head() -> None:
    w, _ = _weights(51865, 512, False)
    lin = Linear(w, None)
    g = torch.Generator().manual_seed(2)
    for m in range(1, 25):
        x = torch.randn(1, m, 512, generator=g)
        _assert_close(lin(x), F.linear(x, w))


@pytest.mark.parametrize(("out_f", "in_f", "bias"), SHAPES[:4])
def test_bf16_deterministic_and_close(out_f: int, in_f: int, bias: bool) -> None:
    w, b = _weights(out_f, in_f, bias)
    lin = Linear(w.bfloat16(), None if b is None else b.bfloat16())
    g = torch.Generator().manual_seed(3)
    for m in ROWS:
        x = torch.randn(1, m, in_f, generator=g).bfloat16()
        first, second = lin(x), lin(x.clone())
        assert first.dtype == torch.bfloat16
        assert torch.equal(first, second), m
        _assert_close(first.float(), F.linear(x.float(), w, b), rel=3e-2)


def test_shapes_dtype_and_plain_mode() -> None:
    w, b = _weights(96, 64, True)
    x = torch.randn(2, 3, 5, 64)
    assert Linear(w, b)(x).shape == (2, 3, 5, 96)
    assert torch.equal(Linear(w, b, fast=False)(x), F.linear(x, w, b))
    assert Linear.from_weights({"p.weight": w}, "p", torch.float64)(x.double()).dtype == torch.float64
    _assert_close(Linear(w, None)(x[0, 0]), F.linear(x[0, 0], w))
    assert torch.equal(Linear(w, b).weight, w)


@pytest.fixture(scope="module")
def small_model():
    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(
        vocab_size=3000, num_mel_bins=80, d_model=64, encoder_layers=2, encoder_attention_heads=4,
        decoder_layers=2, decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256,
        max_source_positions=1500, max_target_positions=64, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=3,
    )
    hf = transformers.WhisperForConditionalGeneration(cfg).eval()
    target = WhisperTarget(WhisperDims.from_hf_config(cfg.to_dict()), hf.state_dict())
    mel = torch.randn(1, 80, 3000)
    with torch.no_grad():
        enc = hf.model.encoder(mel).last_hidden_state
    return hf, target, mel, enc


def test_encoder_matches_transformers(small_model) -> None:
    hf, target, mel, enc = small_model
    _assert_close(target.encode(mel), enc)


def test_compiled_encoder_matches_eager_and_reports_compile_time(small_model) -> None:
    hf, _, mel, enc = small_model
    target = WhisperTarget(WhisperDims.from_hf_config(hf.config.to_dict()), hf.state_dict())  # its own copy
    eager = target.encode(mel)
    seconds = target.compile_encoder()
    assert target.compiled_encoder is not None and seconds > 0
    out = target.encode(mel)
    _assert_close(out, eager)
    _assert_close(out, enc)


def test_decoder_logits_match_transformers_for_1_to_24_tokens(small_model) -> None:
    hf, target, _mel, enc = small_model
    g = torch.Generator().manual_seed(4)
    prefix = torch.randint(0, 3000, (1, 20), generator=g)
    draft = torch.randint(0, 3000, (1, 24), generator=g)
    with torch.no_grad():
        ref = hf(encoder_outputs=(enc,), decoder_input_ids=torch.cat([prefix, draft], 1)).logits
    state = target.start(enc)
    target.score(state, prefix)
    for n in range(1, 25):
        got = target.score(state, draft[:, :n]).logits
        state.cache.crop(20)
        assert torch.allclose(got, ref[:, 20 : 20 + n], atol=1e-4), n


def _cross_attention_reference(q, k, v):
    """Pure-torch float32 reference of ``layers.cross_attention``: softmax(q kᵀ / sqrt(D)) v on the inputs'
    float32 widening, in float32."""
    scores = q.float() @ k.float().transpose(-1, -2) * q.shape[-1] ** -0.5  # [B, H, n, A]
    return scores.softmax(-1) @ v.float()


@pytest.mark.parametrize("n", [1, 3, 8])
def test_bf16_cross_attention_is_row_invariant_and_near_its_float32_reference(n):
    """bf16 window K/V: each row's result is bit-identical whatever the other rows and the batch size
    (batch-N == batch-1), and within bf16 rounding of the float32 reference: max error <= 1 bf16 ulp of the
    largest output, mean error <= 1 ulp of the mean output (measured ~0.4 of it; softmax and product taken in
    bf16 measured ~3 ulps and fail)."""
    from specli.models.layers import cross_attention

    gen = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(5, 4, m, 64, generator=gen).bfloat16() for m in (n, 1500, 1500))
    k = k * 3
    full = cross_attention(q, k, v)
    assert full.dtype == torch.bfloat16
    for i in range(5):
        assert torch.equal(cross_attention(q[i : i + 1], k[i : i + 1], v[i : i + 1]), full[i : i + 1])
        assert torch.equal(cross_attention(q[i:], k[i:], v[i:])[0], full[i])
    assert torch.equal(cross_attention(q, k, v, per_row=True)[:, :, -1:], cross_attention(q[:, :, -1:], k, v))
    ref = _cross_attention_reference(q, k, v)
    err = (full.float() - ref).abs()
    assert err.max() <= 2**-8 * ref.abs().max()
    assert err.mean() <= 2**-8 * ref.abs().mean()


def test_bf16_target_keeps_window_kv_in_bf16():
    target = tiny_target(0, dtype=torch.bfloat16)
    feats = torch.randn(1, target.dims.audio_ctx, target.dims.d_model).bfloat16()
    state = target.start(feats)
    assert all(k.dtype == v.dtype == torch.bfloat16 and k.is_contiguous() for k, v in state.cross_kv)
    batch = target.start_batch(2)
    target.admit(batch, 1, feats)
    assert all(k.dtype == v.dtype == torch.bfloat16 for k, v in batch.cross_kv)
    assert torch.equal(batch.cross_kv[0][0][1], state.cross_kv[0][0][0])
    out = target.score(state, torch.tensor([[1, 2, 3]]))
    assert out.logits.dtype == torch.float32 and torch.isfinite(out.logits).all()
