"""Issue 42, the synthesis half: outputs named per input (another input's output is never overwritten), an output
that cannot be written fails its line only, output directories checked before any model loads (synthesize, bench,
distill), an empty input file is a failure, long lines spoken in pieces, and the seed recorded only where it changes
the output (tiny CosyVoice checkpoints; the shipped voice specli-en where its HiFi-GAN vocoder matters)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner
from cosyvoice_fixtures import write_checkpoint
from flow_fixtures import write_audio_checkpoint

from specli.cli import main
from specli.io.outputs import path_tag
from specli.tts.split import Unsplittable, short_pieces, split_to_fit

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CV2_EOS = 6561  # boosted, CosyVoice2 stops at its minimum length: 2 speech tokens a text token (short, fast runs)
LONG = ", ".join(["this clause goes on and on without an end"] * 15) + "."  # one 644-character sentence


@pytest.fixture(scope="module")
def cv2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("cv2") / "ckpt", "cosyvoice2", seed=3, boost=CV2_EOS)


@pytest.fixture(scope="module")
def cv2a(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """With flow and HiFT; stops at its minimum length as ``cv2``."""
    return write_audio_checkpoint(tmp_path_factory.mktemp("cv2a") / "ckpt", seed=3, boost=CV2_EOS, kind="cosyvoice2")


def _run(*args: object):
    return CliRunner().invoke(main, ["synthesize", *map(str, args)], catch_exceptions=False)


def _visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def _records(res) -> list[dict]:
    return [json.loads(x) for x in res.stdout.splitlines()]


def test_the_same_file_name_from_another_directory_never_overwrites(tmp_path: Path, cv2: Path) -> None:
    for d, text in (("d1", "first file line"), ("d3", "third file line")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "x.txt").write_text(text + "\n")
    out = tmp_path / "out"
    args = ("--model", cv2, "--format", "npy", "-o", out, "--jsonl", "-")
    first = _run(tmp_path / "d1" / "x.txt", *args)
    assert first.exit_code == 0 and _visible(out) == ["x_00001.npy"]
    d1_bytes = (out / "x_00001.npy").read_bytes()
    second = _run(tmp_path / "d3" / "x.txt", *args)
    assert second.exit_code == 0, second.stderr
    moved = f"x-{path_tag(tmp_path / 'd3' / 'x.txt')}_00001"
    assert _visible(out) == sorted(["x_00001.npy", f"{moved}.npy"])
    assert (out / "x_00001.npy").read_bytes() == d1_bytes  # d1's output is kept
    assert "redoing" not in second.stderr and f"naming x_00001 {moved}" in second.stderr
    rec = _records(second)[0]
    assert rec["id"] == moved and rec["text"] == "third file line"
    assert rec["source"] == str((tmp_path / "d3" / "x.txt").resolve())
    again = _run(tmp_path / "d3" / "x.txt", *args)  # d3 resumes under its own name; d1 too under its own
    assert "1 skipped" in again.stderr and _records(again) == [rec]
    assert "1 skipped" in _run(tmp_path / "d1" / "x.txt", *args).stderr
    # both in one run: each gets its path tag (no duplicate id), next to --text's own text_00001
    both = _run(tmp_path / "d1" / "x.txt", tmp_path / "d3" / "x.txt", "--text", "hi", *args[:-4], "-o",
                tmp_path / "both")
    assert both.exit_code == 0, both.stderr
    assert len(_visible(tmp_path / "both")) == 3 and "text_00001.npy" in _visible(tmp_path / "both")


@pytest.mark.parametrize("fmt,batch", [("npy", 1), ("npy", 2), ("wav", 1), ("wav", 2)])
def test_an_unwritable_output_fails_its_line_only(tmp_path: Path, cv2a: Path, fmt: str, batch: int) -> None:
    manifest = tmp_path / "set.jsonl"
    manifest.write_text("".join(json.dumps({"id": rid, "text": text}) + "\n"
                                for rid, text in (("ok1", "one"), ("L" * 250, "two"), ("ok3", "three"))))
    out = tmp_path / "out"
    res = _run(manifest, "--model", cv2a, "--sampler", "greedy", "--format", fmt, "--batch-size", batch, "-o", out)
    assert res.exit_code == 1
    failed = [line for line in res.stderr.splitlines() if line.startswith("failed:")]
    assert len(failed) == 1 and failed[0].startswith(f"failed: {manifest}:2: cannot write {out / ('L' * 250)}.{fmt}")
    assert "too long" in failed[0].lower() and ".part" not in failed[0] and ".specli" not in failed[0]
    assert _visible(out) == [f"ok1.{fmt}", f"ok3.{fmt}"]
    assert re.search(r"^utterances: 2 ok, 1 failed, 0 skipped", res.stderr, flags=re.M)


def _refuse(*_a, **_k):
    raise AssertionError("a model was loaded before the output directory was checked")


@pytest.mark.parametrize("command", ["synthesize", "bench", "bench synthesis", "distill data",
                                     "distill data (speech)"])
def test_an_output_dir_below_a_file_is_a_usage_error_before_any_model_loads(tmp_path: Path, command: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for where in ("specli.commands.synthesize.load_synthesizer", "specli.commands.bench.run_bench",
                  "specli.commands.bench.run_synthesis_bench", "specli.commands.distill._load_target",
                  "specli.commands.distill_speech.load_speech_target"):
        monkeypatch.setattr(where, _refuse)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    audio = tmp_path / "a.wav"
    sf.write(audio, np.zeros(16000, dtype=np.float32), 16000)
    texts = tmp_path / "t.txt"
    texts.write_text("hello\n")
    args = {
        "synthesize": ["synthesize", "--text", "hi", "-o", blocker / "sub"],
        "bench": ["bench", audio, "--presets", "whisper-base-ar", "--repeat", "1", "--no-warmup",
                  "--out", blocker / "sub"],
        "bench synthesis": ["bench", texts, "--presets", "specli-en-ar", "--out", blocker / "sub"],
        "distill data": ["distill", "data", audio, "--preset", "whisper-eagle-asr", "--out", blocker / "sub"],
        "distill data (speech)": ["distill", "data", texts, "--preset", "cosyvoice3-ar", "--out", blocker / "sub"],
    }[command]
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exit_code == 2, (res.output, res.exception)
    assert f"{blocker} is not a directory" in res.output
    assert blocker.read_text() == "not a directory"


def test_an_empty_text_file_is_a_failed_input(tmp_path: Path, cv2: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    res = _run(empty, "--model", cv2, "--format", "npy", "-o", tmp_path / "out")
    assert res.exit_code == 1
    assert f"failed: {empty}: file is empty (0 bytes)" in res.stderr and "0 ok, 1 failed" in res.stderr


def test_a_600_character_sentence_is_spoken_in_pieces_into_one_output(tmp_path: Path, cv2a: Path) -> None:
    assert len(LONG) > 600 and LONG.count(".") == 1
    outs = {}
    for batch in (1, 2):
        out = tmp_path / f"b{batch}"
        res = _run("--text", LONG, "--model", cv2a, "--sampler", "greedy", "--batch-size", batch, "-o", out,
                   "--jsonl", "-")
        assert res.exit_code == 0, res.stderr
        assert _visible(out) == ["text_00001.wav"]
        rec = _records(res)[0]
        assert len(rec["pieces"]) > 1 and sum(rec["pieces"]) == rec["tokens"] and rec["finished"]
        assert rec["tokens"] == rec["min_len"] == 2 * rec["text_tokens"]  # every piece stopped at its minimum
        # the pieces' audio one after another: 2 mel frames a token, 480 samples a frame, no gap
        assert sf.info(out / "text_00001.wav").frames == 960 * rec["tokens"] == 480 * rec["mel_frames"]
        outs[batch] = (out / "text_00001.wav").read_bytes()
    assert outs[1] == outs[2]


def test_split_to_fit_prefers_sentences_then_clauses_then_words() -> None:
    fits = lambda s: len(s) <= 40  # noqa: E731
    text = "Hello there. This is a long sentence, with a clause, and another clause that goes on. Short one!"
    pieces = split_to_fit(text, fits)
    assert pieces == ["Hello there.", "This is a long sentence, with a clause,", "and another clause that goes on.",
                      "Short one!"]
    assert split_to_fit("one two three four five six seven eight nine ten eleven twelve", fits) == [
        "one two three four five six seven eight", "nine ten eleven twelve"]
    assert split_to_fit("短句。很长的中文句子，继续说下去。", lambda s: len(s) <= 8) == [
        "短句。", "很长的中文句子，", "继续说下去。"]
    with pytest.raises(Unsplittable) as err:
        split_to_fit("ok. " + "a" * 50, fits)
    assert err.value.part == "a" * 50


def test_short_pieces_cut_after_sentences_and_clauses_never_between_words() -> None:
    text = "In particular, if you want a certain amount of computer power, buy one biggie. Then rest."
    assert short_pieces(text, 0) == [text]
    assert short_pieces(text, 20) == [text]
    assert short_pieces(text, 15) == ["In particular, if you want a certain amount of computer power, buy one biggie.",
                                      "Then rest."]
    assert short_pieces(text, 5) == ["In particular,", "if you want a certain amount of computer power,",
                                     "buy one biggie.", "Then rest."]  # a 9-word clause stays whole
    assert short_pieces("one two three four five six seven", 3) == ["one two three four five six seven"]
    assert short_pieces("one two three, four five six. —", 3) == ["one two three,", "four five six. —"]
    with pytest.raises(ValueError):
        short_pieces(text, -1)


@pytest.mark.parametrize("value", ["-1", "2.5", "true", "ten"])
def test_a_bad_max_piece_words_is_refused_naming_the_yaml(tmp_path: Path, value: str) -> None:
    from specli.errors import ModelLoadError
    from specli.models.cosyvoice.lm import read_spec

    ckpt = write_checkpoint(tmp_path / "ckpt", "cosyvoice2", seed=3, boost=CV2_EOS)
    yaml = ckpt / "cosyvoice2.yaml"
    yaml.write_text(yaml.read_text(encoding="utf-8") + f"max_piece_words: {value}\n", encoding="utf-8")
    with pytest.raises(ModelLoadError, match="cosyvoice2.yaml.*max_piece_words"):
        read_spec(yaml)


def test_a_voice_with_max_piece_words_speaks_a_long_line_in_pieces(tmp_path: Path) -> None:
    """Greedy: the line's tokens are its pieces' tokens, each as if spoken alone; a short line stays whole, and so
    does the long one without the key (upstream's rule)."""
    plain = write_checkpoint(tmp_path / "plain", "cosyvoice2", seed=3, boost=CV2_EOS)
    cut = write_checkpoint(tmp_path / "cut", "cosyvoice2", seed=3, boost=CV2_EOS)
    yaml = cut / "cosyvoice2.yaml"
    yaml.write_text(yaml.read_text(encoding="utf-8") + "max_piece_words: 4\n", encoding="utf-8")
    pieces = ["Hello there, my friend.", "This is a test,", "and it goes on."]
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join([" ".join(pieces), "Short line here.", *pieces]) + "\n", encoding="utf-8")
    recs, tokens = {}, {}
    for name, model in (("plain", plain), ("cut", cut)):
        res = _run(lines, "--model", model, "--sampler", "greedy", "--format", "npy", "-o", tmp_path / name,
                   "--jsonl", "-")
        assert res.exit_code == 0, res.stderr
        recs[name] = _records(res)
        tokens[name] = [np.load(tmp_path / name / f"lines_{k:05d}.npy") for k in range(1, 6)]
    assert "pieces" not in recs["plain"][0] and "pieces" not in recs["cut"][1]
    assert recs["cut"][0]["pieces"] == [len(t) for t in tokens["cut"][2:]]
    assert np.array_equal(tokens["cut"][0], np.concatenate(tokens["cut"][2:]))
    assert not np.array_equal(tokens["cut"][0], tokens["plain"][0])
    for k in range(1, 5):  # lines of at most four words: the same with and without the key
        assert np.array_equal(tokens["cut"][k], tokens["plain"][k])
    args = (lines, "--model", cut, "--sampler", "greedy", "--format", "npy", "-o", tmp_path / "cut")
    assert "0 ok, 0 failed, 5 skipped" in _run(*args).stderr
    yaml.write_text(yaml.read_text(encoding="utf-8").replace("max_piece_words: 4", "max_piece_words: 5"))
    redone = _run(*args)  # a changed piece length redoes the outputs
    assert "5 ok" in redone.stderr and "max_piece_words 4 -> 5" in redone.stderr


def test_another_seed_keeps_greedy_outputs_of_a_vocoder_without_noise(tmp_path: Path) -> None:
    """The shipped voice: greedy tokens and a HiFi-GAN vocoder, so the seed changes nothing (HiFT's outputs are
    redone: tests/test_synthesis_resume.py)."""
    out = tmp_path / "out"
    first = _run("--text", "Hi.", "-o", out, "--threads", "1")
    assert first.exit_code == 0, first.stderr
    wav = (out / "text_00001.wav").read_bytes()
    again = _run("--text", "Hi.", "-o", out, "--seed", "5", "--threads", "1")
    assert again.exit_code == 0 and "1 skipped" in again.stderr and "redoing" not in again.stderr
    assert (out / "text_00001.wav").read_bytes() == wav


def test_stale_part_files_of_this_runs_outputs_are_removed(tmp_path: Path, cv2: Path) -> None:
    """A SIGKILL inside a write leaves a hidden ``.part``: the next run over those outputs removes it (and leaves
    other files alone)."""
    (tmp_path / "x.txt").write_text("one line\n")
    out = tmp_path / "out"
    out.mkdir()
    stale = [out / ".x_00001.npy.0123abcd.part", out / "..x_00001.npy.specli.89abcdef.part"]
    other = out / ".y_00001.npy.0123abcd.part"  # no output of this run
    for p in [*stale, other]:
        p.write_bytes(b"partial")
    res = _run(tmp_path / "x.txt", "--model", cv2, "--format", "npy", "-o", out)
    assert res.exit_code == 0, res.stderr
    assert not any(p.exists() for p in stale) and other.exists()
