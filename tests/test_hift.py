"""HiFT vocoder port: official key layouts, lengths, determinism, CV3 causal streaming, bad checkpoints."""

from __future__ import annotations

import pickle
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from acoustic_fixtures import official_hift_state, tiny_hift_config, write_hift
from flow_fixtures import hift_yaml
from torch import nn

from specli.tts.acoustic.checkpoint import fold_weight_norm
from specli.tts.acoustic.hift import HiFT, HiFTConfig, load_hift
from specli.models.cosyvoice.yaml import read_hyperpyyaml
from specli.errors import ModelLoadError

KINDS = ("cosyvoice2", "cosyvoice3")


def _mel(frames: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(1, 80, frames, generator=torch.Generator().manual_seed(seed)) - 3.0


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("kind", KINDS)
def test_all_key_styles_load_and_agree(tmp_path: Path, kind: str) -> None:
    """weight_g/weight_v, parametrizations.weight.original0/1 and plain weights give the same vocoder."""
    cfg = tiny_hift_config(kind)
    outs = []
    for style, prefix in (("old", "generator."), ("param", ""), ("plain", "")):
        model = load_hift(write_hift(tmp_path / f"{style}.pt", cfg, style, prefix=prefix), cfg)
        audio = model.vocode(_mel(9), _gen())
        assert audio.shape == (1, 9 * 480) and audio.dtype == torch.float32
        assert float(audio.abs().max()) <= 0.99 and float(audio.abs().max()) > 0.0
        outs.append(audio)
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(outs[2], outs[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_output_length_is_480_per_frame(tmp_path: Path, kind: str) -> None:
    model = load_hift(write_hift(tmp_path / "hift.pt", tiny_hift_config(kind)), tiny_hift_config(kind))
    assert model.sample_rate == 24000 and model.cfg.samples_per_frame == 480
    for frames in (1, 2, 7, 20):
        assert model.vocode(_mel(frames), _gen()).shape == (1, frames * 480)
    assert model.vocode(_mel(5).repeat(2, 1, 1), _gen()).shape == (2, 5 * 480)


def test_fold_matches_torch_weight_norm() -> None:
    """Both of torch's weight-norm key styles fold to the module's effective weight (Conv and ConvTranspose)."""
    torch.manual_seed(0)
    for make in (lambda: nn.Conv1d(6, 4, 3), lambda: nn.ConvTranspose1d(6, 4, 5, 2)):
        new = nn.utils.parametrizations.weight_norm(make())
        with torch.no_grad():
            new.parametrizations.weight.original0.mul_(1.7)
        state = {f"layer.{k}": v for k, v in new.state_dict().items()}
        assert "layer.parametrizations.weight.original0" in state
        folded = fold_weight_norm(state, "x.pt")
        torch.testing.assert_close(folded["layer.weight"], new.weight.detach(), rtol=1e-6, atol=1e-7)
        with warnings.catch_warnings():  # the pre-parametrization API is deprecated (FutureWarning)
            warnings.simplefilter("ignore")
            old = nn.utils.weight_norm(make())
        with torch.no_grad():
            old.weight_g.mul_(0.6)
        old_state = {f"layer.{k}": v for k, v in old.state_dict().items()}
        assert set(old_state) == {"layer.weight_g", "layer.weight_v", "layer.bias"}
        expected = torch._weight_norm(old.weight_v, old.weight_g, 0)
        torch.testing.assert_close(fold_weight_norm(old_state, "x.pt")["layer.weight"], expected.detach())


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_bytes(tmp_path: Path, kind: str) -> None:
    model = load_hift(write_hift(tmp_path / "hift.pt", tiny_hift_config(kind)), tiny_hift_config(kind))
    mel = _mel(10)
    first = model.vocode(mel, _gen(7)).numpy().tobytes()
    assert model.vocode(mel, _gen(7)).numpy().tobytes() == first
    assert model.vocode(mel, _gen(8)).numpy().tobytes() != first


@pytest.mark.parametrize("total", [30, 53])
def test_cv3_mel_prefix_gives_audio_prefix(tmp_path: Path, total: int) -> None:
    """As upstream CV3 streaming uses it: vocode(mel[:T], finalize=False) is a prefix of any longer vocode."""
    cfg = tiny_hift_config("cosyvoice3")
    model = load_hift(write_hift(tmp_path / "hift.pt", cfg, "param"), cfg)
    mel = _mel(total, seed=total)
    full = model.vocode(mel, _gen(3))
    assert cfg.held_back_frames == 8
    previous = torch.zeros(1, 0)
    for frames in (9, 16, 17, total - 1, total):
        part = model.vocode(mel[:, :, :frames], _gen(3), finalize=False)
        assert part.shape == (1, (frames - 8) * 480)
        torch.testing.assert_close(part, full[:, : part.shape[1]], rtol=0, atol=1e-6)
        torch.testing.assert_close(part[:, : previous.shape[1]], previous, rtol=0, atol=1e-6)
        previous = part
    # the look-ahead is real: finalizing a prefix (zeros instead of future frames) changes its tail
    closed = model.vocode(mel[:, :, :16], _gen(3))
    assert not torch.allclose(closed[:, 8 * 480 : 16 * 480], full[:, 8 * 480 : 16 * 480], atol=1e-4)
    torch.testing.assert_close(closed[:, : 8 * 480], full[:, : 8 * 480], rtol=0, atol=1e-6)


def test_cv2_is_not_streamable_and_inputs_checked(tmp_path: Path) -> None:
    cfg = tiny_hift_config("cosyvoice2")
    model = load_hift(write_hift(tmp_path / "hift.pt", cfg), cfg)
    with pytest.raises(ValueError, match="causal"):
        model.vocode(_mel(20), _gen(), finalize=False)
    with pytest.raises(ValueError, match="frames"):
        model.vocode(torch.zeros(1, 81, 5), _gen())
    cfg3 = tiny_hift_config("cosyvoice3")
    model3 = load_hift(write_hift(tmp_path / "h3.pt", cfg3), cfg3)
    with pytest.raises(ValueError, match="at least 9"):
        model3.vocode(_mel(8), _gen(), finalize=False)


def _fundamental_only_source(causal: bool):
    cfg = replace(HiFTConfig(causal=causal), base_channels=16, f0_cond_channels=8, nsf_sigma=0.0)
    source = HiFT(cfg).m_source
    with torch.no_grad():
        source.l_linear.weight.zero_()
        source.l_linear.weight[0, 0] = 5.0  # fundamental only
        source.l_linear.bias.zero_()
    return source


def test_cv2_sine_source_follows_f0() -> None:
    """Constant F0 -> CosyVoice2's excitation is a sine at F0 (phase interpolated linearly between frames)."""
    source = _fundamental_only_source(causal=False)
    wave = source(torch.full((1, 50), 210.0), _gen())[0, 0].detach().numpy()  # 1 s
    spectrum = np.abs(np.fft.rfft(wave * np.hanning(wave.size)))
    assert np.argmax(spectrum) == pytest.approx(210, abs=1)  # 1 Hz bins
    silent = source(torch.zeros(1, 50), _gen())[0, 0].detach().numpy()  # unvoiced: noise only (std alpha/3)
    assert 0.0 < np.std(silent) < 0.2


def test_cv3_sine_source_phase_is_per_frame() -> None:
    """CosyVoice3 (causal) resamples the per-frame phase with 'nearest', as upstream: the phase is constant
    over each 480-sample frame and advances by 2 pi * 480 * F0 / 24000 per frame."""
    source = _fundamental_only_source(causal=True)
    wave = source(torch.full((1, 10), 210.0), _gen())[0, 0].detach().double()
    frames = wave.reshape(10, 480)
    assert torch.equal(frames, frames[:, :1].expand(10, 480))
    t = torch.arange(1, 11, dtype=torch.float64)
    expected = torch.tanh(5.0 * 0.1 * torch.sin(2 * np.pi * 4.2 * t))
    torch.testing.assert_close(frames[:, 0], expected, rtol=0, atol=2e-4)


def test_config_from_official_yaml(tmp_path: Path) -> None:
    for kind in ("cosyvoice2", "cosyvoice3"):
        path = tmp_path / f"{kind}.yaml"
        path.write_text("\nsample_rate: 24000\n" + hift_yaml(kind, 512, 512))
        cfg = HiFTConfig.from_yaml_node(read_hyperpyyaml(path)["hift"])
        assert cfg == HiFTConfig.for_kind(kind)  # type: ignore[arg-type]


# --- bad checkpoints --------------------------------------------------------------------------------------


def _cfg() -> HiFTConfig:
    return tiny_hift_config("cosyvoice3")


def test_truncated_checkpoint(tmp_path: Path) -> None:
    path = write_hift(tmp_path / "hift.pt", _cfg())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"hift\.pt: unreadable checkpoint"):
        load_hift(path, _cfg())


def test_missing_file_and_not_a_state_dict(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        load_hift(tmp_path / "absent.pt", _cfg())
    torch.save([torch.zeros(1)], tmp_path / "list.pt")
    with pytest.raises(ModelLoadError, match="expected a state dict"):
        load_hift(tmp_path / "list.pt", _cfg())
    torch.save({"conv_pre.bias": "text"}, tmp_path / "str.pt")
    with pytest.raises(ModelLoadError, match="'conv_pre.bias' holds a str"):
        load_hift(tmp_path / "str.pt", _cfg())


class _Payload:
    def __reduce__(self) -> tuple:
        return (print, ("unpickled!",))


def test_arbitrary_objects_are_not_unpickled(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    with open(path, "wb") as fh:
        pickle.dump({"x": _Payload()}, fh)
    with pytest.raises(ModelLoadError, match="unreadable checkpoint"):
        load_hift(path, _cfg())


@pytest.mark.parametrize("style", ["old", "param"])
def test_missing_key(tmp_path: Path, style: str) -> None:
    state = official_hift_state(_cfg(), style)  # type: ignore[arg-type]
    del state["resblocks.4.activations2.1.alpha"]
    torch.save(state, tmp_path / "hift.pt")
    with pytest.raises(ModelLoadError, match=r"hift\.pt: missing key 'resblocks\.4\.activations2\.1\.alpha'"):
        load_hift(tmp_path / "hift.pt", _cfg())
    state = official_hift_state(_cfg(), style)  # type: ignore[arg-type]
    half = "conv_post.weight_v" if style == "old" else "conv_post.parametrizations.weight.original1"
    del state[half]
    torch.save(state, tmp_path / "hift.pt")
    with pytest.raises(ModelLoadError, match=f"missing key '{half}'"):
        load_hift(tmp_path / "hift.pt", _cfg())


def test_wrong_shape_and_unexpected_key(tmp_path: Path) -> None:
    state = official_hift_state(_cfg(), "param")
    state["source_downs.1.weight"] = torch.zeros(4, 18, 5)
    torch.save(state, tmp_path / "hift.pt")
    with pytest.raises(ModelLoadError, match=r"'source_downs\.1\.weight' has shape \(4, 18, 5\).*\(4, 18, 6\)"):
        load_hift(tmp_path / "hift.pt", _cfg())
    state = official_hift_state(_cfg(), "param")
    state["resblocks.9.convs1.0.bias"] = torch.zeros(2)
    torch.save(state, tmp_path / "hift.pt")
    with pytest.raises(ModelLoadError, match=r"unexpected key 'resblocks\.9\.convs1\.0\.bias'"):
        load_hift(tmp_path / "hift.pt", _cfg())
    # a CosyVoice2 checkpoint is not a CosyVoice3 one (conv_pre kernel 7 vs 5)
    write_hift(tmp_path / "cv2.pt", tiny_hift_config("cosyvoice2"))
    with pytest.raises(ModelLoadError, match="conv_pre"):
        load_hift(tmp_path / "cv2.pt", _cfg())
    # full-size configuration vs a tiny file
    with pytest.raises(ModelLoadError, match="has shape"):
        load_hift(tmp_path / "cv2.pt", "cosyvoice2")


def test_ambiguous_weight_norm(tmp_path: Path) -> None:
    state = official_hift_state(_cfg(), "old")
    state["conv_pre.weight"] = torch.zeros(16, 80, 5)
    torch.save(state, tmp_path / "hift.pt")
    with pytest.raises(ModelLoadError, match="'conv_pre.weight' is given twice"):
        load_hift(tmp_path / "hift.pt", _cfg())
