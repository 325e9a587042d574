"""``specli synthesize`` resume: a sidecar per output records the settings that change it; a rerun keeps the
outputs made with the same settings (their JSONL records read back), redoes the others with a stderr line,
``--overwrite`` redoes all, ``--skip-existing`` keeps all (tiny CosyVoice3 checkpoints, npy / wav / flac)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner
from cosyvoice_fixtures import write_checkpoint
from flow_fixtures import write_audio_checkpoint

from specli.cli import main
from specli.io.resume import FULL_HASH_BYTES, decide, file_fingerprint, sidecar_path
from specli.tts.pipeline import request_settings
from specli.tts.synthesis import SynthesisRequest


@pytest.fixture(scope="module")
def cv3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("cv3") / "ckpt", "cosyvoice3", seed=4)


@pytest.fixture(scope="module")
def cv3a(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Flow and HiFT too; speech id 100 dominates every LLM step (greedy speaks max_len tokens)."""
    return write_audio_checkpoint(tmp_path_factory.mktemp("cv3a") / "ckpt", boost=100)


def _run(*args: object):
    return CliRunner().invoke(main, ["synthesize", "--format", "npy", *map(str, args)], catch_exceptions=False)


def _records(res) -> list[dict]:
    return [json.loads(x) for x in res.stdout.splitlines()]


def _redone(res) -> dict[str, str]:
    """id -> reason of each ``redoing ID: REASON`` line on stderr."""
    return dict(re.findall(r"^redoing (\S+): (.*)$", res.stderr, flags=re.M))


def _mtimes(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in out.iterdir() if not p.name.startswith(".")}


def test_a_rerun_redoes_exactly_the_outputs_whose_settings_changed(tmp_path: Path, cv3: Path) -> None:
    lines, out = tmp_path / "lines.txt", tmp_path / "out"
    lines.write_text("a b\nc d\ne f\n")
    args = (lines, "--model", cv3, "--preset", "cosyvoice3-ar", "-o", out, "--jsonl", "-")
    first = _run(*args, "--seed", 1)
    assert first.exit_code == 0 and "3 ok" in first.stderr
    ids = ["lines_00001", "lines_00002", "lines_00003"]
    assert sorted(_mtimes(out)) == [f"{i}.npy" for i in ids]
    assert all(sidecar_path(out / f"{i}.npy").is_file() for i in ids)
    before = _mtimes(out)
    same = _run(*args, "--seed", 1)  # nothing changed: every output kept, every record printed again
    assert same.exit_code == 0 and "0 ok, 0 failed, 3 skipped" in same.stderr and not _redone(same)
    assert _records(same) == _records(first) and _mtimes(out) == before
    lines.write_text("a b\nc x\ne f\n")  # one line's text
    text = _run(*args, "--seed", 1)
    assert _redone(text) == {"lines_00002": "settings changed (request.text c d -> c x)"}
    assert "1 ok, 0 failed, 2 skipped" in text.stderr
    assert [r["id"] for r in _records(text)] == ids and _records(text)[1]["text"] == "c x"
    assert {k: v for k, v in _mtimes(out).items() if k != "lines_00002.npy"} == \
        {k: v for k, v in before.items() if k != "lines_00002.npy"}
    seed = _run(*args, "--seed", 2)  # under a sampler the seed changes every utterance
    assert _redone(seed) == dict.fromkeys(ids, "settings changed (seed 1 -> 2)") and "3 ok" in seed.stderr
    drafted = _run(*args, "--seed", 2, "--draft", "pool")  # under a sampler a drafter draws another sample
    assert set(_redone(drafted)) == set(ids)
    assert all("drafter.kind none -> pool" in why for why in _redone(drafted).values())
    greedy = _run(*args, "--seed", 2, "--sampler", "greedy")
    assert set(_redone(greedy)) == set(ids)
    assert all("sampler.name ras -> greedy" in why for why in _redone(greedy).values())
    reseeded = _run(*args, "--seed", 3, "--sampler", "greedy")  # greedy tokens do not depend on the seed
    assert "3 skipped" in reseeded.stderr and not _redone(reseeded)
    pooled = _run(*args, "--seed", 3, "--sampler", "greedy", "--draft", "pool")  # nor on the drafter
    assert "3 skipped" in pooled.stderr and not _redone(pooled)
    preset = _run(*args, "--seed", 3, "--sampler", "greedy", "--preset", "cosyvoice3-pool")
    assert _redone(preset) == dict.fromkeys(ids, "settings changed (preset cosyvoice3-ar -> cosyvoice3-pool)")


def test_skip_existing_overwrite_and_outputs_without_a_sidecar(tmp_path: Path, cv3: Path) -> None:
    out = tmp_path / "out"
    args = ("--model", cv3, "--text", "a b", "--text", "c d", "-o", out, "--jsonl", "-")
    first = _run(*args, "--seed", 1)
    assert first.exit_code == 0
    before = _mtimes(out)
    kept = _run(*args, "--seed", 2, "--skip-existing")  # other settings, kept anyway
    assert "2 skipped" in kept.stderr and not _redone(kept) and _records(kept) == _records(first)
    assert _mtimes(out) == before
    tokens = {n: np.load(out / n).tolist() for n in before}
    redo = _run(*args, "--seed", 1, "--overwrite")  # the same settings, redone anyway (quietly)
    assert "2 ok" in redo.stderr and not _redone(redo) and len(_records(redo)) == 2
    assert all(_mtimes(out)[n] != before[n] for n in before)
    assert {n: np.load(out / n).tolist() for n in before} == tokens  # same seed, same tokens
    both = _run(*args, "--overwrite", "--skip-existing")
    assert both.exit_code == 2 and "--overwrite and --skip-existing exclude each other" in both.stderr
    sidecar_path(out / "text_00002.npy").unlink()  # e.g. made by an older specli
    old = _run(*args, "--seed", 1, "--skip-existing")
    assert [r["id"] for r in _records(old)] == ["text_00001"]
    assert "skipped text_00002: no JSON record of it on disk to print" in old.stderr
    unknown = _run(*args, "--seed", 1)
    assert _redone(unknown) == {"text_00002": "no record of the settings its outputs were made with"}
    assert [r["id"] for r in _records(unknown)] == ["text_00001", "text_00002"]


def test_batched_runs_resume_like_batch_one(tmp_path: Path, cv3: Path) -> None:
    lines, out = tmp_path / "lines.txt", tmp_path / "out"
    lines.write_text("a b\nc d\ne f\ng h\n")
    args = (lines, "--model", cv3, "-o", out, "--jsonl", "-", "--seed", 4)
    first = _run(*args)
    assert first.exit_code == 0
    before = _mtimes(out)
    again = _run(*args, "--batch-size", 3)  # the batch size is no setting: the same tokens
    assert "4 skipped" in again.stderr and _records(again) == _records(first) and _mtimes(out) == before
    lines.write_text("a b\nc d\ne x\ng h\n")
    changed = _run(*args, "--batch-size", 3)
    assert _redone(changed) == {"lines_00003": "settings changed (request.text e f -> e x)"}
    assert [r["id"] for r in _records(changed)] == [f"lines_0000{n}" for n in range(1, 5)]
    assert "1 ok, 0 failed, 3 skipped" in changed.stderr
    fresh = _run(lines, "--model", cv3, "-o", tmp_path / "fresh", "--seed", 4)  # batch 1
    assert fresh.exit_code == 0
    assert np.load(out / "lines_00003.npy").tolist() == np.load(tmp_path / "fresh" / "lines_00003.npy").tolist()


def test_an_output_left_by_an_interrupted_run_is_redone(tmp_path: Path, cv3: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import specli.tts.pipeline as pipeline

    out = tmp_path / "out"
    args = ("--model", cv3, "--text", "a b", "-o", out)
    assert _run(*args, "--seed", 1).exit_code == 0
    npy = out / "text_00001.npy"
    old = npy.read_bytes()

    def interrupted(path: Path, fill) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "write_atomic_with", interrupted)  # Ctrl-C after the sidecar, before the output
    assert _run(*args, "--seed", 2).exit_code == 130
    monkeypatch.undo()
    assert npy.read_bytes() == old and '"seed": 2' in sidecar_path(npy).read_text()
    side_ns = sidecar_path(npy).stat().st_mtime_ns
    os.utime(npy, ns=(side_ns - 10**9, side_ns - 10**9))  # the output predates its sidecar
    redo = _run(*args, "--seed", 2)
    assert _redone(redo) == {"text_00001": "text_00001.npy is left over from an interrupted run"}
    assert "1 ok" in redo.stderr and npy.read_bytes() != old
    kept = _run(*args, "--seed", 2)
    assert "1 skipped" in kept.stderr and not _redone(kept)


def _sine(path: Path, hz: float) -> Path:
    t = np.arange(24000) / 24000
    sf.write(path, (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32), 24000)
    return path


def test_audio_resume_per_format_rate_seed_and_voice(tmp_path: Path, cv3a: Path) -> None:
    _sine(tmp_path / "p.wav", 220)
    manifest = tmp_path / "set.jsonl"
    manifest.write_text(json.dumps({"id": "a", "text": "hi"}) + "\n"
                        + json.dumps({"id": "b", "text": "ho", "prompt_wav": "p.wav", "prompt_text": "a sine"}) + "\n")
    out = tmp_path / "out"
    args = (manifest, "--model", cv3a, "--sampler", "greedy", "-o", out, "--jsonl", "-")
    wav = _run(*args, "--format", "wav")
    assert wav.exit_code == 0, wav.stderr
    again = _run(*args, "--format", "wav")
    assert "2 skipped" in again.stderr and _records(again) == _records(wav)
    flac = _run(*args, "--format", "flac")  # its own outputs and sidecars: the wav ones are not disturbed
    assert "2 ok" in flac.stderr and not _redone(flac)
    assert sorted(_mtimes(out)) == ["a.flac", "a.wav", "b.flac", "b.wav"]
    _sine(tmp_path / "p.wav", 330)  # line b's voice prompt, other content
    voice = _run(*args, "--format", "wav")
    assert set(_redone(voice)) == {"b"} and "voice.prompt_wav" in _redone(voice)["b"]
    assert "1 ok, 0 failed, 1 skipped" in voice.stderr and len(_records(voice)) == 2
    rate = _run(*args, "--format", "flac", "--sample-rate", 16000)
    assert set(_redone(rate)) == {"a", "b"} and "audio.sample_rate 24000 -> 16000" in _redone(rate)["a"]
    assert sf.info(out / "a.flac").samplerate == 16000
    seed = _run(*args, "--format", "wav", "--seed", 5)  # greedy tokens, but the vocoder's noise is seeded
    assert _redone(seed) == dict.fromkeys("ab", "settings changed (seed 0 -> 5)")


def test_request_settings_and_file_fingerprints(tmp_path: Path) -> None:
    plain = request_settings(SynthesisRequest("x", "hello"))
    assert plain == {"text": "hello", "prompt_text": "", "prompt_tokens": ""}
    prompted = request_settings(SynthesisRequest("x", "hello", "hi", (1, 2, 3)))
    assert prompted["prompt_tokens"].startswith("3 tokens ")
    assert prompted != request_settings(SynthesisRequest("x", "hello", "hi", (1, 2, 4)))
    small = tmp_path / "small.bin"
    small.write_bytes(b"abc")
    (tmp_path / "copy.bin").write_bytes(b"abc")
    assert file_fingerprint(small) == file_fingerprint(tmp_path / "copy.bin")  # content, not name or time
    big = bytearray(np.random.default_rng(0).integers(0, 256, FULL_HASH_BYTES + 12345, dtype=np.uint8).tobytes())
    (tmp_path / "big.bin").write_bytes(big)
    digest = file_fingerprint(tmp_path / "big.bin")
    big[0] ^= 1  # the first block is always read
    (tmp_path / "big.bin").write_bytes(big)
    assert file_fingerprint(tmp_path / "big.bin") != digest
    with pytest.raises(OSError):
        file_fingerprint(tmp_path / "missing.bin")
    # synthesis keeps no <base>.json: a kept output without a sidecar has no record
    npy = tmp_path / "u.npy"
    npy.write_bytes(b"x")
    (tmp_path / "u.npy.json").write_text('{"id": "u"}')
    assert decide([npy], npy, {}, "skip-existing", fallback=None).record is None
    assert decide([npy], npy, {}, "skip-existing").record == {"id": "u"}  # transcription's default fallback


def test_the_default_presets_shipped_drafter_is_found_under_a_sampler(tmp_path: Path) -> None:
    """specli-en's default preset drafts with the DFlash drafter shipped inside the voice (``specli-en/dflash``);
    under a sampler the resume settings record that drafter too, found where loading finds it (this failed as
    "drafter 'specli-en/dflash' not found offline" while greedy runs passed)."""
    from specli.models.cosyvoice.voices import shipped_voice

    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["synthesize", "--text", "Hello.", "--format", "npy", "--sampler", "ras",
                                    "--threads", "1", "-o", str(out), "--no-progress"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    drafter = json.loads(sidecar_path(out / "text_00001.npy").read_text())["settings"]["drafter"]
    assert drafter["kind"] == "dflash" and drafter["dir"] == str((shipped_voice("specli-en") / "dflash").resolve())
