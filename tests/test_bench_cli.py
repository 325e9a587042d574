"""``specli bench`` end to end on two real clips: report files exist, parse, and outputs are lossless."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import EN_CLIPS, ES_CLIPS
from specli.cli import main

pytestmark = pytest.mark.slow


def test_bench_tiny_en_two_clips(tmp_path):
    out = tmp_path / "bench"
    clips = [str(EN_CLIPS[2]), str(EN_CLIPS[4])]  # 3.0 s and 4.9 s: two length bins
    args = ["bench", *clips, "--presets", "whisper-tiny.en-ar,whisper-tiny.en-pool", "--peers", "hf",
            "--repeat", "1", "--no-warmup", "--threads", "2", "--references", "sidecar", "--out", str(out), "-q",
            "--dtype", "float32"]  # transformers runs in float32: token-identical text is expected in float32
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    md = (out / "report.md").read_text()
    assert report["baseline"] == "whisper-tiny.en-ar"
    summaries = {s["system"]: s for s in report["summaries"]}
    assert list(summaries) == ["whisper-tiny.en-ar", "whisper-tiny.en-pool", "hf"]
    for name in ("whisper-tiny.en-pool", "hf"):
        ll = summaries[name]["lossless"]
        assert (ll["reference"], ll["identical"], ll["compared"]) == ("whisper-tiny.en-ar", 2, 2), name
    base = summaries["whisper-tiny.en-ar"]
    assert base["utterances"] == 2 and base["speedup_e2e"] == pytest.approx(1.0)
    assert base["tokens"] > 0 and base["acceptance_micro"] == pytest.approx(1.0)
    assert base["errors"]["utterances"] == 2 and base["errors"]["wer"] < 0.5
    assert len(report["utterances"]) == 6
    assert {b["bin"] for b in report["length_bins"]} == {"<3 s", "3-6 s"}
    assert "## Losslessness" in md and "| whisper-tiny.en-pool | `whisper-tiny.en-ar` | tokens | 2/2 |" in md
    assert report["machine"]["threads"] == 2 and report["machine"]["versions"]["torch"]


def test_bench_rejects_unknown_peer(tmp_path):
    result = CliRunner().invoke(main, ["bench", str(EN_CLIPS[0]), "--presets", "whisper-tiny.en-ar",
                                       "--peers", "nope", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "unknown peer" in result.output


def test_ct2_dir_joins_bundled_parts_once(tmp_path):
    from specli.bench.peers import ct2_dir
    from specli.models.whisper.resolve import is_ct2_dir

    tiny = ct2_dir("whisper-tiny.en", root=tmp_path)
    assert is_ct2_dir(tiny) and not list(tmp_path.iterdir())  # single model.bin: used in place
    base = ct2_dir("whisper-base", root=tmp_path)
    assert base.parent == tmp_path and is_ct2_dir(base)
    assert (base / "model.bin").stat().st_size == 2 * 72608766
    assert not list(base.glob("model.bin.part*"))
    mtime = (base / "model.bin").stat().st_mtime_ns
    assert ct2_dir("whisper-base", root=tmp_path) == base and (base / "model.bin").stat().st_mtime_ns == mtime


GAP = 0.5  # seconds of silence between concatenated clips


@pytest.fixture(scope="module")
def long_clip(tmp_path_factory):
    """A 32-s clip (over Whisper's 30-s window) made of the English samples, with its sidecar reference;
    the last sentence starts after the 30-s mark."""
    import numpy as np
    import soundfile as sf

    from specli.io.audio import load_audio

    parts = [*EN_CLIPS, EN_CLIPS[0]]
    gap = np.zeros(int(GAP * 16000), dtype=np.float32)
    audio = np.concatenate([x for clip in parts for x in (load_audio(clip), gap)])
    assert 31.0 < len(audio) / 16000 < 33.0
    out = tmp_path_factory.mktemp("long") / "long-en.wav"
    sf.write(out, audio, 16000, subtype="FLOAT")
    out.with_suffix(".txt").write_text(" ".join(p.with_suffix(".txt").read_text().strip() for p in parts) + "\n")
    return out


def _bench(args, **kwargs):
    result = CliRunner().invoke(main, ["bench", *args], **kwargs)
    return result


def test_peers_run_long_form_clips(tmp_path, long_clip):
    """Clips over 30 s go through each peer's long-form decoding; nothing is skipped."""
    out = tmp_path / "bench"
    args = [str(EN_CLIPS[2]), str(long_clip), "--presets", "whisper-tiny.en-ar", "--peers", "hf,faster-whisper",
            "--repeat", "1", "--no-warmup", "--threads", "1", "--references", "sidecar", "--out", str(out), "-q"]
    result = _bench(args)
    assert result.exit_code == 0, result.output
    assert "skipped" not in result.stderr, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["skipped"] == []
    summaries = {s["system"]: s for s in report["summaries"]}
    for name in ("hf", "faster-whisper"):
        s = summaries[name]
        assert s["utterances"] == 2 and s["skipped"] == 0 and s["audio_seconds"] > 33.0, s
        assert s["errors"]["utterances"] == 2 and s["errors"]["wer"] < 0.15, (name, s["errors"])
    long = [u for u in report["utterances"] if u["file"] == str(long_clip)]
    assert {u["system"] for u in long} == {"whisper-tiny.en-ar", "hf", "faster-whisper"}
    for u in long:  # all six sentences, the last one after the 30-s mark
        text = u["text"].lower()
        assert "dashwood" in text and "dialed" in text and text.count("first in line") == 2, (u["system"], text)
    lines = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [rec["kind"] for rec in lines] == ["header"] + ["run"] * 6


def test_a_peer_that_cannot_decode_a_clip_is_skipped_loudly(tmp_path, long_clip):
    """--no-timestamps: transformers cannot decode a 32-s clip without timestamp tokens. The benchmark goes
    on, the skip is warned on stderr (once) and summarised, and the report names it with the reason."""
    out = tmp_path / "bench"
    args = [str(EN_CLIPS[2]), str(long_clip), "--presets", "whisper-tiny.en-ar", "--peers", "hf",
            "--no-timestamps", "--repeat", "2", "--warmup", "--threads", "1", "--out", str(out), "-q", "--no-plots"]
    result = _bench(args)
    assert result.exit_code == 0, result.output
    reason = ("transformers decodes audio over 30 s only with timestamp tokens (long-form seeking); "
              "drop --no-timestamps to compare it on this file")
    assert result.stderr.count(f"warning: hf skipped {long_clip} (warm-up): {reason}") == 1, result.stderr
    assert result.stderr.count("warning: hf skipped") == 1
    assert "warning: 1 system/file pair(s) skipped on 1 file(s)" in result.stderr
    report = json.loads((out / "report.json").read_text())
    (skip,) = report["skipped"]
    assert (skip["system"], skip["file"], skip["repeats"], skip["reason"]) == ("hf", str(long_clip), [0, 1], reason)
    summaries = {s["system"]: s for s in report["summaries"]}
    assert (summaries["hf"]["utterances"], summaries["hf"]["skipped"]) == (1, 1)
    assert (summaries["whisper-tiny.en-ar"]["utterances"], summaries["whisper-tiny.en-ar"]["skipped"]) == (2, 0)
    md = (out / "report.md").read_text()
    assert "## Skipped runs" in md and "| system | file | audio s | passes | skipped: reason |" in md
    assert f"| hf | {long_clip} | {skip['audio_seconds']:.1f} | 1, 2 | {reason} |" in md
    assert "| hf | peer | float32 | 1 | 1 |" in md  # dtype, utts and skipped columns of the time table
    kinds = [json.loads(line)["kind"] for line in (out / "runs.jsonl").read_text().splitlines()]
    assert kinds.count("skip") == 2 and kinds.count("run") == 2 * 2 + 2


def test_baseline_given_as_a_toml_file(tmp_path):
    """--baseline my.toml: the report uses the file's preset (named after its stem) as the baseline."""
    toml = tmp_path / "my-base.toml"
    toml.write_text('model = "whisper-tiny.en"\nstrategy = "ar"\n')
    out = tmp_path / "bench"
    args = [str(EN_CLIPS[2]), "--presets", "whisper-tiny.en-pool", "--baseline", str(toml), "--repeat", "1",
            "--no-warmup", "--threads", "1", "--out", str(out), "-q", "--no-plots"]
    result = _bench(args)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["baseline"] == "my-base"
    summaries = {s["system"]: s for s in report["summaries"]}
    assert list(summaries) == ["my-base", "whisper-tiny.en-pool"]
    ll = summaries["whisper-tiny.en-pool"]["lossless"]
    assert (ll["reference"], ll["identical"], ll["compared"]) == ("my-base", 1, 1)
    # the same preset given by path in --presets too is one system, not two
    result = _bench([*args[:2], "whisper-tiny.en-pool," + str(toml), *args[3:]])
    assert result.exit_code == 0, result.output
    assert [s["system"] for s in json.loads((out / "report.json").read_text())["summaries"]] == [
        "my-base", "whisper-tiny.en-pool"]


def test_runs_survive_a_failing_report_and_rebuild_it(tmp_path, monkeypatch):
    """Every run is on disk (runs.jsonl) before the report is built; --from-runs builds it again."""
    import specli.bench.runner as runner

    def broken(*_args, **_kwargs):
        raise KeyError("a bug in the report step")

    real = runner.build_report
    monkeypatch.setattr(runner, "build_report", broken)
    out = tmp_path / "bench"
    clips = [str(EN_CLIPS[2]), str(EN_CLIPS[3])]
    result = _bench([*clips, "--presets", "whisper-tiny.en-ar,whisper-tiny.en-pool", "--repeat", "2",
                     "--no-warmup", "--threads", "1", "--references", "sidecar", "--out", str(out), "-q"])
    assert result.exit_code != 0 and isinstance(result.exception, KeyError)
    assert not (out / "report.json").exists()
    runs = out / "runs.jsonl"
    lines = [json.loads(line) for line in runs.read_text().splitlines()]
    assert [rec["kind"] for rec in lines] == ["header"] + ["run"] * 8
    assert lines[0]["baseline"] == "whisper-tiny.en-ar" and all(rec["text"] for rec in lines[1:])
    monkeypatch.setattr(runner, "build_report", real)
    rebuilt = tmp_path / "rebuilt"
    result = _bench(["--from-runs", str(runs), "--out", str(rebuilt), "--no-plots"])
    assert result.exit_code == 0, result.output
    report = json.loads((rebuilt / "report.json").read_text())
    summaries = {s["system"]: s for s in report["summaries"]}
    assert summaries["whisper-tiny.en-ar"]["utterances"] == 2
    assert summaries["whisper-tiny.en-ar"]["errors"]["utterances"] == 2  # sidecar references found again
    ll = summaries["whisper-tiny.en-pool"]["lossless"]
    assert (ll["identical"], ll["compared"]) == (2, 2)
    assert report["run"]["elapsed_seconds"] is None and report["machine"]["threads"] == 1
    assert "elapsed - s" in (rebuilt / "report.md").read_text()


def test_bench_translate_task_runs_presets_and_peer_on_english_output(tmp_path):
    """--task translate: the whisper-base presets and faster-whisper all translate a Spanish clip to English
    (the EAGLE preset token-identical to AR); an English-only model is refused before measuring."""
    def run(task: str) -> dict:
        out = tmp_path / task
        args = ["bench", str(ES_CLIPS[0]), "--presets", "whisper-base-ar,whisper-eagle-asr", "--peers",
                "faster-whisper", "--task", task, "--language", "es", "--repeat", "1", "--no-warmup", "--threads", "2",
                "--dtype", "float32", "--no-plots", "--out", str(out), "-q"]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        return json.loads((out / "report.json").read_text())

    report = run("translate")
    assert report["run"]["options"]["task"] == "translate"
    ll = {s["system"]: s for s in report["summaries"]}["whisper-eagle-asr"]["lossless"]
    assert (ll["identical"], ll["compared"]) == (1, 1)
    english = {u["system"]: u["text"] for u in report["utterances"]}
    spanish = {u["system"]: u["text"] for u in run("transcribe")["utterances"]}
    for system in ("whisper-base-ar", "faster-whisper"):  # another text than the Spanish transcript
        assert english[system].strip() and english[system] != spanish[system], (system, english[system])
    refused = CliRunner().invoke(main, ["bench", str(EN_CLIPS[0]), "--presets", "whisper-tiny.en-ar", "--task",
                                        "translate", "--out", str(tmp_path / "x"), "-q"])
    assert refused.exit_code != 0 and "English-only" in refused.output
