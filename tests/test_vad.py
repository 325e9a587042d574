"""Silero VAD through onnxruntime: the model, the speech-timestamp rules, the time map, and --vad end to end."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import SAMPLES
from specli.io.audio import SAMPLE_RATE, load_audio
import specli.asr.vad as vad_module
from specli.cli import main
from specli.models.speech import Word
from specli.asr.windows import Segment, TranscribeOptions, transcribe_stream
from specli.errors import ModelLoadError
from specli.asr.vad import (FRAME_SAMPLES, SileroVad, TimeMap, VadOptions, load_vad, remap_segment,
                        speech_timestamps, timestamps_from_probabilities, transcribe_speech)

CLIP = SAMPLES / "en" / "sense_and_sensibility_01_austen_64kb-0870.wav"  # 7.1 s, speech throughout
LEAD, TAIL = 7.0, 5.0  # seconds of low noise added before and after the clip
TINY = ("--preset", "whisper-tiny.en-ar")
MS = SAMPLE_RATE // 1000  # samples per millisecond


def noise(seconds: float, seed: int = 0, level: float = 0.002) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(round(seconds * SAMPLE_RATE)) * level).astype(np.float32)


def frames(*blocks: tuple[float, int]) -> np.ndarray:
    """Frame probabilities from (probability, number of frames) blocks."""
    return np.concatenate([np.full(n, p, dtype=np.float32) for p, n in blocks])


def spans(probs: np.ndarray, n_samples: int | None = None, **kw) -> list[tuple[int, int]]:
    n = len(probs) * FRAME_SAMPLES if n_samples is None else n_samples
    return timestamps_from_probabilities(probs, n, VadOptions(**kw))


# ---------------------------------------------------------------------------
# The ONNX model
# ---------------------------------------------------------------------------


def test_model_gives_one_probability_per_frame():
    vad = load_vad()
    assert isinstance(vad, SileroVad) and load_vad() is vad
    audio = np.concatenate([noise(1.0, level=0.3), np.zeros(700, np.float32)])
    probs = vad.probabilities(audio)
    assert probs.shape == (-(-audio.size // FRAME_SAMPLES),)
    assert probs.dtype == np.float32 and np.all((probs >= 0.0) & (probs <= 1.0))
    np.testing.assert_array_equal(vad.probabilities(audio), probs)  # no state left over between calls
    assert vad.probabilities(np.zeros(0, np.float32)).shape == (0,)


def test_missing_or_bad_model_is_a_model_load_error(monkeypatch, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match="bad.onnx: cannot load the Silero VAD model"):
        SileroVad(bad)
    load_vad.cache_clear()
    monkeypatch.setattr(vad_module.importlib.util, "find_spec", lambda name: None)  # silero-vad not installed
    with pytest.raises(ModelLoadError, match=r"specli\[vad\]"):
        load_vad()
    res = CliRunner().invoke(main, ["transcribe", *TINY, "--vad", str(CLIP), "-o", str(tmp_path)])
    assert res.exit_code == ModelLoadError.exit_code and "specli[vad]" in res.stderr
    assert not list(tmp_path.glob("*.txt"))


def test_speech_probability_high_in_speech_and_low_in_digital_silence():
    clip = load_audio(CLIP)
    silence = np.zeros(2 * SAMPLE_RATE, np.float32)
    probs = load_vad().probabilities(np.concatenate([silence, clip, silence]))
    lead = len(silence) // FRAME_SAMPLES
    body = probs[lead + 30 : lead + (len(clip) // FRAME_SAMPLES) - 30]  # the clip, a second in from each end
    assert probs[: lead - 2].max() < 0.1 and probs[-(lead - 2) :].max() < 0.1
    assert np.median(body) > 0.9 and np.mean(body > 0.5) > 0.8


def test_speech_timestamps_of_padded_clip_cover_the_clip_only():
    clip = load_audio(CLIP)
    audio = np.concatenate([noise(LEAD), clip, noise(TAIL, seed=1)])
    found = speech_timestamps(audio)
    assert len(found) == 1
    start, end = found[0]
    lead = int(LEAD * SAMPLE_RATE)
    assert lead - 400 * MS - 0.5 * SAMPLE_RATE <= start <= lead + 0.5 * SAMPLE_RATE
    assert lead + len(clip) - 0.5 * SAMPLE_RATE <= end <= lead + len(clip) + 400 * MS + 0.5 * SAMPLE_RATE
    assert speech_timestamps(noise(10.0)) == [] and speech_timestamps(np.zeros(0, np.float32)) == []


# ---------------------------------------------------------------------------
# Speech timestamps from constructed probabilities
# ---------------------------------------------------------------------------


def test_one_block_of_speech_with_and_without_padding():
    probs = frames((0.0, 50), (0.9, 30), (0.0, 100))
    assert spans(probs, speech_pad_ms=0, min_silence_duration_ms=0) == [(50 * 512, 80 * 512)]
    # silence must last min_silence_duration_ms; the span still ends where the silence began
    assert spans(probs, speech_pad_ms=0) == [(50 * 512, 80 * 512)]
    assert spans(probs) == [(50 * 512 - 400 * MS, 80 * 512 + 400 * MS)]
    # padding is clamped to the audio
    assert spans(frames((0.9, 10)), n_samples=10 * 512 - 100) == [(0, 10 * 512 - 100)]


def test_short_speech_is_dropped():
    probs = frames((0.0, 50), (0.9, 5), (0.0, 100))  # 160 ms of speech
    assert spans(probs, speech_pad_ms=0, min_silence_duration_ms=100) == []
    assert spans(probs, speech_pad_ms=0, min_silence_duration_ms=100, min_speech_duration_ms=100) == [
        (50 * 512, 55 * 512)]
    # speech running into the end of the audio obeys the same rule
    assert spans(frames((0.0, 50), (0.9, 5)), speech_pad_ms=0) == []


def test_min_silence_joins_or_separates_speech():
    probs = frames((0.0, 20), (0.9, 40), (0.0, 31), (0.9, 40), (0.0, 100))  # a 992-ms pause
    assert spans(probs, speech_pad_ms=0) == [(20 * 512, 131 * 512)]
    assert spans(probs, speech_pad_ms=0, min_silence_duration_ms=500) == [(20 * 512, 60 * 512), (91 * 512, 131 * 512)]


def test_hysteresis_between_the_two_thresholds():
    between = frames((0.0, 20), (0.9, 20), (0.4, 200), (0.0, 100))  # 0.4: below threshold, above threshold - 0.15
    assert spans(between, speech_pad_ms=0, min_silence_duration_ms=0) == [(20 * 512, 240 * 512)]
    assert spans(between, speech_pad_ms=0, min_silence_duration_ms=0, neg_threshold=0.45) == [(20 * 512, 40 * 512)]
    assert spans(frames((0.0, 20), (0.4, 200)), speech_pad_ms=0) == []  # never reaches the threshold


def test_padding_shares_a_short_gap():
    probs = frames((0.0, 50), (0.9, 20), (0.0, 10), (0.9, 20), (0.0, 50))  # gap 320 ms < 2 x 400 ms
    a_end, b_start = 70 * 512, 80 * 512
    half = (b_start - a_end) // 2
    assert spans(probs, min_silence_duration_ms=100) == [
        (50 * 512 - 400 * MS, a_end + half), (b_start - half, 100 * 512 + 400 * MS)]


def test_long_speech_splits_at_the_last_pause():
    pause_at = 600  # frames (19.2 s)
    probs = frames((0.9, pause_at), (0.0, 10), (0.9, 600))  # a 320-ms pause inside 38.7 s of speech
    assert spans(probs, speech_pad_ms=0) == [(0, pause_at * 512), ((pause_at + 10) * 512, 1210 * 512)]


def test_long_speech_without_pause_is_cut_hard():
    out = spans(frames((0.9, 2000)), speech_pad_ms=0, max_speech_duration_s=10.0)  # 64 s
    assert len(out) == 7 and out[0][0] == 0 and out[-1][1] == 2000 * 512
    assert all(e - s <= 10 * SAMPLE_RATE for s, e in out)
    assert all(b[0] > a[1] for a, b in zip(out, out[1:]))


@settings(max_examples=200, deadline=None)
@given(
    blocks=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(1, 80)), min_size=1, max_size=30),
    cut=st.integers(0, 511),
    pad=st.sampled_from([0, 30, 400]),
    min_silence=st.sampled_from([0, 100, 2000]),
    min_speech=st.sampled_from([0, 250]),
    max_s=st.sampled_from([1.0, 3.0, 30.0]),
)
def test_spans_are_ordered_inside_the_audio_and_no_longer_than_the_maximum(
        blocks, cut, pad, min_silence, min_speech, max_s):
    probs = frames(*blocks)
    n = len(probs) * FRAME_SAMPLES - cut
    out = spans(probs, n, speech_pad_ms=pad, min_silence_duration_ms=min_silence,
                min_speech_duration_ms=min_speech, max_speech_duration_s=max_s)
    flat = [x for s in out for x in s]
    assert flat == sorted(flat) and all(0 <= x <= n for x in flat)
    assert all(0 < e - s <= max_s * SAMPLE_RATE for s, e in out)
    if not any(p >= 0.5 for p, _ in blocks):
        assert out == []


def _silero_utils(name: str):
    """``silero_vad.utils_vad.<name>``; the test is skipped when silero's Python module cannot be
    imported (importing it sets torch's threads to 1: restored)."""
    threads = torch.get_num_threads()
    try:
        from silero_vad import utils_vad
        return getattr(utils_vad, name)
    except (ImportError, AttributeError):
        pytest.skip("silero_vad's Python module cannot be imported here")
    finally:
        torch.set_num_threads(threads)


def test_probabilities_match_silero_own_onnx_wrapper():
    """The same frames, context and state handling as silero's OnnxWrapper (which needs torch)."""
    OnnxWrapper = _silero_utils("OnnxWrapper")  # noqa: N806
    audio = np.concatenate([noise(0.5), load_audio(CLIP)[: 3 * SAMPLE_RATE]])
    theirs = OnnxWrapper(str(load_vad().path), force_onnx_cpu=True)
    ref = [theirs(torch.from_numpy(audio[i : i + FRAME_SAMPLES].copy()), SAMPLE_RATE).item()
           for i in range(0, audio.size - FRAME_SAMPLES + 1, FRAME_SAMPLES)]
    np.testing.assert_allclose(load_vad().probabilities(audio)[: len(ref)], ref, atol=1e-5)


@pytest.fixture(scope="module")
def silero_reference():
    """Silero's own post-processing."""
    return _silero_utils("get_speech_timestamps_from_probs")


@settings(max_examples=150, deadline=None)
@given(
    blocks=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(1, 60)), min_size=1, max_size=25),
    cut=st.integers(0, 511),
    threshold=st.sampled_from([0.3, 0.5, 0.7]),
    pad=st.sampled_from([0, 30, 200]),
    min_silence=st.sampled_from([0, 100, 300, 2000]),
    min_speech=st.sampled_from([0, 250]),
    max_s=st.sampled_from([1.0, 2.0, 30.0]),
)
def test_same_spans_as_silero_reference(silero_reference, blocks, cut, threshold, pad, min_silence, min_speech, max_s):
    probs = frames(*blocks)
    n = len(probs) * FRAME_SAMPLES - cut
    opts = VadOptions(threshold=threshold, speech_pad_ms=pad, min_silence_duration_ms=min_silence,
                      min_speech_duration_ms=min_speech, max_speech_duration_s=max_s)
    try:
        ref = silero_reference([float(p) for p in probs], sampling_rate=SAMPLE_RATE, threshold=threshold,
                               min_speech_duration_ms=min_speech, max_speech_duration_s=max_s,
                               min_silence_duration_ms=min_silence, speech_pad_ms=pad,
                               use_max_poss_sil_at_max_speech=False, audio_length_samples=n)
    except TypeError:
        pytest.skip("this silero-vad has no legacy max-speech rule to compare with")
    assert timestamps_from_probabilities(probs, n, opts) == [(d["start"], d["end"]) for d in ref]


def test_options_are_validated():
    with pytest.raises(ValueError):
        VadOptions(threshold=1.0)
    with pytest.raises(ValueError):
        VadOptions(neg_threshold=0.6)
    with pytest.raises(ValueError):
        VadOptions(min_silence_duration_ms=-1)
    with pytest.raises(ValueError):
        VadOptions(max_speech_duration_s=0.5)  # shorter than a frame plus both pads
    assert VadOptions().exit_threshold == pytest.approx(0.35) and VadOptions(threshold=0.1).exit_threshold == 0.01


# ---------------------------------------------------------------------------
# Time map
# ---------------------------------------------------------------------------


def test_time_map_back_to_the_file():
    tmap = TimeMap([(16000, 32000), (64000, 96000)])  # 1-2 s and 4-6 s: 3 s of speech
    assert tmap.speech_seconds == 3.0
    assert tmap.to_original(0.0) == 1.0 and tmap.to_original(0.5) == 1.5
    assert tmap.to_original(1.0) == 4.0  # a start on the boundary opens the next span
    assert tmap.to_original(1.0, is_end=True) == 2.0  # an end on it closes the previous one
    assert tmap.to_original(2.5) == 5.5 and tmap.to_original(3.0, is_end=True) == 6.0
    assert tmap.to_original(9.0, is_end=True) == 6.0  # never past the last span
    words = (Word(0.5, 0.9, " a", 0.9), Word(0.9, 1.02, " b", 0.8), Word(1.1, 2.0, " c", 0.7))
    seg = Segment(0.5, 2.0, " a b c", (1, 2, 3), -0.1, 0.0, 1.0, words=words)
    moved = remap_segment(seg, tmap)
    assert (moved.start, moved.end) == (1.5, 5.0) and moved.text == seg.text
    # each word moves with the span holding its middle, so " b" does not straddle the 2-4 s gap
    assert [(w.start, w.end) for w in moved.words] == [(1.5, 1.9), (1.9, 2.0), (4.1, 5.0)]
    assert [w.word for w in moved.words] == [" a", " b", " c"]
    # an instant word on the boundary that closes its segment stays in the segment's span, inside the segment
    closing = Segment(0.5, 1.0, " a b", (1, 2), -0.1, 0.0, 1.0, words=(words[0], Word(1.0, 1.0, " b", 0.8)))
    moved = remap_segment(closing, tmap)
    assert (moved.start, moved.end) == (1.5, 2.0)
    assert [(w.start, w.end) for w in moved.words] == [(1.5, 1.9), (2.0, 2.0)]


# ---------------------------------------------------------------------------
# Real weights
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def padded_wavs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vad")
    clip = load_audio(CLIP)
    sf.write(folder / "padded.wav", np.concatenate([noise(LEAD), clip, noise(TAIL, seed=1)]), SAMPLE_RATE)
    sf.write(folder / "noise.wav", noise(12.0, seed=2, level=0.01), SAMPLE_RATE)
    sf.write(folder / "silence.wav", np.zeros(8 * SAMPLE_RATE, np.float32), SAMPLE_RATE)
    return folder


@pytest.mark.slow
def test_padded_clip_gives_the_clip_text_at_shifted_times(whisper_models, one_torch_thread):
    model = whisper_models("whisper-tiny.en")
    opts = TranscribeOptions()
    clip = load_audio(CLIP)
    plain = transcribe_stream(model, [clip], opts)
    padded = np.concatenate([noise(LEAD), clip, noise(TAIL, seed=1)])
    seen: list[float] = []
    vad = transcribe_speech(model, [padded[:300000], padded[300000:]], opts, VadOptions(), on_window=seen.append)
    assert plain.text and vad.text == plain.text
    assert len(vad.segments) == len(plain.segments)
    for a, b in zip(plain.segments, vad.segments):
        assert b.start - a.start == pytest.approx(LEAD, abs=0.5) and b.end - a.end == pytest.approx(LEAD, abs=0.5)
    assert vad.stats.audio_seconds == pytest.approx(padded.size / SAMPLE_RATE)
    assert seen and seen == sorted(seen) and seen[-1] == pytest.approx(padded.size / SAMPLE_RATE)


@pytest.mark.slow
def test_word_timings_are_mapped_back_too(whisper_models, one_torch_thread):
    model = whisper_models("whisper-tiny.en")
    opts = TranscribeOptions(word_timestamps=True)
    clip = load_audio(CLIP)
    plain = [w for s in transcribe_stream(model, [clip], opts).segments for w in s.words]
    padded = np.concatenate([noise(LEAD), clip, noise(TAIL, seed=1)])
    vad = [w for s in transcribe_speech(model, [padded], opts, VadOptions()).segments for w in s.words]
    assert plain and [w.word for w in vad] == [w.word for w in plain]
    for a, b in zip(plain, vad):
        assert b.start - a.start == pytest.approx(LEAD, abs=0.5) and b.end - a.end == pytest.approx(LEAD, abs=0.5)


@pytest.mark.slow
def test_two_utterances_with_a_long_gap_keep_their_own_times(whisper_models, one_torch_thread):
    model = whisper_models("whisper-tiny.en")
    first = load_audio(SAMPLES / "en" / "sense_and_sensibility_01_austen_64kb-0880.wav")  # "...ill disposed young man"
    second = load_audio(SAMPLES / "en" / "sense_and_sensibility_01_austen_64kb-0930.wav")  # "...made amiable himself"
    audio = np.concatenate([noise(1.0), first, noise(6.0, seed=1), second, noise(1.0, seed=2)])
    b_start = (SAMPLE_RATE + first.size + 6 * SAMPLE_RATE) / SAMPLE_RATE
    a_end = (SAMPLE_RATE + first.size) / SAMPLE_RATE
    assert len(speech_timestamps(audio)) == 2
    res = transcribe_speech(model, [audio], TranscribeOptions(word_timestamps=True), VadOptions())
    words = {w.word.strip(" .,").lower(): w for s in res.segments for w in s.words}
    assert {"young", "amiable"} <= set(words), res.text
    assert 1.0 - 0.5 <= words["young"].start and words["young"].end <= a_end + 0.5
    assert b_start - 0.5 <= words["amiable"].start and words["amiable"].end <= audio.size / SAMPLE_RATE
    assert all(s.start <= s.end for s in res.segments) and res.segments[-1].end > b_start


@pytest.mark.slow
def test_no_speech_gives_no_text(whisper_models, padded_wavs, one_torch_thread):
    model = whisper_models("whisper-tiny.en")
    for name in ("noise.wav", "silence.wav"):
        res = transcribe_speech(model, [load_audio(padded_wavs / name)], TranscribeOptions(), VadOptions())
        assert res.segments == [] and res.text == "" and res.stats.windows == 0


@pytest.mark.slow
def test_cli_vad(padded_wavs, tmp_path, one_torch_thread):
    out = tmp_path / "out"
    runner = CliRunner()
    res = runner.invoke(main, ["transcribe", *TINY, "--vad", "--vad-threshold", "0.5", str(padded_wavs / "padded.wav"),
                               str(padded_wavs / "silence.wav"), "-o", str(out), "-f", "json", "--jsonl", "-"])
    assert res.exit_code == 0, res.stderr
    recs = {Path(r["source"]).name: r for r in map(json.loads, res.stdout.splitlines())}
    assert recs["silence.wav"]["text"] == "" and recs["silence.wav"]["segments"] == []
    segs = recs["padded.wav"]["segments"]
    assert "dashwood" in recs["padded.wav"]["text"].lower()
    assert LEAD - 0.5 <= segs[0]["start"] and segs[-1]["end"] <= LEAD + len(load_audio(CLIP)) / SAMPLE_RATE + 0.5
    # changed VAD settings redo the outputs; the same ones skip them
    again = runner.invoke(main, ["transcribe", *TINY, "--vad", str(padded_wavs / "padded.wav"), "-o", str(out),
                                 "-f", "json"])
    assert again.exit_code == 0 and "0 ok, 0 failed, 1 skipped" in again.stderr
    other = runner.invoke(main, ["transcribe", *TINY, "--vad", "--vad-min-silence-ms", "500",
                                 str(padded_wavs / "padded.wav"), "-o", str(out), "-f", "json"])
    assert other.exit_code == 0 and "1 ok, 0 failed, 0 skipped" in other.stderr


def test_cli_vad_settings_need_vad(tmp_path):
    res = CliRunner().invoke(main, ["transcribe", *TINY, "--vad-threshold", "0.3", str(CLIP), "-o", str(tmp_path)])
    assert res.exit_code == 2 and "--vad-threshold needs --vad" in res.stderr
    res = CliRunner().invoke(main, ["transcribe", *TINY, "--vad", "--vad-threshold", "1.5", str(CLIP)])
    assert res.exit_code == 2


@pytest.mark.slow
def test_subprocess_vad_quiet_and_without_silero_module(padded_wavs, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "specli", "transcribe", *TINY, "--vad", "--threads", "1", "--no-progress",
         str(padded_wavs / "padded.wav"), "-o", str(out), "-f", "srt"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines() and len(proc.stderr.strip().splitlines()) == 1  # the summary only
    srt = (out / "padded.srt").read_text()
    first = re.search(r"(\d\d):(\d\d):(\d\d),(\d\d\d) -->", srt)
    h, m, sec, ms = map(int, first.groups())
    assert abs(h * 3600 + m * 60 + sec + ms / 1000 - LEAD) < 0.5 and "dashwood" in srt.lower()
    # silero_vad's Python module is never imported: tests/test_entry_points.py (a fresh interpreter)
