"""DecodingOptions (validation, suppress ids, temperature schedule), prompts (initial prompt, hotwords,
reset after a hot window), seeds, and the decoding flags through the CLI on whisper-tiny.en."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import EN_CLIPS
from specli.io.audio import SAMPLE_RATE, iter_audio_chunks, load_audio
from specli.cli import main
from specli.commands.decoding_flags import temperature_schedule
from specli.models.speech import DecodingOptions, suppress_ids
from specli.asr.windows import TranscribeOptions, transcribe_stream
from specli.errors import UsageError

pytestmark = pytest.mark.usefixtures("one_torch_thread", "memo_loaders")
CLIP = EN_CLIPS[1]


@pytest.mark.parametrize("bad", [
    dict(temperatures=()), dict(temperatures=(-0.1,)), dict(best_of=0), dict(beam_size=0),
    dict(patience=2.0), dict(beam_size=2, patience=0.0), dict(length_penalty=1.5), dict(no_speech_threshold=1.2),
    dict(suppress_tokens=(-2,)),
])
def test_invalid_options_are_usage_errors(bad):
    with pytest.raises(UsageError):
        DecodingOptions(**bad)


def test_defaults_are_whispers_and_at_pins_one_temperature():
    opts = DecodingOptions()
    assert opts.temperatures == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0) and opts.best_of == 5 and opts.beam_size is None
    assert (opts.compression_ratio_threshold, opts.logprob_threshold, opts.no_speech_threshold) == (2.4, -1.0, 0.6)
    one = opts.at(0.4)
    assert one.temperatures == (0.4,) and one.temperature == 0.4 and one.best_of == 5


def test_suppress_ids():
    assert suppress_ids(DecodingOptions(), (7, 8), (1,)) == (1, 7, 8)
    assert suppress_ids(DecodingOptions(suppress_tokens=(-1, 9)), (7, 8), (1,)) == (1, 7, 8, 9)
    assert suppress_ids(DecodingOptions(suppress_tokens=(9,)), (7, 8), (1,)) == (1, 9)  # no -1: no default set
    assert suppress_ids(DecodingOptions(suppress_tokens=()), (7, 8), (1,)) == (1,)


@pytest.mark.parametrize("start,inc", [(0.0, 0.2), (0.0, 0.25), (0.3, 0.2), (1.0, 0.2), (0.5, 0.0)])
def test_temperature_schedule_is_whispers(start, inc):
    expected = tuple(np.arange(start, 1.0 + 1e-6, inc)) if inc else (start,)  # openai-whisper's cli()
    assert temperature_schedule((start,), inc) == pytest.approx(expected)
    assert temperature_schedule((0.0, 0.5), inc) == (0.0, 0.5)  # a list is used as given


# ------------------------------------------------------------------------------ prompts and seeds (real)


def _run(model, audio, decoding: DecodingOptions):
    prompts: list[list[int]] = []
    res = transcribe_stream(model, [audio], TranscribeOptions(decoding=decoding),
                            on_decode=lambda _state, prompt, _win, _span: prompts.append(prompt))
    return res, prompts


@pytest.fixture(scope="module")
def long_audio():
    """The English clips twice, with pauses: about 58 s, two or more 30-s windows."""
    parts = [load_audio(c) for c in EN_CLIPS] * 2
    gap = np.zeros(SAMPLE_RATE, dtype=np.float32)
    return np.concatenate([p for a in parts for p in (a, gap)])


@pytest.mark.slow
def test_initial_prompt_and_hotwords_lead_the_prompt(whisper_models, long_audio):
    model = whisper_models("whisper-tiny.en")
    sp, enc = model.special, model.tokenizer.encode
    res, prompts = _run(model, long_audio, DecodingOptions(temperatures=(0.0,), initial_prompt="  Marianne, Elinor."))
    assert len(prompts) >= 2
    assert prompts[0] == [sp.sot_prev, *enc(" Marianne, Elinor."), *sp.prompt(None, timestamps=True)]
    assert prompts[1][: len(prompts[0]) - 1] == prompts[0][:-1]  # then the first window's text follows it
    _, hot = _run(model, long_audio, DecodingOptions(temperatures=(0.0,), hotwords="Dashwood",
                                                     condition_on_previous_text=False))
    assert all(p == [sp.sot_prev, *enc(" Dashwood"), *sp.prompt(None, timestamps=True)] for p in hot)


@pytest.mark.slow
def test_a_window_decoded_hot_does_not_prompt_the_next(whisper_models, long_audio):
    model = whisper_models("whisper-tiny.en")
    sot_seq = model.special.prompt(None, timestamps=True)
    _, warm = _run(model, long_audio, DecodingOptions(temperatures=(0.4,), best_of=1, seed=0))
    assert any(p != sot_seq for p in warm[1:])  # at 0.4 the previous text is kept ...
    _, hot = _run(model, long_audio, DecodingOptions(temperatures=(0.6,), best_of=1, seed=0))
    assert all(p == sot_seq for p in hot)  # ... above 0.5 it is dropped


@pytest.mark.slow
def test_seed_makes_sampling_reproducible(whisper_models):
    model = whisper_models("whisper-tiny.en")
    audio = load_audio(EN_CLIPS[2])
    hot = dict(temperatures=(0.8,), best_of=1, condition_on_previous_text=False)
    a = _run(model, audio, DecodingOptions(**hot, seed=5))[0]
    b = _run(model, audio, DecodingOptions(**hot, seed=5))[0]
    assert [s.tokens for s in a.segments] == [s.tokens for s in b.segments]
    texts = {_run(model, audio, DecodingOptions(**hot, seed=s))[0].text for s in range(4)}
    assert len(texts) > 1, "different seeds never gave different samples: the seed is not used"


def test_suppressed_tokens_are_never_emitted(whisper_models):
    model = whisper_models("whisper-tiny.en")
    greedy = transcribe_stream(model, iter_audio_chunks(CLIP), TranscribeOptions(decoding=DecodingOptions()))
    comma = model.tokenizer.encode(",")[0]
    period = model.tokenizer.encode(".")[0]
    used = [t for s in greedy.segments for t in s.tokens]
    assert comma in used or period in used
    opts = TranscribeOptions(decoding=DecodingOptions(suppress_tokens=(-1, comma, period)))
    out = transcribe_stream(model, iter_audio_chunks(CLIP), opts)
    assert not {comma, period} & {t for s in out.segments for t in s.tokens}
    assert out.text.strip()


# ------------------------------------------------------------------------------------------------- CLI


def test_cli_flags_reach_the_decoder(tmp_path):
    args = ["transcribe", str(CLIP), "--preset", "whisper-tiny.en-ar", "-o", str(tmp_path), "-f", "json",
            "--beam-size", "3", "--patience", "1.5", "--temperature", "0", "--temperature-increment-on-fallback", "0.5",
            "--best-of", "2", "--seed", "3", "--initial-prompt", "Dashwood.", "--no-condition-on-previous-text",
            "--compression-ratio-threshold", "2.2", "--logprob-threshold", "-1.5", "--no-speech-threshold", "0.5",
            "--suppress-tokens", "-1,11", "--hotwords", "Norland", "--no-fallback-silence"]
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / f"{CLIP.stem}.json").read_text())
    assert data["text"].strip() and all(s["temperature"] in (0.0, 0.5, 1.0) for s in data["segments"])
    assert 11 not in [t for s in data["segments"] for t in s["tokens"]]  # 11 = "," in the GPT-2 vocabulary


@pytest.mark.parametrize("bad", [["--patience", "2"], ["--temperature", "hot"], ["--suppress-tokens", "a,b"],
                                 ["--beam-size", "0"], ["--temperature", "-1"]])
def test_bad_decoding_flags_exit_2(tmp_path, bad):
    res = CliRunner().invoke(main, ["transcribe", str(CLIP), "--preset", "whisper-tiny.en-ar", "-o", str(tmp_path),
                                    *bad])
    assert res.exit_code == 2, res.output


@pytest.mark.slow
def test_speculative_preset_with_fallback_flags(tmp_path):
    args = ["transcribe", str(CLIP), "--preset", "whisper-tiny.en-eagle-asr", "-o", str(tmp_path), "-f", "json",
            "--temperature", "0,0.6", "--best-of", "2", "--seed", "7", "--logprob-threshold", "0",
            "--no-speech-threshold", "1", "--threads", "1"]
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    data = json.loads((tmp_path / f"{CLIP.stem}.json").read_text())
    # log-probabilities are below 0: every window fails at 0 and is sampled at 0.6 (speculatively)
    assert data["segments"] and all(s["temperature"] == 0.6 for s in data["segments"])
    assert data["stats"]["fallback_windows"] == data["stats"]["windows"]
