"""``specli synthesize --format wav|flac`` end to end on tiny CosyVoice3 models (LLM, flow, HiFT, ONNX frontend)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from click.testing import CliRunner
from flow_fixtures import official_flow_state, write_audio_checkpoint

from specli.tts.acoustic.cfm import drop_silent_runs
from specli.tts.acoustic.pipeline import Vocalizer
from specli.cli import main
from specli.models.cosyvoice.text import CV3_DEFAULT_PROMPT
from specli.errors import UsageError
from specli.tts.audio_out import prepare_voice


@pytest.fixture(scope="module")
def cv3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Speech id 100 dominates every LLM step, so greedy decoding speaks max_len tokens (never stops early)."""
    return write_audio_checkpoint(tmp_path_factory.mktemp("cv3a") / "ckpt", boost=100)


def _run(args: list[str], sampler: str = "greedy"):
    return CliRunner().invoke(main, ["synthesize", "--sampler", sampler, *args], catch_exceptions=False)


def _outputs(folder: Path) -> list[str]:
    """Output names in ``folder``, without the hidden resume sidecars (``.<output>.specli``)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def _records(res) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, res.stdout.splitlines())}


def _sine(path: Path, seconds: float, rate: int = 24000) -> Path:
    t = np.arange(int(seconds * rate)) / rate
    sf.write(path, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate)
    return path


def test_wav_lengths_tokens_and_resume(tmp_path: Path, cv3: Path) -> None:
    out = tmp_path / "out"
    lines = tmp_path / "lines.txt"
    lines.write_text("hello there\n\nok\n")
    res = _run(["--model", str(cv3), str(lines), "--format", "wav", "-o", str(out), "--jsonl", "-"])
    assert res.exit_code == 1 and f"{lines}:2: empty line" in res.stderr  # a bad line, the rest goes on
    recs = _records(res)
    assert _outputs(out) == ["lines_00001.wav", "lines_00003.wav"]
    tok = _run(["--model", str(cv3), str(lines), "--format", "npy", "-o", str(tmp_path / "tok")])  # same LLM tokens
    for rid, rec in recs.items():
        audio, rate = sf.read(out / f"{rid}.wav", dtype="float32")
        tokens = np.load(tmp_path / "tok" / f"{rid}.npy").tolist()
        assert rate == 24000 and rec["tokens"] == len(tokens)
        assert rec["flow_tokens"] == len(drop_silent_runs(tokens)) and rec["mel_frames"] == 2 * rec["flow_tokens"]
        assert audio.shape == (480 * rec["mel_frames"],) and rec["duration_s"] == pytest.approx(audio.size / 24000)
        assert set(rec["rtf"]) == {"llm", "flow", "vocoder", "total"} and rec["rtf"]["total"] > 0
    assert tok.exit_code == 1
    before = (out / "lines_00001.wav").stat().st_mtime_ns
    again = _run(["--model", str(cv3), str(lines), "--format", "wav", "-o", str(out)])
    assert "0 ok, 1 failed, 2 skipped" in again.stderr and (out / "lines_00001.wav").stat().st_mtime_ns == before
    redo = _run(["--model", str(cv3), "--text", "ok", "--format", "wav", "-o", str(out), "--overwrite"])
    assert redo.exit_code == 0 and "1 ok" in redo.stderr
    assert not [p for p in out.iterdir() if p.name.endswith(".part")]  # no temporary files left


def test_same_seed_same_bytes_flac_and_resampling(tmp_path: Path, cv3: Path) -> None:
    args = ["--model", str(cv3), "--text", "say this", "--format", "flac", "--sample-rate", "16000"]
    a, b = _run([*args, "-o", str(tmp_path / "a")]), _run([*args, "-o", str(tmp_path / "b")])
    c = _run([*args, "-o", str(tmp_path / "c"), "--seed", "7"])
    assert a.exit_code == b.exit_code == c.exit_code == 0
    data = (tmp_path / "a" / "text_00001.flac").read_bytes()
    assert data == (tmp_path / "b" / "text_00001.flac").read_bytes()
    assert data != (tmp_path / "c" / "text_00001.flac").read_bytes()
    audio, rate = sf.read(tmp_path / "a" / "text_00001.flac")
    native = _run(["--model", str(cv3), "--text", "say this", "--format", "wav", "-o", str(tmp_path / "n")])
    n24 = sf.info(tmp_path / "n" / "text_00001.wav").frames
    assert rate == 16000 and native.exit_code == 0 and abs(audio.size - n24 * 2 / 3) <= 1


def test_zero_shot_prompt_and_speaker(tmp_path: Path, cv3: Path) -> None:
    wav = _sine(tmp_path / "prompt.wav", 1.2)
    res = _run(["--model", str(cv3), "--text", "again", "--format", "wav", "-o", str(tmp_path / "o"),
                "--prompt-wav", str(wav), "--prompt-text", "a sine", "--jsonl", "-"])
    assert res.exit_code == 0, res.stderr
    rec = _records(res)["text_00001"]
    assert sf.info(tmp_path / "o" / "text_00001.wav").frames == 480 * rec["mel_frames"]
    vocalizer = Vocalizer.from_dir(cv3, "cosyvoice3")
    voice = prepare_voice(vocalizer, str(wav), "a sine")
    assert voice.prompt_text == CV3_DEFAULT_PROMPT + "a sine"
    n = len(voice.prompt_tokens)
    assert n > 0 and voice.flow.speech_tokens.shape == (1, n) and voice.flow.prompt_mel.shape == (1, 2 * n, 80)
    torch.save({"spk1": {"embedding": torch.randn(1, 192)}}, cv3 / "spk2info.pt")
    try:
        ok = _run(["--model", str(cv3), "--text", "hi", "--format", "wav", "-o", str(tmp_path / "s"),
                   "--speaker", "spk1"])
        bad = _run(["--model", str(cv3), "--text", "hi", "--format", "wav", "-o", str(tmp_path / "x"),
                    "--speaker", "bob"])
    finally:
        (cv3 / "spk2info.pt").unlink()
    assert ok.exit_code == 0 and (tmp_path / "s" / "text_00001.wav").is_file()
    assert bad.exit_code == 2 and "unknown speaker 'bob'; stored speakers: spk1" in bad.stderr
    assert not (tmp_path / "x").exists()
    with pytest.raises(UsageError, match="--prompt-wav needs --prompt-text.*endofprompt"):
        prepare_voice(vocalizer, str(wav), "")


def test_bad_prompts_and_options_write_nothing(tmp_path: Path, cv3: Path) -> None:
    base = ["--model", str(cv3), "--text", "hi", "-o", str(tmp_path / "o")]
    long_wav = _sine(tmp_path / "long.wav", 31, rate=16000)
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"RIFF0000WAVEjunk")
    cases = [
        (["--format", "wav", "--prompt-wav", str(long_wav), "--prompt-text", "x"], 2, "most 30 s"),
        (["--format", "wav", "--prompt-wav", str(junk), "--prompt-text", "x"], 2, "junk.wav"),
        (["--format", "wav", "--prompt-wav", str(tmp_path / "none.wav"), "--prompt-text", "x"], 2, "none.wav"),
        (["--format", "wav", "--prompt-wav", str(long_wav)], 2, "needs --prompt-text"),
        (["--format", "wav", "--prompt-text", "x"], 2, "give the recording too"),
        (["--format", "npy", "--prompt-wav", str(long_wav), "--prompt-text", "x"], 2, "need --format wav or flac"),
    ]
    for extra, code, message in cases:
        res = _run([*base, *extra])
        assert res.exit_code == code and message in res.stderr, (extra, res.stderr)
        assert not (tmp_path / "o").exists()


def test_bad_flow_checkpoints_are_clear(tmp_path: Path) -> None:
    ckpt = write_audio_checkpoint(tmp_path / "ckpt", seed=5)
    base = ["--model", str(ckpt), "--text", "hi", "--format", "wav", "-o", str(tmp_path / "o")]
    flow = (ckpt / "flow.pt").read_bytes()
    (ckpt / "flow.pt").write_bytes(flow[: len(flow) // 3])
    res = _run(base)
    assert res.exit_code == 3 and "flow.pt: unreadable checkpoint" in res.stderr
    (ckpt / "flow.pt").unlink()
    res = _run(base)
    assert res.exit_code == 3 and "flow.pt: flow checkpoint not found" in res.stderr
    state = official_flow_state(5)
    del state["decoder.estimator.proj_out.bias"]
    torch.save(state, ckpt / "flow.pt")
    res = _run(base)
    assert res.exit_code == 3 and "flow.pt: missing key 'decoder.estimator.proj_out.bias'" in res.stderr
    torch.save(official_flow_state(5), ckpt / "flow.pt")
    (ckpt / "hift.pt").unlink()
    res = _run(base)
    assert res.exit_code == 3 and "hift.pt: vocoder checkpoint not found" in res.stderr
    assert not (tmp_path / "o").exists()


def test_silent_runs_are_dropped_before_the_flow(tmp_path: Path) -> None:
    """A greedy LLM stuck on silent token 1: the tokens keep them all, the flow gets five."""
    ckpt = write_audio_checkpoint(tmp_path / "ckpt", seed=6, boost=1)
    res = _run(["--model", str(ckpt), "--text", "hm", "--format", "wav", "-o", str(tmp_path / "o"), "--jsonl", "-"])
    rec = _records(res)["text_00001"]
    assert res.exit_code == 0 and rec["tokens"] == rec["max_len"] and rec["flow_tokens"] == 5
    assert sf.info(tmp_path / "o" / "text_00001.wav").frames == 5 * 2 * 480


def test_no_tokens_is_a_line_error(tmp_path: Path) -> None:
    ckpt = write_audio_checkpoint(tmp_path / "ckpt", seed=7, boost=6562)  # CosyVoice3 eos wins at once
    res = _run(["--model", str(ckpt), "--text", "hm", "--text", "ho", "--format", "wav", "-o", str(tmp_path / "o")])
    assert res.exit_code == 1 and "--text 1: no speech tokens to render" in res.stderr
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").iterdir())


def test_jsonl_and_wav_frames(tmp_path: Path, cv3: Path) -> None:
    res = _run(["--model", str(cv3), "--text", "yes", "--format", "wav", "-o", str(tmp_path / "o"), "--jsonl", "-"])
    assert res.exit_code == 0, res.stderr
    rec = json.loads(res.stdout.splitlines()[0])
    assert sf.info(tmp_path / "o" / "text_00001.wav").frames == 480 * rec["mel_frames"]


def test_ras_sampler_path(tmp_path: Path) -> None:
    """The default sampler on an unboosted tiny LLM: a random model may stop at once (CosyVoice3 leaves eos
    unmasked below min_len), which must be a line error; otherwise the lengths must add up."""
    ckpt = write_audio_checkpoint(tmp_path / "ckpt", seed=4)
    res = _run(["--model", str(ckpt), "--text", "hi there", "--text", "a b c", "--format", "wav", "-o",
                str(tmp_path / "o"), "--jsonl", "-"], sampler="ras")
    recs = _records(res)
    assert res.exit_code == (0 if len(recs) == 2 else 1)
    assert res.stderr.count("no speech tokens to render") == 2 - len(recs)
    for rid, rec in recs.items():
        assert sf.info(tmp_path / "o" / f"{rid}.wav").frames == 480 * 2 * rec["flow_tokens"] > 0


def test_cosyvoice2_speaks_too(tmp_path: Path) -> None:
    """CV2: upsampling-conformer flow + U-Net estimator + non-causal HiFT; no silent-token rule."""
    ckpt = write_audio_checkpoint(tmp_path / "ckpt", seed=3, boost=2241, kind="cosyvoice2")  # 2241: CV3-silent
    wav = _sine(tmp_path / "prompt.wav", 1.0)
    res = _run(["--model", str(ckpt), "--text", "ok", "--format", "wav", "-o", str(tmp_path / "o"), "--jsonl", "-",
                "--prompt-wav", str(wav), "--prompt-text", "a sine"])
    assert res.exit_code == 0, res.stderr
    rec = _records(res)["text_00001"]
    assert rec["tokens"] == rec["flow_tokens"] == rec["max_len"] and rec["mel_frames"] == 2 * rec["tokens"]
    assert sf.info(tmp_path / "o" / "text_00001.wav").frames == 480 * rec["mel_frames"]


def test_manifest_prompts_fail_per_line(tmp_path: Path, cv3: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    _sine(data / "p.wav", 1.0)
    _sine(data / "long.wav", 31, rate=16000)
    lines = [{"id": "a", "text": "hi", "prompt_wav": "p.wav", "prompt_text": "a sine"},
             {"id": "b", "text": "hi", "prompt_wav": "long.wav", "prompt_text": "x"},
             {"id": "c", "text": "hi", "prompt_wav": "p.wav"},
             {"id": "d", "text": "hi", "prompt_wav": "missing.wav", "prompt_text": "x"},
             {"id": "e", "text": "hi"},
             {"id": "f", "text": "ho", "prompt_wav": "p.wav", "prompt_text": "a sine"}]
    manifest = data / "set.jsonl"
    manifest.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    res = _run([str(manifest), "--model", str(cv3), "--format", "wav", "-o", str(tmp_path / "o"), "--jsonl", "-"])
    assert res.exit_code == 1
    assert _outputs(tmp_path / "o") == ["a.wav", "e.wav", "f.wav"]
    assert f"{manifest}:2: " in res.stderr and "most 30 s" in res.stderr
    assert f"{manifest}:3: prompt_wav needs prompt_text" in res.stderr
    assert f"{manifest}:4: " in res.stderr and "missing.wav" in res.stderr
    recs = _records(res)
    for rid in ("a", "e", "f"):
        assert sf.info(tmp_path / "o" / f"{rid}.wav").frames == 480 * recs[rid]["mel_frames"] > 0
    npy = _run([str(manifest), "--model", str(cv3), "--format", "npy", "-o", str(tmp_path / "t")])  # no frontend
    assert f"{manifest}:1: prompt_wav needs the speech-tokenizer frontend" in npy.stderr


def test_flow_steps_is_a_user_option_recorded_for_resume(tmp_path: Path, cv3: Path) -> None:
    """--flow-steps N: the flow's Euler steps (default the model's 10, unchanged output); fewer give other audio of
    the same length; the choice is part of the resume settings; npy output refuses it."""
    base = ["--model", str(cv3), "--text", "hello there", "--format", "wav", "--jsonl", "-"]
    default = _run([*base, "-o", str(tmp_path / "d")])
    ten = _run([*base, "--flow-steps", "10", "-o", str(tmp_path / "ten")])
    four = _run([*base, "--flow-steps", "4", "-o", str(tmp_path / "four")])
    assert default.exit_code == ten.exit_code == four.exit_code == 0
    wav = "text_00001.wav"
    assert (tmp_path / "ten" / wav).read_bytes() == (tmp_path / "d" / wav).read_bytes()
    a, rate = sf.read(tmp_path / "d" / wav)
    b, _ = sf.read(tmp_path / "four" / wav)
    assert a.shape == b.shape and not np.array_equal(a, b)
    again = _run([*base, "--flow-steps", "4", "-o", str(tmp_path / "four")])
    assert "1 skipped" in again.stderr
    redo = _run([*base, "--flow-steps", "3", "-o", str(tmp_path / "four")])
    assert "redoing text_00001" in redo.stderr and "flow_steps" in redo.stderr
    refused = _run(["--model", str(cv3), "--text", "hi", "--format", "npy", "--flow-steps", "4",
                    "-o", str(tmp_path / "npy")])
    assert refused.exit_code == 2 and "--flow-steps" in refused.stderr
