"""--batch-size N (continuous batching over files) gives the outputs of --batch-size 1, on real clips.

whisper-tiny.en on the English samples and on a file over 30 s made of them (long-form seeking in a
batch), with a corrupt file in the middle of the batch. Batched and unbatched matrix products (encoder
over ``[k, n_mels, 3000]``, decoder over a ragged batch) round differently: log-probabilities move in
the last bits in float32 and by up to about 1e-3 in bfloat16 (the CLI's ``--dtype auto``), which could
flip a greedy near-tie between the top two logits (core/batched.py). None flips on these clips at
1 or 2 threads, so texts, tokens and timings are compared exactly and probabilities to 1e-2.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from conftest import EN_CLIPS
from specli.io.audio import SAMPLE_RATE, load_audio
from specli.asr.pipeline import batch_size_for, transcribe_files
from specli.cli import main
from specli.models.speech import DecodingOptions
from specli.asr.strategies import load_engine
from specli.asr.windows import TranscribeOptions
from specli.errors import AudioError
from specli.presets import load_preset
from specli.asr.vad import VadOptions

TINY = ("--preset", "whisper-tiny.en-ar")
TEXT_FORMATS = ("txt", "srt", "vtt", "tsv")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """A folder, in name order: short clip, long file (> 30 s), corrupt file, two short clips."""
    root = tmp_path_factory.mktemp("batch_in")
    gap = np.zeros(SAMPLE_RATE * 3 // 2, dtype=np.float32)
    long = np.concatenate([part for clip in EN_CLIPS for part in (load_audio(clip), gap)])
    assert len(long) / SAMPLE_RATE > 30.0
    sf.write(root / "2-long.wav", long, SAMPLE_RATE)
    (root / "3-corrupt.wav").write_bytes(b"RIFF but not really audio")
    for name, clip in (("1-short", EN_CLIPS[2]), ("4-short", EN_CLIPS[0]), ("5-short", EN_CLIPS[3])):
        shutil.copy(clip, root / f"{name}.wav")
    return root


def files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.wav"))


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def records(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


PROBABILITIES = ("avg_logprob", "no_speech_prob", "compression_ratio")


def assert_same_records(got: list[dict], want: list[dict]) -> None:
    """The same JSON records but for work counters and timings (which batching changes) and for
    probabilities, equal to 1e-2 (batched products round differently)."""
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert {k: v for k, v in a.items() if k not in ("stats", "segments")} == \
               {k: v for k, v in b.items() if k not in ("stats", "segments")}
        assert [{k: v for k, v in s.items() if k not in PROBABILITIES} for s in a["segments"]] == \
               [{k: v for k, v in s.items() if k not in PROBABILITIES} for s in b["segments"]]
        for key in PROBABILITIES:
            assert [s[key] for s in a["segments"]] == pytest.approx([s[key] for s in b["segments"]], abs=1e-2)


def texts(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.iterdir())
            if p.suffix.lstrip(".") in (*TEXT_FORMATS, "json") and not p.name.startswith(".")}


@pytest.fixture(scope="module")
def at_batch_1(inputs, tmp_path_factory):
    """The CLI at --batch-size 1: output folder and jsonl records."""
    out = tmp_path_factory.mktemp("batch1")
    res = run("transcribe", inputs, *TINY, "-o", out, "-f", "all", "--jsonl", "-", "--batch-size", 1)
    assert res.exit_code == 1, res.stderr  # the corrupt file
    return out, records(res.stdout)


def test_library_batch_3_equals_batch_1_and_a_bad_file_fails_alone(whisper_models, inputs):
    model, paths = whisper_models("whisper-tiny.en"), files(inputs)
    one = dict(transcribe_files(model, enumerate(paths), TranscribeOptions(), batch_size=1))
    three = dict(transcribe_files(model, enumerate(paths), TranscribeOptions(), batch_size=3))
    assert sorted(three) == list(range(len(paths)))
    assert isinstance(one[2], AudioError) and isinstance(three[2], AudioError) and str(one[2]) == str(three[2])
    for i in (0, 1, 3, 4):
        a, b = one[i], three[i]
        assert [(s.start, s.end, s.text, s.tokens) for s in a.segments] == \
               [(s.start, s.end, s.text, s.tokens) for s in b.segments]
        for key in PROBABILITIES:
            assert [getattr(s, key) for s in a.segments] == \
                   pytest.approx([getattr(s, key) for s in b.segments], abs=1e-4)  # float32 here
        assert (a.stats.windows, a.stats.audio_seconds) == (b.stats.windows, b.stats.audio_seconds)
    assert one[1].stats.windows >= 2  # the long file seeks over several windows inside the batch


def test_cli_batch_3_outputs_equal_batch_1_and_jsonl_keeps_input_order(at_batch_1, inputs, tmp_path):
    out1, recs1 = at_batch_1
    res = run("transcribe", inputs, *TINY, "-o", tmp_path, "-f", "all", "--jsonl", "-", "--batch-size", 3)
    assert res.exit_code == 1 and "3-corrupt.wav" in res.stderr and "failed" in res.stderr
    assert "files: 4 ok, 1 failed, 0 skipped" in res.stderr.strip().splitlines()[-1]
    recs3 = records(res.stdout)
    good = [str(p) for p in files(inputs) if "corrupt" not in p.name]
    assert [r["source"] for r in recs3] == good == [r["source"] for r in recs1]  # input order
    assert_same_records(recs3, recs1)
    one, three = texts(out1), texts(tmp_path)
    assert sorted(one) == sorted(three) and len(one) == 4 * 5
    assert {k: v for k, v in three.items() if not k.endswith(".json")} == \
           {k: v for k, v in one.items() if not k.endswith(".json")}


def test_resume_at_batch_n(at_batch_1, inputs, tmp_path):
    out1, _ = at_batch_1
    out = tmp_path / "out"
    shutil.copytree(out1, out)  # made at batch 1: the same settings, so batch 4 keeps them
    mtimes = {p: p.stat().st_mtime_ns for p in out.iterdir()}
    again = run("transcribe", inputs, *TINY, "-o", out, "-f", "all", "--batch-size", 4)
    assert "files: 0 ok, 1 failed, 4 skipped" in again.stderr.strip().splitlines()[-1]
    assert {p: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes
    for p in out.glob("2-long.*"):  # a missing output: only that file is redone
        p.unlink()
    (out / "4-short.txt").write_text("stale", encoding="utf-8")
    redo = run("transcribe", inputs, *TINY, "-o", out, "-f", "all", "--batch-size", 4, "--jsonl", "-")
    assert "files: 1 ok, 1 failed, 3 skipped" in redo.stderr.strip().splitlines()[-1], redo.stderr
    assert [Path(r["source"]).name for r in records(redo.stdout)] == ["1-short.wav", "2-long.wav", "4-short.wav",
                                                                      "5-short.wav"]
    assert (out / "4-short.txt").read_text(encoding="utf-8") == "stale"  # skipped (its sidecar says so)
    fresh = texts(out)
    assert {k: fresh[k] for k in fresh if k.startswith("2-long") and not k.endswith(".json")} == \
           {k: v for k, v in texts(out1).items() if k.startswith("2-long") and not k.endswith(".json")}


def test_batch_2_srt_equals_batch_1(at_batch_1, inputs, tmp_path):
    out1, _ = at_batch_1
    good = [p for p in files(inputs) if "corrupt" not in p.name][:3]
    res = run("transcribe", *good, *TINY, "-o", tmp_path, "-f", "srt", "--batch-size", 2, "--threads", 1)
    assert res.exit_code == 0, res.stderr
    for p in good:
        srt = f"{p.stem}.srt"
        assert (tmp_path / srt).read_text(encoding="utf-8") == (out1 / srt).read_text(encoding="utf-8")


def test_batch_size_is_validated(inputs, tmp_path):
    res = CliRunner().invoke(main, ["transcribe", str(inputs), *TINY, "-o", str(tmp_path), "--batch-size", "0"])
    assert res.exit_code == 2 and "--batch-size" in res.stderr


def test_fallbacks_and_word_timestamps_inside_a_batch(whisper_models, inputs):
    """Every window's greedy decode fails (log-prob threshold 0): the batched first attempt, then a
    seeded best-of-2 sample per file, inline; word timings on the kept tokens. Same as batch 1."""
    model = whisper_models("whisper-tiny.en")
    paths = [p for p in files(inputs) if "short" in p.name]
    opts = TranscribeOptions(word_timestamps=True, decoding=DecodingOptions(
        temperatures=(0.0, 0.5), best_of=2, logprob_threshold=0.0, no_speech_threshold=None, seed=7))
    one = dict(transcribe_files(model, enumerate(paths), opts, batch_size=1))
    two = dict(transcribe_files(model, enumerate(paths), opts, batch_size=2))
    for i in range(len(paths)):
        assert one[i].stats.fallback_windows == one[i].stats.windows >= 1
        assert [(s.text, s.temperature) for s in one[i].segments] == [(s.text, s.temperature) for s in two[i].segments]
        words1 = [w for s in one[i].segments for w in s.words]
        words2 = [w for s in two[i].segments for w in s.words]
        assert words1 and [(w.word, w.start, w.end) for w in words1] == [(w.word, w.start, w.end) for w in words2]
        assert [w.probability for w in words1] == pytest.approx([w.probability for w in words2], abs=1e-4)


@pytest.mark.parametrize("preset", ["whisper-tiny.en-pool", "whisper-tiny.en-eagle-asr"])
def test_speculative_presets_batch_3_equal_batch_1(preset, inputs):
    """The pool (one n-gram drafter per row, shared pool) and EAGLE (one head forward for all rows)
    presets at batch 3: the same texts as at batch 1 (lossless both ways), and they really batch."""
    engine = load_engine(load_preset(preset), dtype="float32")
    assert batch_size_for(engine.model, engine.decode, 3) == (3, None)
    paths = [p for p in files(inputs) if "short" in p.name]
    one = dict(transcribe_files(engine.model, enumerate(paths), TranscribeOptions(), engine.decode, batch_size=1))
    three = dict(transcribe_files(engine.model, enumerate(paths), TranscribeOptions(), engine.decode, batch_size=3))
    assert [one[i].text for i in range(len(paths))] == [three[i].text for i in range(len(paths))]
    assert sum(three[i].stats.decode.accepted for i in three) > 0  # drafts were verified inside the batch


def test_a_drafter_that_cannot_batch_runs_at_batch_1_with_a_warning(inputs, tmp_path):
    res = run("transcribe", *files(inputs)[:1], "--preset", "whisper-base-tinyen-chain", "--model", "whisper-base",
              "-o", tmp_path, "--batch-size", 2, "--dtype", "float32")
    assert res.exit_code == 0, res.stderr
    assert "warning: --batch-size 2 runs as 1 with preset whisper-base-tinyen-chain" in res.stderr


def test_vad_inside_a_batch(whisper_models, inputs, tmp_path):
    """--vad files (speech found by Silero, times mapped back to the file) at batch 2 == batch 1."""
    model = whisper_models("whisper-tiny.en")
    silence = np.zeros(SAMPLE_RATE * 4, dtype=np.float32)
    paths = []
    for i, p in enumerate(p for p in files(inputs) if "short" in p.name):
        audio = load_audio(p)
        paths.append(tmp_path / f"padded-{i}.wav")
        sf.write(paths[-1], np.concatenate([silence[: SAMPLE_RATE * (i + 2)], audio, silence]), SAMPLE_RATE)
    one = dict(transcribe_files(model, enumerate(paths), TranscribeOptions(), vad=VadOptions(), batch_size=1))
    two = dict(transcribe_files(model, enumerate(paths), TranscribeOptions(), vad=VadOptions(), batch_size=2))
    for i in range(len(paths)):
        assert one[i].segments and one[i].segments[0].start >= i + 1.5  # the file's own times
        assert [(s.start, s.end, s.text) for s in one[i].segments] == [(s.start, s.end, s.text) for s in two[i].segments]
