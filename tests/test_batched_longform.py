"""Opt-in batched long-form (preset whisper-base-batched-longform): a long file's voiced chunks decoded as rows of
the batched scheduler, faster-whisper's BatchedInferencePipeline semantics; real whisper-base weights and speech."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from conftest import EN_CLIPS, write_long_english
from specli.asr.batched_longform import (BATCHED_VAD, CHUNK_SECONDS, pack_spans, speech_chunks,
                                         transcribe_long_audio)
from specli.asr.pipeline import transcribe
from specli.asr.windows import FileStats, TranscribeOptions
from specli.cli import main
from specli.core.types import DecodeStats
from specli.errors import PresetError
from specli.io.audio import SAMPLE_RATE, load_audio
from specli.presets import DEFAULT_PRESET, available_presets, load_preset

PRESET = "whisper-base-batched-longform"
CYCLES = 3  # every English clip three times, shuffled, with 2.5-4.5 s silences: ~71 s of speech in ~120 s
QUEUE = "queue-youarenext"  # "... will be answered by the next available representative"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def long_file(tmp_path_factory):
    """A ~2-minute WAV of the real English clips and silences: its path, duration (s) and each clip's
    ``(start s, end s, clip)``."""
    path = tmp_path_factory.mktemp("batched_longform") / "long.wav"
    utterances, seconds = write_long_english(path, CYCLES, (2.5, 4.5), seed=3)
    return path, seconds, utterances


def test_the_preset_ships_batched_and_is_never_the_default():
    p = load_preset(PRESET)
    assert p.longform == "batched" and p.draft.strategy == "ar" and p.model == "whisper-base"
    assert PRESET in available_presets() and load_preset(DEFAULT_PRESET).longform == "sequential"


def test_cli_transcribes_a_long_file_with_times_inside_it_and_in_order(long_file, tmp_path, memo_loaders):
    path, seconds, _ = long_file
    res = CliRunner().invoke(main, ["transcribe", str(path), "--preset", PRESET, "--dtype", "float32", "--language",
                                    "en", "-o", str(tmp_path), "--jsonl", "-"], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    (record,) = [json.loads(line) for line in res.stdout.splitlines()]
    segs = record["segments"]
    assert record["duration"] == pytest.approx(seconds, abs=1e-3) and len(segs) >= CYCLES * len(EN_CLIPS) // 2
    for a, b in zip(segs, segs[1:]):
        assert a["start"] <= b["start"] and a["end"] <= b["end"] + 1e-6, (a, b)
    assert all(0.0 <= s["start"] <= s["end"] <= seconds for s in segs)
    assert segs[-1]["end"] > seconds - 15  # the last clip was transcribed, at its place in the file
    text = " ".join(s["text"] for s in segs).lower()
    assert text.count("representative") == CYCLES  # every chunk decoded once: nothing dropped, nothing twice
    assert (tmp_path / "long.txt").read_text(encoding="utf-8").strip()


def test_batched_rows_equal_the_chunks_decoded_one_at_a_time(long_file, whisper_models):
    path, _, _ = long_file
    model = whisper_models("whisper-base", "float32")
    audio = load_audio(path)
    _tmap, chunks = speech_chunks(audio, BATCHED_VAD)
    assert len(chunks) >= 3 and all(c.audio.size <= CHUNK_SECONDS * SAMPLE_RATE for c in chunks)
    opts = TranscribeOptions(language="en", word_timestamps=True)
    one = transcribe_long_audio(model, [audio], opts, batch_size=1)
    two = transcribe_long_audio(model, [audio], opts, batch_size=2)  # the third chunk joins as a row frees
    assert [(s.start, s.end, s.tokens) for s in two.segments] == [(s.start, s.end, s.tokens) for s in one.segments]
    assert [s.words for s in two.segments] == [s.words for s in one.segments] and one.segments[0].words
    assert one.segments and two.stats.windows == one.stats.windows == len(chunks)
    assert two.stats.decode.tokens == one.stats.decode.tokens


def test_a_files_work_is_its_parts_summed():
    """Every counter and time of a chunk's stats reaches the file's; the audio length stays the file's own."""
    whole = FileStats(audio_seconds=90.0, windows=1, encode_seconds=0.5, decode=DecodeStats(tokens=3))
    whole.add(FileStats(audio_seconds=30.0, windows=2, encode_seconds=0.25, skipped_windows=1, trimmed_windows=1,
                        fallback_windows=1, decode=DecodeStats(tokens=4, target_forwards=5)))
    assert whole == FileStats(audio_seconds=90.0, windows=3, encode_seconds=0.75, skipped_windows=1,
                              trimmed_windows=1, fallback_windows=1, decode=DecodeStats(tokens=7, target_forwards=5))


def test_language_is_detected_once_on_the_first_chunk(long_file, whisper_models):
    path, _, _ = long_file
    res = transcribe_long_audio(whisper_models("whisper-base", "float32"), [load_audio(path)[: 40 * SAMPLE_RATE]],
                                TranscribeOptions(max_new_tokens=8), batch_size=2)
    assert res.language == "en" and 0.5 < res.language_probability <= 1.0 and res.segments


def test_a_file_without_speech_gives_no_segments(tmp_path, whisper_models):
    quiet = (np.random.default_rng(0).standard_normal(40 * SAMPLE_RATE) * 0.002).astype(np.float32)
    res = transcribe_long_audio(whisper_models("whisper-base", "float32"), [quiet], TranscribeOptions())
    assert res.segments == [] and res.stats.windows == 0 and res.stats.audio_seconds == pytest.approx(40.0)
    sf.write(tmp_path / "quiet.wav", quiet, SAMPLE_RATE, subtype="FLOAT")
    (out,) = transcribe([tmp_path / "quiet.wav"], PRESET, TranscribeOptions(language="en"))
    assert out.error is None and out.result.segments == []


def test_chunks_are_faster_whispers_collect_chunks():
    fw_vad = pytest.importorskip("faster_whisper.vad")
    rng = np.random.default_rng(5)
    audio = rng.standard_normal(200 * SAMPLE_RATE).astype(np.float32)
    edges = np.sort(rng.choice(200 * SAMPLE_RATE, size=24, replace=False))
    spans = [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]
    theirs, meta = fw_vad.collect_chunks(audio, [{"start": s, "end": e} for s, e in spans], SAMPLE_RATE, 30)
    ours = pack_spans(spans, 30 * SAMPLE_RATE)
    assert len(ours) == len(theirs) > 1
    for group, chunk in zip(ours, theirs):
        np.testing.assert_array_equal(np.concatenate([audio[s:e] for s, e in group]), chunk)
    offsets = np.cumsum([0] + [sum(e - s for s, e in g) for g in ours[:-1]]) / SAMPLE_RATE
    assert [m["offset"] for m in meta] == pytest.approx(list(offsets))


def test_rejected_where_it_cannot_apply(tmp_path, long_file):
    toml = tmp_path / "qwen-batched.toml"
    toml.write_text('family = "qwen2-audio"\nmodel = "x"\nstrategy = "ar"\nlongform = "batched"\n')
    with pytest.raises(PresetError, match="sequentially only"):
        load_preset(str(toml))
    odd = tmp_path / "odd.toml"
    odd.write_text('model = "whisper-base"\nlongform = "parallel"\n')
    with pytest.raises(PresetError, match="longform must be one of"):
        load_preset(str(odd))


def test_word_timestamps_are_aligned_per_chunk_and_mapped_to_file_time(long_file, tmp_path, memo_loaders):
    path, _, utterances = long_file
    tmap, _chunks = speech_chunks(load_audio(path), BATCHED_VAD)
    # chunks hold several VAD pieces: the silences between them were removed before decoding
    assert any(len(group) > 1 for group in pack_spans(tmap.spans, round(CHUNK_SECONDS * SAMPLE_RATE)))
    res = CliRunner().invoke(main, ["transcribe", str(path), "--preset", PRESET, "--dtype", "float32", "--language",
                                    "en", "--word-timestamps", "-o", str(tmp_path), "--output-format", "json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    segs = json.loads((tmp_path / "long.json").read_text(encoding="utf-8"))["segments"]
    assert segs
    for seg in segs:
        assert seg["words"] and all(seg["start"] <= w["start"] <= w["end"] <= seg["end"] for w in seg["words"]), seg
        assert "".join(w["word"] for w in seg["words"]).replace(" ", "") == seg["text"].replace(" ", "")
    words = [w for seg in segs for w in seg["words"]]
    assert all(a["end"] <= b["start"] for a, b in zip(words, words[1:]))
    # the first word after each silence starts after it, inside the clip that follows (VAD pads speech by 0.4 s)
    for (_, silence_start, _), (start, end, clip) in zip(utterances, utterances[1:]):
        first = next(w for w in words if w["start"] > silence_start + 0.5)
        assert start - 0.5 <= first["start"] < end, (clip.name, start, first)


def test_without_the_vad_model_it_fails_before_whisper_loads(monkeypatch, tmp_path, long_file):
    import specli.asr.vad as vad_module
    from specli.errors import ModelLoadError

    vad_module.load_vad.cache_clear()
    monkeypatch.setattr(vad_module.importlib.util, "find_spec", lambda name: None)  # silero-vad not installed
    monkeypatch.setattr("specli.commands.transcribe._load", lambda *a: pytest.fail("the model loaded"))
    try:
        res = CliRunner().invoke(main, ["transcribe", str(long_file[0]), "--preset", PRESET, "-o", str(tmp_path)])
    finally:
        vad_module.load_vad.cache_clear()
    assert res.exit_code == ModelLoadError.exit_code and "specli[vad]" in res.stderr


def test_bench_never_takes_it_for_the_baseline():
    from specli.bench.runner import choose_baseline

    batched, ar = load_preset(PRESET), load_preset("whisper-tiny.en-ar")
    assert choose_baseline([batched, ar], None).name == "whisper-tiny.en-ar"
    assert choose_baseline([batched], None).name == "whisper-base-ar"


def test_resume_fingerprints_the_long_form_mode():
    from dataclasses import replace

    from specli.asr.pipeline import text_settings

    ar = load_preset("whisper-base-ar")
    assert "longform" not in text_settings(ar, TranscribeOptions())  # outputs made before the mode still resume
    assert text_settings(replace(ar, longform="batched"), TranscribeOptions())["longform"] == "batched"
