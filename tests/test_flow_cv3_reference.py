"""CosyVoice3 flow port vs upstream's numbers: x-transformers' rotary, and a transcription of upstream's DiT,
PreLookaheadLayer, CFM solver and ``CausalMaskedDiffWithDiT.inference`` (``tests/flow_cv3_reference.py``).

The rotary, DiT and whole-stage comparisons fail with the half-split rotary layout specli had before
(frequencies ``cat([f, f])``, ``rotate_half`` over the two halves; checked by hand: 8 of 11 tests fail, the mel
by ~1e-1): x-transformers pairs adjacent channels.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from flow_cv3_reference import FlowCV3Reference
from flow_fixtures import TINY, TINY_FLOW_YAML, official_flow_state
from x_transformers.x_transformers import RotaryEmbedding, apply_rotary_pos_emb

from specli.tts.acoustic.cfm import NOISE_FRAMES, fixed_noise
from specli.tts.acoustic.flow import flow_config, load_flow
from specli.tts.acoustic.flow_cv3 import _apply_rotary, _Rotary
from specli.models.cosyvoice.yaml import read_hyperpyyaml

# float32 through 2 tiny DiT blocks x 10 Euler steps x CFG: observed differences are ~1e-6 (summation order of
# SDPA and convs); 2e-5 leaves room for other thread counts while a layout error shows up as ~1e-1.
ATOL = 2e-5
_HEADER = "spk_embed_dim: 192\ntoken_frame_rate: 25\ntoken_mel_ratio: 2\nchunk_size: 25\nnum_decoding_left_chunks: -1\n"
_DIT = {"dim": TINY["dim"], "depth": TINY["depth"], "heads": TINY["heads"], "dim_head": TINY["dim_head"],
        "ff_mult": TINY["ff_mult"], "static_chunk_size": TINY["chunk"]}


@pytest.fixture(scope="module")
def flows(tmp_path_factory: pytest.TempPathFactory):
    """specli's FlowCV3 and the reference, loaded (strictly) from the same random official ``flow.pt``."""
    root = tmp_path_factory.mktemp("cv3ref")
    (root / "cosyvoice3.yaml").write_text(_HEADER + TINY_FLOW_YAML)
    state = official_flow_state(seed=3)
    torch.save(state, root / "flow.pt")
    cfg = flow_config(read_hyperpyyaml(root / "cosyvoice3.yaml")["flow"], "cosyvoice3")
    ours = load_flow(root / "flow.pt", cfg)
    noise = torch.randn(1, 80, NOISE_FRAMES, generator=torch.Generator().manual_seed(0))  # set_all_random_seed(0)
    ref = FlowCV3Reference(_DIT, TINY["lookahead"], noise).eval()
    ref.load_state_dict(state, strict=True)
    return ours, ref


def _estimator_inputs(frames: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x, mu, cond = (torch.randn(2, 80, frames, generator=g) for _ in range(3))
    return x, mu, torch.rand(2, generator=g), torch.randn(2, 80, generator=g), cond


def test_upstream_noise_is_specli_fixed_noise(flows) -> None:
    _, ref = flows
    assert torch.equal(fixed_noise(50, "cpu", torch.float32), ref.noise[:, :, :50])


@pytest.mark.parametrize("dim_head,width", [(16, 48), (64, 64)])
def test_rotary_equals_x_transformers(dim_head: int, width: int) -> None:
    """Angles and rotation equal x-transformers' ``RotaryEmbedding`` + ``apply_rotary_pos_emb`` (partial rotary
    on the first ``dim_head`` channels of the un-split projection, as upstream's DiT calls it)."""
    x = torch.randn(2, 37, width, generator=torch.Generator().manual_seed(1))
    ours = _Rotary(dim_head)
    theirs = RotaryEmbedding(dim_head)
    assert torch.equal(ours.inv_freq, theirs.inv_freq)
    freqs, scale = theirs.forward_from_seq_len(37)
    assert scale == 1.0
    assert torch.allclose(ours(37), freqs[0], atol=0, rtol=0)
    assert torch.allclose(_apply_rotary(x, ours(37)), apply_rotary_pos_emb(x, freqs, scale), atol=1e-6, rtol=0)


@pytest.mark.parametrize("streaming", [False, True])
def test_dit_velocity_equals_upstream(flows, streaming: bool) -> None:
    ours, ref = flows
    x, mu, t, spks, cond = _estimator_inputs(29, seed=2)
    mask = torch.ones(2, 1, 29)
    with torch.no_grad():
        got = ours.decoder.estimator(x, mask, mu, t, spks, cond, streaming=streaming)
        want = ref.decoder.estimator(x, mask, mu, t, spks, cond, streaming=streaming)
    assert got.shape == want.shape == (2, 80, 29)
    assert (got - want).abs().max() < ATOL


def test_dit_padded_rows_equal_upstream(flows) -> None:
    """A batch whose second row is padded after 17 frames: padded keys hidden, padded query rows zeroed."""
    ours, ref = flows
    x, mu, t, spks, cond = _estimator_inputs(24, seed=4)
    mask = torch.ones(2, 1, 24)
    mask[1, :, 17:] = 0
    for streaming in (False, True):
        with torch.no_grad():
            got = ours.decoder.estimator(x, mask, mu, t, spks, cond, streaming=streaming)
            want = ref.decoder.estimator(x, mask, mu, t, spks, cond, streaming=streaming)
        assert (got - want).abs().max() < ATOL


def test_pre_lookahead_equals_upstream(flows) -> None:
    ours, ref = flows
    emb = torch.randn(1, 11, 80, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.allclose(ours.pre_lookahead_layer(emb), ref.pre_lookahead_layer(emb), atol=1e-6, rtol=0)
        got = ours.pre_lookahead_layer(emb[:, :-3], context=emb[:, -3:])
        assert torch.allclose(got, ref.pre_lookahead_layer(emb[:, :-3], context=emb[:, -3:]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("streaming,finalize", [(False, True), (True, True), (True, False)])
def test_flow_inference_mel_equals_upstream(flows, streaming: bool, finalize: bool) -> None:
    """The whole stage: prompt tokens + tokens -> pre-lookahead -> x2 -> 10 cosine Euler steps with CFG 0.7."""
    ours, ref = flows
    g = torch.Generator().manual_seed(6)
    tokens, ptok = torch.randint(0, 6561, (1, 14), generator=g), torch.randint(0, 6561, (1, 4), generator=g)
    pmel, emb = torch.randn(1, 8, 80, generator=g) - 4, torch.randn(1, 192, generator=g)
    got = ours.inference(tokens, ptok, pmel, emb, streaming=streaming, finalize=finalize)
    want = ref.inference(tokens, ptok, pmel, emb, streaming=streaming, finalize=finalize)
    assert got.shape == want.shape == (1, 80, 2 * (14 if finalize else 11))
    assert (got - want).abs().max() < ATOL


def test_yaml_flow_is_the_reference_sizes(tmp_path: Path) -> None:
    (tmp_path / "cosyvoice3.yaml").write_text(_HEADER + TINY_FLOW_YAML)
    cfg = flow_config(read_hyperpyyaml(tmp_path / "cosyvoice3.yaml")["flow"], "cosyvoice3")
    assert (cfg.dit.dim, cfg.dit.depth, cfg.dit.heads, cfg.dit.dim_head, cfg.dit.static_chunk_size) == (
        _DIT["dim"], _DIT["depth"], _DIT["heads"], _DIT["dim_head"], _DIT["static_chunk_size"])
