"""CosyVoice2/3 flow stage ports: official key layouts, yaml config, CFM solver, streaming causality, bad files."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from acoustic_fixtures import tiny_hift_config, write_hift
from flow_fixtures import TINY, TINY_CV2_FLOW_YAML, TINY_FLOW_YAML, official_cv2_flow_state, official_flow_state

from specli.tts.acoustic.cfm import CFMSettings, drop_silent_runs, fixed_noise, solve_cfm
from specli.tts.acoustic.flow import flow_config, load_flow
from specli.tts.acoustic.flow_cv2 import FlowCV2Config, rel_shift, relative_positions
from specli.tts.acoustic.flow_cv3 import FlowCV3Config, _apply_rotary
from specli.tts.acoustic.hift import load_hift
from specli.models.cosyvoice.yaml import read_hyperpyyaml
from specli.errors import ModelLoadError

_HEADER = "spk_embed_dim: 192\ntoken_frame_rate: 25\ntoken_mel_ratio: 2\nchunk_size: 25\nnum_decoding_left_chunks: -1\n"


KINDS = ("cosyvoice2", "cosyvoice3")
_YAML = {"cosyvoice2": TINY_CV2_FLOW_YAML, "cosyvoice3": TINY_FLOW_YAML}
_STATE = {"cosyvoice2": official_cv2_flow_state, "cosyvoice3": official_flow_state}


def _tiny_config(tmp_path: Path, kind: str = "cosyvoice3"):
    (tmp_path / f"{kind}.yaml").write_text(_HEADER + _YAML[kind])
    node = read_hyperpyyaml(tmp_path / f"{kind}.yaml")["flow"]
    return flow_config(node, "cosyvoice3", tmp_path / f"{kind}.yaml")  # the yaml's class decides


@pytest.fixture(scope="module", params=KINDS)
def tiny(request, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("flow")
    cfg = _tiny_config(root, request.param)
    torch.save(_STATE[request.param](), root / "flow.pt")
    return load_flow(root / "flow.pt", cfg), cfg


def _inputs(n: int, prompt: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 6561, (1, n), generator=g), torch.randint(0, 6561, (1, prompt), generator=g),
            torch.randn(1, 2 * prompt, 80, generator=g) - 4, torch.randn(1, 192, generator=g))


def test_yaml_config_tiny_and_published(tmp_path: Path) -> None:
    cfg = _tiny_config(tmp_path)
    assert (cfg.dit.dim, cfg.dit.depth, cfg.dit.heads, cfg.dit.dim_head) == (32, 2, 2, 16)
    assert cfg.lookahead_channels == 24 and cfg.pre_lookahead_len == 3 and cfg.token_mel_ratio == 2
    assert cfg.dit.static_chunk_size == TINY["chunk"] and cfg.cfm == CFMSettings()
    published = TINY_FLOW_YAML.replace("channels: 24", "channels: 1024").replace("dim: 32", "dim: 1024")
    published = published.replace("depth: 2", "depth: 22").replace("heads: 2", "heads: 16")
    published = published.replace("dim_head: 16", "dim_head: 64")
    published = published.replace(f"static_chunk_size: {TINY['chunk']}", "static_chunk_size: !ref <chunk_size> * "
                                                                          "<token_mel_ratio>")
    (tmp_path / "p.yaml").write_text(_HEADER + published)
    assert flow_config(read_hyperpyyaml(tmp_path / "p.yaml")["flow"], "cosyvoice3") == FlowCV3Config()
    assert FlowCV3Config().dit.static_chunk_size == 50 and FlowCV3Config().cfm.inference_cfg_rate == 0.7


def test_cv2_yaml_config_and_unsupported_settings(tmp_path: Path) -> None:
    cfg = _tiny_config(tmp_path, "cosyvoice2")
    assert isinstance(cfg, FlowCV2Config) and cfg.encoder.output_size == 32 and cfg.encoder.num_blocks == 2
    assert (cfg.unet.channels, cfg.unet.num_heads, cfg.unet.num_mid_blocks, cfg.unet.static_chunk_size) == (16, 2, 2, 8)
    assert flow_config(None, "cosyvoice2") == FlowCV2Config()
    assert (FlowCV2Config().encoder.output_size, FlowCV2Config().unet.channels) == (512, 256)
    for old, new, why in (("channels: [16]", "channels: [16, 16]", "single U-Net level"),
                          ("use_cnn_module: False", "use_cnn_module: True", "use_cnn_module"),
                          ("solver: 'euler'", "solver: 'midpoint'", "solver 'midpoint'")):
        (tmp_path / "bad.yaml").write_text(_HEADER + TINY_CV2_FLOW_YAML.replace(old, new))
        with pytest.raises(ModelLoadError, match=why):
            flow_config(read_hyperpyyaml(tmp_path / "bad.yaml")["flow"], "cosyvoice2", tmp_path / "bad.yaml")


def test_rel_shift_and_positions_match_espnet() -> None:
    """The gather form of rel_shift equals upstream's pad-and-reshape trick; the sinusoids equal ESPnet's table."""
    x = torch.randn(2, 3, 5, 9)
    padded = torch.cat([torch.zeros(2, 3, 5, 1), x], dim=-1).view(2, 3, 10, 5)
    trick = padded[:, :, 1:].reshape(2, 3, 5, 9)[:, :, :, :5]
    assert torch.equal(rel_shift(x), trick)
    d, max_len, n = 8, 50, 5
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * -(math.log(10000.0) / d))
    plus, minus = torch.zeros(max_len, d), torch.zeros(max_len, d)
    plus[:, 0::2], plus[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
    minus[:, 0::2], minus[:, 1::2] = torch.sin(-1 * pos * div), torch.cos(-1 * pos * div)
    table = torch.cat([plus.flip(0), minus[1:]])[None]
    center = table.shape[1] // 2
    assert torch.equal(relative_positions(n, d, torch.device("cpu")), table[:, center - n + 1: center + n])


def test_official_keys_load_and_run(tiny) -> None:
    flow, cfg = tiny
    assert set(flow.state_dict()) == set(_STATE[flow.kind]())
    tokens, ptok, pmel, emb = _inputs(13)
    mel = flow.inference(tokens, ptok, pmel, emb)
    assert mel.shape == (1, 80, 26) and mel.dtype == torch.float32 and bool(torch.isfinite(mel).all())
    assert torch.equal(mel, flow.inference(tokens, ptok, pmel, emb))  # fixed noise: deterministic
    bare = flow.inference(tokens, ptok[:, :0], pmel[:, :0], torch.zeros(1, 192))  # no prompt, no speaker
    assert bare.shape == (1, 80, 26) and not torch.allclose(bare, mel)


def test_fixed_noise_is_upstreams_seed0_buffer() -> None:
    torch_state = torch.get_rng_state()
    torch.manual_seed(0)
    upstream = torch.randn([1, 80, 50 * 300])  # what CausalConditionalCFM draws after set_all_random_seed(0)
    torch.set_rng_state(torch_state)
    assert torch.equal(fixed_noise(700, "cpu", torch.float32), upstream[:, :, :700])
    with pytest.raises(ValueError, match="fixed noise buffer"):
        fixed_noise(15001, "cpu", torch.float32)


def test_cfm_euler_cosine_schedule_and_guidance() -> None:
    """With an estimator whose velocity is constant per row the result is checkable by hand."""
    seen: list[torch.Tensor] = []

    def estimator(x, mask, mu, t, spks, cond):
        seen.append(t.clone())
        assert x.shape == (2, 80, 6) and torch.equal(x[0], x[1])  # CFG: the same x in both rows
        assert torch.equal(mu[1], torch.zeros_like(mu[1])) and torch.equal(spks[1], torch.zeros_like(spks[1]))
        assert torch.equal(cond[1], torch.zeros_like(cond[1])) and torch.equal(mu[0], mu_in[0])
        return torch.stack([torch.full((80, 6), 2.0), torch.full((80, 6), -1.0)])

    mu_in = torch.randn(1, 80, 6)
    out = solve_cfm(estimator, mu_in, torch.ones(1, 1, 6), torch.randn(1, 80), torch.randn(1, 80, 6), CFMSettings())
    expected = fixed_noise(6, "cpu", torch.float32) + (1.7 * 2.0 + 0.7 * 1.0)  # sum of dt over [0, 1] is 1
    assert torch.allclose(out, expected, atol=1e-5)
    schedule = [1 - math.cos(k / 10 * math.pi / 2) for k in range(10)]
    assert [round(float(t[0]), 5) for t in seen] == [round(s, 5) for s in schedule]


def test_rotary_covers_only_the_first_head_width() -> None:
    """x-transformers applies the dim_head-wide rotation to the un-split projection: channels past it pass;
    inside it, adjacent channels (2i, 2i + 1) turn together by frequency i."""
    x = torch.randn(1, 5, 48)
    inv = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    pos = torch.arange(5).float()[:, None] * inv[None]  # [5, 8]
    angles = pos.repeat_interleave(2, dim=-1)
    out = _apply_rotary(x, angles)
    assert torch.equal(out[..., 16:], x[..., 16:])
    a, b = x[..., 0:16:2], x[..., 1:16:2]
    assert torch.allclose(out[..., 0:16:2], a * pos.cos() - b * pos.sin(), atol=1e-6)
    assert torch.allclose(out[..., 1:16:2], b * pos.cos() + a * pos.sin(), atol=1e-6)


def test_streaming_prefix_is_causal(tiny) -> None:
    """Upstream's streaming contract: chunk-aligned tokens + 3 look-ahead tokens -> a prefix of the mel."""
    flow, cfg = tiny
    chunk_tokens = 4  # tiny configs: 4-token / 8-frame chunks (CV3 DiT; CV2 encoder, upsampled part, U-Net)
    tokens, ptok, pmel, emb = _inputs(20, prompt=chunk_tokens, seed=1)
    full = flow.inference(tokens, ptok, pmel, emb, streaming=True)
    for k in (4, 8, 12):
        part = flow.inference(tokens[:, : k + 3], ptok, pmel, emb, streaming=True, finalize=False)
        assert part.shape[2] == 2 * k
        assert torch.allclose(part, full[:, :, : 2 * k], atol=1e-4, rtol=0)
    ragged = flow.inference(tokens[:, :9], ptok, pmel, emb, streaming=True, finalize=False)  # ends mid-chunk
    assert not torch.allclose(ragged, full[:, :, :12], atol=1e-3)
    offline = flow.inference(tokens[:, :11], ptok, pmel, emb, finalize=False)  # full attention: not causal
    assert not torch.allclose(offline, flow.inference(tokens, ptok, pmel, emb)[:, :, :16], atol=1e-3)


def test_flow_and_causal_hift_stream_a_prefix(tmp_path: Path) -> None:
    """CosyVoice3 (whose HiFT is causal): streamed flow chunks + finalize=False vocoding = a prefix of the audio."""
    torch.save(official_flow_state(), tmp_path / "flow.pt")
    flow = load_flow(tmp_path / "flow.pt", _tiny_config(tmp_path))
    hift = load_hift(write_hift(tmp_path / "hift.pt", tiny_hift_config("cosyvoice3"), "param"),
                     tiny_hift_config("cosyvoice3"))
    tokens, ptok, pmel, emb = _inputs(16, prompt=4, seed=2)
    full_mel = flow.inference(tokens, ptok, pmel, emb, streaming=True)
    full_audio = hift.vocode(full_mel, torch.Generator().manual_seed(5))
    part_mel = flow.inference(tokens[:, :11], ptok, pmel, emb, streaming=True, finalize=False)  # 8 tokens
    part_audio = hift.vocode(part_mel, torch.Generator().manual_seed(5), finalize=False)
    assert part_audio.shape[1] == (16 - hift.cfg.held_back_frames) * 480
    assert torch.allclose(part_audio, full_audio[:, : part_audio.shape[1]], atol=1e-4, rtol=0)


def test_drop_silent_runs_keeps_five_in_a_row() -> None:
    silent, voiced = 2241, 7
    seq = [voiced] + [silent] * 8 + [voiced] + [1, 2, 28, 29, 55, 248] + [voiced]
    assert drop_silent_runs(seq) == [voiced] + [silent] * 5 + [voiced] + [1, 2, 28, 29, 55] + [voiced]
    assert drop_silent_runs([voiced] * 9) == [voiced] * 9


def test_bad_checkpoints(tmp_path: Path) -> None:
    cfg = _tiny_config(tmp_path)
    assert isinstance(cfg, FlowCV3Config)
    good = official_flow_state()
    path = tmp_path / "flow.pt"
    torch.save(good, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"flow\.pt: unreadable checkpoint"):
        load_flow(path, cfg)
    missing = dict(good)
    del missing["decoder.estimator.transformer_blocks.1.attn.to_k.bias"]
    torch.save(missing, path)
    with pytest.raises(ModelLoadError, match=r"flow\.pt: missing key 'decoder\.estimator\.transformer_blocks\.1"
                                             r"\.attn\.to_k\.bias'"):
        load_flow(path, cfg)
    wrong = dict(good, **{"pre_lookahead_layer.conv1.weight": torch.zeros(24, 80, 3)})
    torch.save(wrong, path)
    with pytest.raises(ModelLoadError, match=r"key 'pre_lookahead_layer\.conv1\.weight' has shape \(24, 80, 3\)"):
        load_flow(path, cfg)
    torch.save(dict(good, extra=torch.zeros(1)), path)
    with pytest.raises(ModelLoadError, match="unexpected key 'extra'"):
        load_flow(path, cfg)
    with pytest.raises(ModelLoadError, match="flow checkpoint not found|not found"):
        load_flow(tmp_path / "nope.pt", cfg)
    torch.save(good, path)
    with pytest.raises(ModelLoadError, match="missing key"):  # a checkpoint of other sizes than the yaml's
        load_flow(path, FlowCV3Config(lookahead_channels=24).scaled(dim=32, depth=3, heads=2, dim_head=16))


def test_cv2_checkpoint_is_not_a_cv3_one(tmp_path: Path) -> None:
    torch.save(official_cv2_flow_state(), tmp_path / "flow.pt")
    with pytest.raises(ModelLoadError, match=r"flow\.pt: missing key 'pre_lookahead_layer"):
        load_flow(tmp_path / "flow.pt", _tiny_config(tmp_path, "cosyvoice3"))
    cv2 = _tiny_config(tmp_path, "cosyvoice2")
    state = official_cv2_flow_state()
    state["encoder.encoders.1.self_attn.pos_bias_u"] = torch.zeros(4, 8)
    torch.save(state, tmp_path / "flow.pt")
    with pytest.raises(ModelLoadError, match=r"'encoder\.encoders\.1\.self_attn\.pos_bias_u' has shape \(4, 8\)"):
        load_flow(tmp_path / "flow.pt", cv2)


def test_unmasked_fast_path_equals_the_masked_one(tiny) -> None:
    """Offline attention skips the all-true mask (fused SDPA); a chunk longer than the input gives the same mask."""
    from dataclasses import replace

    flow, cfg = tiny
    est = flow.decoder.estimator
    wide_cfg = replace(est.cfg, static_chunk_size=10**6)
    wide = type(est)(wide_cfg)
    wide.load_state_dict(est.state_dict())
    g = torch.Generator().manual_seed(3)
    x, mu, cond = (torch.randn(2, 80, 21, generator=g) for _ in range(3))
    args = (x, torch.ones(2, 1, 21), mu, torch.tensor([0.1, 0.1]), torch.randn(2, 80, generator=g), cond)
    with torch.inference_mode():
        assert torch.allclose(est(*args), wide(*args, streaming=True), atol=1e-5)
