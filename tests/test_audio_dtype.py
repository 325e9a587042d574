"""The flow and vocoder stages in bfloat16 (``--audio-dtype``): how ``auto`` resolves, closeness to float32 on
the shipped voice's real weights and on a tiny HiFT checkpoint, determinism, batches, resume settings, usage."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from flow_fixtures import write_audio_checkpoint
from model_memo import memoized_loaders

from specli.bench.synthesis import SynthesisBenchOptions
from specli.cli import main
from specli.tts.acoustic.pipeline import Vocalizer, VoicePrompt, audio_dtype
from specli.tts.audio_out import AudioOptions, audio_settings

VOICE = Path(__file__).resolve().parent.parent / "specli" / "voices" / "specli-en"
pytestmark = pytest.mark.usefixtures("memo_loaders")  # CLI calls reuse the session's shipped voice
# "It's not the valleys in life I dread so much as the dips." as the voice's own LM speaks it (greedy, seed 0):
# real speech tokens, so the mels compared below are speech, not noise.
SENTENCE = "It's not the valleys in life I dread so much as the dips."


def test_auto_is_bf16_only_on_a_cpu_with_native_bf16() -> None:
    assert audio_dtype("auto", "cpu", native_bf16=True) == torch.bfloat16
    assert audio_dtype("auto", "cpu", native_bf16=False) == torch.float32
    assert audio_dtype("auto", "cuda", native_bf16=True) == torch.float32  # rows batched on CUDA: float32 only
    assert audio_dtype("bfloat16", "cpu", native_bf16=False) == torch.bfloat16  # asked for: given, even if slow
    assert audio_dtype("float32", "cpu", native_bf16=True) == torch.float32
    with pytest.raises(ValueError, match="audio dtype must be one of auto, float32, bfloat16"):
        audio_dtype("float16", "cpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown audio dtype"):
        AudioOptions(dtype="half")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="audio dtype must be one of"):
        SynthesisBenchOptions(("cosyvoice3-ar",), audio_dtype="int8")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def voices(vocalizer) -> dict[str, Vocalizer]:
    return {name: vocalizer(dtype) for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))}


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory, model_memo) -> list[int]:
    out = tmp_path_factory.mktemp("tokens")
    with memoized_loaders(model_memo):
        res = CliRunner().invoke(main, ["synthesize", "--model", str(VOICE), "--sampler", "greedy", "--text",
                                        SENTENCE, "--format", "npy", "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    (path,) = out.glob("*.npy")
    return np.load(path).tolist()


def test_bf16_stages_stay_close_to_float32_on_the_shipped_voice(voices, tokens) -> None:
    """Same lengths, float32 outputs, the mel within bf16 rounding of float32's (measured on this sentence: mean
    |diff| 0.010 of a log-mel spanning 13) and the audio's log-mel close too (measured 0.07: quiet bins count in
    the log): the same speech. The round-trip WER of both is in docs/benchmarks/synthesis-bf16/."""
    fp32, bf16 = voices["float32"], voices["bfloat16"]
    prompt = VoicePrompt.none(80)
    mel32, mel16 = fp32.mel(tokens, prompt), bf16.mel(tokens, prompt)
    assert mel16.dtype == torch.float32 and mel16.shape == mel32.shape == (1, 80, 4 * len(tokens))
    assert float((mel16 - mel32).abs().mean()) < 0.03 and float(mel32.max() - mel32.min()) > 6.0
    a32 = fp32.render(tokens, prompt, torch.Generator().manual_seed(0))
    a16 = bf16.render(tokens, prompt, torch.Generator().manual_seed(0))
    assert a16.audio.dtype == np.float32 and a16.audio.shape == a32.audio.shape
    heard32, heard16 = (fp32.vocoder.mel(torch.from_numpy(a.audio)) for a in (a32, a16))
    assert float((heard16 - heard32).abs().mean()) < 0.15
    assert not np.array_equal(a16.audio, a32.audio)  # bf16 really ran (else the bound above proves nothing)


def test_bf16_is_deterministic_and_rows_give_the_samples_of_one(voices, tokens) -> None:
    bf16, prompt = voices["bfloat16"], VoicePrompt.none(80)
    once = bf16.render(tokens, prompt, torch.Generator().manual_seed(0)).audio
    assert np.array_equal(bf16.render(tokens, prompt, torch.Generator().manual_seed(0)).audio, once)
    rows = [(tokens[:9], prompt, torch.Generator().manual_seed(0)), (tokens, prompt, torch.Generator().manual_seed(0))]
    got = dict(bf16.render_rows(rows))
    assert np.array_equal(got[1].audio, once) and got[0].audio.shape[0] < once.shape[0]


def test_bf16_hift_keeps_its_source_and_spectra_in_float32(tmp_path: Path) -> None:
    """The official vocoder's path (tiny CosyVoice3 HiFT): its f0, harmonic source and (i)STFT run in float32 under
    bf16 autocast (a bf16 STFT raised before), only the convolutions in bf16."""
    model = write_audio_checkpoint(tmp_path / "ckpt", boost=100)
    toks = list(range(100, 160))
    out, sources = {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        v = Vocalizer.from_dir(model, "cosyvoice3", dtype=dtype)
        mel = Vocalizer.from_dir(model, "cosyvoice3").mel(toks, VoicePrompt.none(80))  # the same mel for both
        hook = v.vocoder.m_source.register_forward_hook(lambda _m, _i, o, d=dtype: sources.__setitem__(d, o))
        with v.compute():
            out[dtype] = v.vocoder.vocode(mel, torch.Generator().manual_seed(0))[0].numpy()
        hook.remove()
    assert sources[torch.bfloat16].dtype == torch.float32
    assert torch.equal(sources[torch.bfloat16], sources[torch.float32])  # f0 and source untouched by autocast
    diff = np.abs(out[torch.bfloat16] - out[torch.float32])
    assert out[torch.bfloat16].shape == out[torch.float32].shape and 0 < diff.max() < 0.05
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        Vocalizer.from_dir(model, "cosyvoice3", dtype=torch.float16)


def _synth(out: Path, extra: list[str]):
    return CliRunner().invoke(main, ["synthesize", "--model", str(VOICE), "--format", "wav", "--seed", "3",
                                     "--sampler", "ras", "-o", str(out), *extra], catch_exceptions=False)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if not p.name.startswith(".")}


def test_cli_bf16_batches_resume_and_settings(tmp_path: Path) -> None:
    """--audio-dtype bfloat16: batch 3 writes the bytes of batch 1; the sidecar names the dtype, so a float32 rerun
    redoes the files (and a bf16 rerun keeps them); float32 output is not bf16's."""
    lines = tmp_path / "lines.txt"
    lines.write_text("Hello there.\nIt is late.\nWhere are you going?\nYes.\n")
    runs = {}
    for batch in (1, 3):
        res = _synth(tmp_path / f"b{batch}", ["--audio-dtype", "bfloat16", "--batch-size", str(batch), str(lines)])
        assert res.exit_code == 0, res.stderr
        runs[batch] = _files(tmp_path / f"b{batch}")
    assert len(runs[1]) == 4 and runs[3] == runs[1]
    sidecar = json.loads((tmp_path / "b1" / ".lines_00001.wav.specli").read_text())
    assert sidecar["settings"]["audio"]["dtype"] == "bfloat16", sidecar
    kept = _synth(tmp_path / "b1", ["--audio-dtype", "bfloat16", str(lines)])
    assert "4 skipped" in kept.stderr
    redo = _synth(tmp_path / "b1", ["--audio-dtype", "float32", str(lines)])
    assert redo.exit_code == 0 and "4 ok" in redo.stderr and "redoing lines_00001" in redo.stderr
    fp32 = _files(tmp_path / "b1")
    assert fp32.keys() == runs[1].keys() and fp32 != runs[1]
    assert "dtype" not in json.loads((tmp_path / "b1" / ".lines_00001.wav.specli").read_text())["settings"]["audio"]


def test_audio_settings_record_only_a_non_float32_dtype(voices) -> None:
    assert "dtype" not in audio_settings(voices["float32"], AudioOptions())
    assert audio_settings(voices["bfloat16"], AudioOptions())["dtype"] == "bfloat16"


def test_audio_dtype_needs_audio_output(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["synthesize", "--model", str(VOICE), "--text", "hi", "--audio-dtype", "bfloat16",
                                    "--format", "npy", "-o", str(tmp_path)])
    assert res.exit_code == 2 and "--audio-dtype" in res.stderr and "need --format wav or flac" in res.stderr
    bad = CliRunner().invoke(main, ["bench", "x.wav", "--presets", "whisper-base-ar", "--audio-dtype", "bfloat16"])
    assert bad.exit_code == 2 and "for synthesis presets" in bad.stderr
