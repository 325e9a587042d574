"""The vocoder's own compute dtype (``--vocoder-dtype``): bfloat16 by default for HiFi-GAN on a CPU with native bf16
(measured transparent, and faster there at 1 and 2 threads: docs/benchmarks/voice/vocoder-bf16/), float32 elsewhere
and for HiFT; the flow stays float32 unless ``--audio-dtype`` says otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from flow_fixtures import write_audio_checkpoint

from specli.cli import main
from specli.tts.acoustic.hifigan import HifiGan, HifiGanConfig
from specli.tts.acoustic.pipeline import Vocalizer, VoicePrompt, stage_dtypes, vocoder_dtype
from specli.tts.audio_out import AudioOptions

# a HiFi-GAN V1 of a few thousand weights (two stages, hop 8): the real network's ops, randomly initialised
TINY_CFG = HifiGanConfig(upsample_rates=(4, 2), upsample_kernel_sizes=(8, 4), upsample_initial_channel=16,
                         resblock_kernel_sizes=(3, 5), resblock_dilation_sizes=((1, 3, 5), (1, 2, 4)),
                         hop_size=8, n_fft=16, win_size=16)


def test_auto_vocoder_is_bf16_only_for_hifigan_on_a_native_bf16_cpu() -> None:
    assert vocoder_dtype("auto", "hifigan", "cpu", native_bf16=True) == torch.bfloat16
    assert vocoder_dtype("auto", "hifigan", "cpu", native_bf16=False) == torch.float32  # AVX2: emulated, slow
    assert vocoder_dtype("auto", "hift", "cpu", native_bf16=True) == torch.float32  # HiFT: round trip unmeasured
    assert vocoder_dtype("auto", "hifigan", "cuda", native_bf16=True) == torch.float32
    assert vocoder_dtype("bfloat16", "hift", "cpu", native_bf16=False) == torch.bfloat16  # asked for: given
    assert vocoder_dtype("float32", "hifigan", "cpu", native_bf16=True) == torch.float32
    with pytest.raises(ValueError, match="audio dtype must be one of"):
        vocoder_dtype("float16", "hifigan", "cpu", native_bf16=True)  # type: ignore[arg-type]


def test_stage_dtypes_of_the_options() -> None:
    """Neither option: a float32 flow, the vocoder auto; --audio-dtype names both stages (as before the vocoder had
    its own); --vocoder-dtype overrides the vocoder's alone."""
    assert stage_dtypes(None, None) == ("float32", "auto")
    assert stage_dtypes("float32", None) == ("float32", "float32")
    assert stage_dtypes("bfloat16", None) == ("bfloat16", "bfloat16")
    assert stage_dtypes(None, "float32") == ("float32", "float32")
    assert stage_dtypes("bfloat16", "float32") == ("bfloat16", "float32")
    with pytest.raises(ValueError, match="unknown audio dtype 'half'"):
        AudioOptions(vocoder_dtype="half")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_audio_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt")


def test_bf16_tiny_hifigan_is_within_rounding_of_float32(tiny_dir: Path) -> None:
    """The flow in float32 (the same mel), a tiny HiFi-GAN as the vocoder in float32 and in bfloat16: the same
    length, and the bf16 audio within 0.01 of float32's everywhere and 3% of its RMS (measured 0.002 and 1.1%)."""
    base = Vocalizer.from_dir(tiny_dir, "cosyvoice3")
    torch.manual_seed(0)
    generator = HifiGan(TINY_CFG).eval().requires_grad_(False)
    tokens, out = list(range(100, 160)), {}
    for dtype in (torch.float32, torch.bfloat16):
        v = Vocalizer(base.kind, base.flow, generator, base.model_dir, spec=base.spec, vocoder_dtype=dtype)
        assert v.dtype == torch.float32 and v.vocoder_dtype == dtype
        out[dtype] = v.render(tokens, VoicePrompt.none(80), torch.Generator().manual_seed(0)).audio
    a32, a16 = out[torch.float32], out[torch.bfloat16]
    assert a16.dtype == np.float32 and a16.shape == a32.shape == (8 * 2 * len(tokens),)
    diff = np.abs(a16 - a32)
    assert a32.std() > 0.01 and 0 < diff.max() < 0.01  # > 0: bf16 really ran
    assert np.sqrt((diff**2).mean()) < 0.03 * a32.std()


def _synth(model: Path, out: Path, extra: list[str]):
    return CliRunner().invoke(main, ["synthesize", "--model", str(model), "--format", "wav", "--sampler", "greedy",
                                     "--text", "hello there", "-o", str(out), *extra], catch_exceptions=False)


def _audio_settings(out: Path) -> dict:
    return json.loads((out / ".text_00001.wav.specli").read_text())["settings"]["audio"]


def test_vocoder_dtype_option_is_parsed_recorded_and_resumed(tiny_dir: Path, tmp_path: Path) -> None:
    """--vocoder-dtype bfloat16 (a HiFT model: by default float32) renders other audio, names the vocoder's dtype in
    the sidecar (so a float32 rerun redoes it), and leaves the flow float32; the default writes float32's bytes."""
    default = _synth(tiny_dir, tmp_path / "d", [])
    fp32 = _synth(tiny_dir, tmp_path / "f", ["--vocoder-dtype", "float32"])
    bf16 = _synth(tiny_dir, tmp_path / "b", ["--vocoder-dtype", "bfloat16"])
    assert default.exit_code == fp32.exit_code == bf16.exit_code == 0, bf16.stderr
    wav = "text_00001.wav"
    assert (tmp_path / "d" / wav).read_bytes() == (tmp_path / "f" / wav).read_bytes()
    assert (tmp_path / "b" / wav).read_bytes() != (tmp_path / "f" / wav).read_bytes()
    assert "vocoder_dtype" not in _audio_settings(tmp_path / "f") and "dtype" not in _audio_settings(tmp_path / "f")
    assert _audio_settings(tmp_path / "b")["vocoder_dtype"] == "bfloat16" and "dtype" not in _audio_settings(
        tmp_path / "b")
    both = _synth(tiny_dir, tmp_path / "x", ["--audio-dtype", "bfloat16", "--vocoder-dtype", "float32"])
    assert both.exit_code == 0 and _audio_settings(tmp_path / "x") == {
        **_audio_settings(tmp_path / "f"), "dtype": "bfloat16", "vocoder_dtype": "float32"}
    redo = _synth(tiny_dir, tmp_path / "b", ["--vocoder-dtype", "float32"])
    assert "redoing text_00001" in redo.stderr and (tmp_path / "b" / wav).read_bytes() == (
        tmp_path / "f" / wav).read_bytes()
    bad = _synth(tiny_dir, tmp_path / "z", ["--vocoder-dtype", "half"])
    assert bad.exit_code == 2 and "--vocoder-dtype" in bad.stderr
    npy = _synth(tiny_dir, tmp_path / "n", ["--vocoder-dtype", "bfloat16", "--format", "npy"])
    assert npy.exit_code == 2 and "--vocoder-dtype need --format wav or flac" in npy.stderr
