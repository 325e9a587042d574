"""specli-en, the voice trained here and shipped in the package (specli/voices/specli-en): its files load through
the same loaders as official CosyVoice3 directories (llm.pt + cosyvoice3.yaml + CosyVoice-BlankEN/ by the LM loader,
flow.pt + the HiFi-GAN entry by the vocalizer, speech_tokenizer_v3.onnx by the prompt frontend), its ONNX
tokenizer gives the committed tokens of a corpus clip's rate, `synthesize` renders it to a 22.05 kHz wav, and a
corrupted copy is refused by its SHA256SUMS."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import soundfile as sf
from click.testing import CliRunner

from specli.cli import main
from specli.errors import ModelLoadError
from specli.io.audio import load_audio
from specli.models.cosyvoice.lm import load_cosyvoice, resolve_cosyvoice
from specli.models.cosyvoice.voices import read_sums, shipped_part, shipped_voice
from specli.tts.acoustic.frontend import Frontend
from specli.tts.acoustic.pipeline import Vocalizer

VOICE = Path(__file__).resolve().parent.parent / "specli" / "voices" / "specli-en"
CLIP = Path(__file__).resolve().parent.parent / "samples" / "en"


def test_every_file_is_listed_and_matches() -> None:
    sums = read_sums(VOICE)
    assert {"llm.pt", "flow.pt", "cosyvoice3.yaml", "speech_tokenizer_v3.onnx",
            "CosyVoice-BlankEN/config.json", "CosyVoice-BlankEN/vocab.json"} <= set(sums)
    assert resolve_cosyvoice(str(VOICE)) == VOICE  # verified against SHA256SUMS


def test_the_shipped_drafter_is_listed_and_resolves() -> None:
    assert {"dflash/config.json", "dflash/model.safetensors"} <= set(read_sums(VOICE))
    assert shipped_part("specli-en/dflash") == shipped_voice("specli-en") / "dflash"
    assert shipped_part("not-a-voice/dflash") is None and shipped_part("specli-en") is None
    with pytest.raises(ModelLoadError, match="has no 'nothing'"):
        shipped_part("specli-en/nothing")


def test_the_files_load_through_the_official_loaders() -> None:
    model = load_cosyvoice(str(VOICE))
    assert model.spec.kind == "cosyvoice3" and model.spec.speech_token_size == 19683
    vocalizer = Vocalizer.from_dir(VOICE, "cosyvoice3")
    assert vocalizer.vocoder.sample_rate == 22050 and vocalizer.spec.token_mel_ratio == 4
    assert not vocalizer.spec.silent_tokens  # this codebook has no designated silence codes
    frontend = Frontend.from_dir(VOICE, "cosyvoice3")
    clip = sorted(CLIP.glob("*.wav"))[0]
    prompt = frontend.prompt(clip, "A prompt.")  # the --prompt-wav path: ONNX tokens + mel at 4 frames a token
    seconds = len(load_audio(clip)) / 16000
    tokens = prompt.speech_tokens[0]
    assert 0 <= int(tokens.min()) and int(tokens.max()) < 19683
    assert abs(len(tokens) - seconds * 22050 / 1024) <= 1.5  # 21.53 tokens a second
    assert tuple(prompt.prompt_mel.shape[1:]) == (4 * len(tokens), 80)


@pytest.mark.usefixtures("memo_loaders")  # the loaders themselves are tested above and below
def test_synthesize_renders_a_wav(tmp_path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["synthesize", "--model", str(VOICE), "--text", "Hello there.", "--format", "wav",
                                    "--seed", "0", "--threads", "1", "-o", str(out), "--jsonl", "-"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    record = json.loads(res.stdout.splitlines()[0])
    info = sf.info(out / "text_00001.wav")
    assert info.samplerate == 22050 and record["sample_rate"] == 22050
    assert info.frames == record["mel_frames"] * 256 and record["mel_frames"] == 4 * record["flow_tokens"]


def test_a_corrupted_copy_is_refused(tmp_path) -> None:
    copy = tmp_path / "voice"
    shutil.copytree(VOICE, copy)
    data = bytearray((copy / "flow.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "flow.pt").write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="flow.pt does not match its sha256"):
        resolve_cosyvoice(str(copy))
    res = CliRunner().invoke(main, ["synthesize", "--model", str(copy), "--text", "Hi.", "--format", "wav",
                                    "-o", str(tmp_path / "out")])
    assert res.exit_code == 3 and "flow.pt" in res.stderr
