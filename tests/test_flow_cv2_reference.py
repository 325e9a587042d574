"""specli's CosyVoice2 flow (``specli/tts/acoustic/flow_cv2.py``) against a reference of upstream's, forward by forward.

The reference (``tests/flow_cv2_reference.py``) runs diffusers 0.29.0's ``Attention`` / ``GELU`` /
``LoRACompatibleLinear`` / ``get_activation`` where Matcha-TTS's U-Net does, and transcribes upstream's own
encoder, U-Net glue, masks and CFM solver. Both load the same random tiny ``flow.pt`` (upstream's key layout,
``tests/flow_fixtures.py``). Float32; every comparison is ``assert_close`` with ``atol = rtol = 1e-5`` (the two
agree bit for bit today, at 1 and at 2 threads).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

diffusers = pytest.importorskip("diffusers", reason="diffusers (dev extra) is the estimator's reference library")

from flow_cv2_reference import build_reference_flow, mask_to_bias  # noqa: E402
from flow_fixtures import TINY_CV2, official_cv2_flow_state  # noqa: E402

from specli.tts.acoustic.cfm import chunk_attention_mask  # noqa: E402
from specli.tts.acoustic.flow import load_flow  # noqa: E402
from specli.tts.acoustic.flow_cv2 import EncoderConfig, FlowCV2Config, UNetConfig, relative_positions  # noqa: E402

SIZES = {**TINY_CV2, "n_blocks": 2}  # two transformer blocks per U-Net level: their stacking is compared too
ATOL = RTOL = 1e-5
TOKENS = 19  # 4 chunks of 4 tokens + 3: the last attention chunk is ragged


def _config(s: dict[str, int]) -> FlowCV2Config:
    encoder = EncoderConfig(output_size=s["d"], attention_heads=s["heads"], linear_units=s["units"],
                            num_blocks=s["blocks"], static_chunk_size=s["chunk"])
    unet = UNetConfig(channels=s["c"], attention_head_dim=s["head_dim"], num_heads=s["unet_heads"],
                      n_blocks=s["n_blocks"], num_mid_blocks=s["mid"], static_chunk_size=s["unet_chunk"])
    return FlowCV2Config(input_size=s["d"], encoder=encoder, unet=unet)


@pytest.fixture(scope="module")
def flows(tmp_path_factory: pytest.TempPathFactory):
    """(specli's flow through its loader, the reference) on one random checkpoint."""
    state = official_cv2_flow_state(seed=7, sizes=SIZES)
    path = Path(tmp_path_factory.mktemp("cv2_reference")) / "flow.pt"
    torch.save(state, path)
    ours = load_flow(path, _config(SIZES))
    ref = build_reference_flow(SIZES)
    ref.load_state_dict(state, strict=True)  # the same keys and shapes as specli's
    return ours, ref.requires_grad_(False)


def _close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=RTOL)


def test_reference_library_is_upstreams_pin() -> None:
    assert diffusers.__version__ == "0.29.0"  # FunAudioLLM/CosyVoice requirements.txt


@pytest.mark.parametrize("streaming", [False, True], ids=["full", "chunked"])
@pytest.mark.parametrize("context", [False, True], ids=["finalize", "lookahead_context"])
def test_encoder_mu(flows, streaming: bool, context: bool) -> None:
    """``encoder_proj(UpsampleConformerEncoder(...))``: full or chunk-causal attention, zero or real look-ahead."""
    ours, ref = flows
    ids = torch.randint(0, 6561, (1, TOKENS), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        emb = ours.input_embedding(ids)  # [1, N, d]
        x, ctx = (emb[:, :-3], emb[:, -3:]) if context else (emb, None)
        mu = ours.encode_tokens(x, ctx, streaming)  # [1, 2 N', 80]
        h, _ = ref.encoder(x, torch.tensor([TOKENS]), context=ctx, streaming=streaming)
        expected = ref.encoder_proj(h)
    assert mu.shape == (1, 2 * x.shape[1], 80)
    _close(mu, expected)


@pytest.mark.parametrize("streaming", [False, True], ids=["full", "chunked"])
def test_estimator_velocity(flows, streaming: bool) -> None:
    """The U-Net on a CFG-like batch of two: other t / speaker / condition per row, the second row padded."""
    ours, ref = flows
    g, frames = torch.Generator().manual_seed(2), 21  # 2 chunks of 8 frames + 5
    x, mu, cond = (torch.randn(2, 80, frames, generator=g) for _ in range(3))
    mask = torch.ones(2, 1, frames)
    mask[1, :, 15:] = 0
    t, spks = torch.tensor([0.3, 0.8]), torch.randn(2, 80, generator=g)
    with torch.inference_mode():
        velocity = ours.decoder.estimator(x, mask, mu, t, spks, cond, streaming=streaming)  # [2, 80, T]
        expected = ref.decoder.estimator(x, mask, mu, t, spks, cond, streaming=streaming)
    assert bool(expected.abs().amax() > 0.5)  # not vacuous
    _close(velocity, expected)


@pytest.mark.parametrize(("streaming", "finalize"), [(False, True), (True, False)], ids=["offline", "stream_chunk"])
def test_inference_mel(flows, streaming: bool, finalize: bool) -> None:
    """Prompt + tokens -> mel: embedding, encoder, speaker projection, 10 cosine Euler steps with CFG."""
    ours, ref = flows
    g, prompt = torch.Generator().manual_seed(3), 4
    tokens, ptok = torch.randint(0, 6561, (1, TOKENS), generator=g), torch.randint(0, 6561, (1, prompt), generator=g)
    pmel, xvec = torch.randn(1, 2 * prompt, 80, generator=g) - 4, torch.randn(1, 192, generator=g)
    mel = ours.inference(tokens, ptok, pmel, xvec, streaming=streaming, finalize=finalize)
    expected = ref.inference(tokens, torch.tensor([TOKENS]), ptok, torch.tensor([prompt]), pmel, xvec,
                             streaming=streaming, finalize=finalize)
    assert mel.shape == (1, 80, 2 * (TOKENS - (0 if finalize else 3)))
    _close(mel, expected)


@pytest.mark.parametrize("scale", [1.0, 1e-3])
def test_conformer_layer(flows, scale: float) -> None:
    """One encoder layer on its own (chunk mask, unit and small activations: the LayerNorm eps matters there)."""
    ours, ref = flows
    n, d = 11, SIZES["d"]
    x = torch.randn(2, n, d, generator=torch.Generator().manual_seed(4)) * scale
    mask = chunk_attention_mask(torch.ones(2, 1, n), SIZES["chunk"])  # [2, 1, T, T]
    with torch.inference_mode():
        out = ours.encoder.encoders[1](x, mask, relative_positions(n, d, x.device))
        expected = ref.encoder.encoders[1](x, mask[:, 0], ref.encoder.embed.pos_enc.position_encoding(0, n))
    _close(out, expected)


def test_unet_blocks(flows) -> None:
    """A causal ResNet block (padded mask) and a transformer block (chunk mask) of the middle of the U-Net."""
    ours, ref = flows
    g, c, frames = torch.Generator().manual_seed(5), SIZES["c"], 13
    x, temb = torch.randn(2, c, frames, generator=g), torch.randn(2, 4 * c, generator=g)
    mask = torch.ones(2, 1, frames)
    mask[0, :, 9:] = 0
    chunk = chunk_attention_mask(mask, SIZES["unet_chunk"])  # [2, 1, T, T]
    h = x.transpose(1, 2)  # [B, T, C]
    resnet, blocks = ours.decoder.estimator.mid_blocks[1]
    ref_resnet, ref_blocks = ref.decoder.estimator.mid_blocks[1]
    with torch.inference_mode():
        _close(resnet(x, mask, temb), ref_resnet(x, mask, temb))  # [B, C, T]
        out = blocks[0](h, chunk)  # [B, T, C]
        expected = ref_blocks[0](h, attention_mask=mask_to_bias(chunk[:, 0], h.dtype))
    _close(out, expected)
