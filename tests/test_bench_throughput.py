"""``specli bench --batch-sizes``: whole-set throughput per (system, batch size) — the arithmetic on
hand-made runs, and the command end to end on real clips (CliRunner)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import EN_CLIPS
from specli.bench.throughput import ArchiveRun, markdown_section, parse_batch_sizes, throughput_table
from specli.cli import main

FILES = ("a.wav", "b.wav")


def _run(system: str, batch: int, repeat: int, wall: float, texts=("one two", "three four")) -> ArchiveRun:
    return ArchiveRun(system, batch, repeat, 20.0, wall, FILES, tuple(texts), ("en", "en"))


def test_parse_batch_sizes():
    assert parse_batch_sizes("1,2,4,8,16") == (1, 2, 4, 8, 16)
    assert parse_batch_sizes(" 2 , 8 ") == (2, 8)
    for bad in ("4,2", "1,1", "0,2", "-1", "a,b", ""):
        with pytest.raises(ValueError):
            parse_batch_sizes(bad)


def test_throughput_speedups_and_identity_from_median_repeats():
    runs = [
        _run("ar", 1, 0, 10.0), _run("ar", 1, 1, 12.0), _run("ar", 1, 2, 11.0),  # median 11
        _run("ar", 4, 0, 4.0), _run("ar", 4, 1, 5.0, ("one two", "three for")), _run("ar", 4, 2, 4.4),  # median 4.4
        _run("fw", 1, 0, 8.0, ("one two", "other")),
    ]
    rows = {(r["system"], r["batch_size"]): r for r in throughput_table(runs, "ar", {"a.wav": "one two"})}
    assert list(rows) == [("ar", 1), ("ar", 4), ("fw", 1)]
    base, batched, peer = rows[("ar", 1)], rows[("ar", 4)], rows[("fw", 1)]
    assert base["wall_seconds"] == 11.0 and base["walls"] == [10.0, 12.0, 11.0]
    assert base["throughput"] == pytest.approx(20.0 / 11.0) and base["speedup_vs_ar"] == pytest.approx(1.0)
    assert batched["wall_seconds"] == 4.4 and batched["throughput"] == pytest.approx(20.0 / 4.4)
    assert batched["speedup_vs_ar"] == pytest.approx(11.0 / 4.4)
    assert batched["speedup_vs_ar_same_batch"] == pytest.approx(1.0)
    assert (batched["identical_to_batch1"], batched["identical_to_baseline"]) == (2, 2)
    assert peer["speedup_vs_ar"] == pytest.approx(11.0 / 8.0)
    assert peer["speedup_vs_ar_same_batch"] == pytest.approx(11.0 / 8.0)
    assert (peer["identical_to_batch1"], peer["identical_to_baseline"]) == (2, 1)
    assert base["wer"] == 0.0 and peer["wer"] == 0.0  # only a.wav has a reference
    assert throughput_table(runs, "ar")[0]["wer"] is None
    with pytest.raises(ValueError, match="batch size 1"):
        throughput_table([r for r in runs if r.batch_size != 1 or r.system != "ar"], "ar")
    md = "\n".join(markdown_section(list(rows.values()), "ar"))
    assert "| ar | 4 | 2 | 20.0 | 4.40 | 4.55 | 2.50x | 1.00x | 2/2 | 2/2 | 0.0% |" in md
    assert "| 4 | 4.55 (2.50x) | - |" in md and "| 1 | 1.82 (1.00x) | 2.50 (1.38x) |" in md


def _bench(args):
    return CliRunner().invoke(main, ["bench", *map(str, args)])


@pytest.mark.slow
def test_batch_sizes_report_end_to_end(tmp_path):
    """AR tiny.en at batch sizes 1 and 2 beside faster-whisper's batched pipeline: every row measured,
    throughput = audio / wall, and batching changes no transcript (float32)."""
    out = tmp_path / "bench"
    clips = [EN_CLIPS[2], EN_CLIPS[3]]
    res = _bench([*clips, "--presets", "whisper-tiny.en-ar", "--peers", "faster-whisper-batched:float32",
                  "--batch-sizes", "1,2", "--dtype", "float32", "--repeat", "1", "--no-warmup", "--threads", "1",
                  "--references", "sidecar", "--out", out, "-q"])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    rows = {(r["system"], r["batch_size"]): r for r in report["throughput"]}
    assert set(rows) == {("whisper-tiny.en-ar", 1), ("whisper-tiny.en-ar", 2),
                         ("faster-whisper-batched:float32", 1), ("faster-whisper-batched:float32", 2)}
    audio = sum(len(__import__("soundfile").read(c)[0]) / 16000 for c in clips)
    for r in rows.values():
        assert r["files"] == 2 and r["audio_seconds"] == pytest.approx(audio, abs=1e-3)
        assert r["throughput"] == pytest.approx(r["audio_seconds"] / r["wall_seconds"])
        assert r["identical_to_batch1"] == 2 and r["identical_to_baseline"] == 2, r
        assert r["wer"] is not None and r["wer"] < 0.3
    assert [s["dtype"] for s in report["systems"]] == ["float32", "float32"]
    assert report["left_out"] == [] and len(report["runs"]) == 4
    md = (out / "report.md").read_text()
    assert "## Throughput by batch size" in md
    assert "| batch | whisper-tiny.en-ar | faster-whisper-batched:float32 |" in md
    assert "whisper-tiny.en-ar               batch   2" in res.stderr


def test_batch_sizes_and_peer_compute_types_are_validated(tmp_path):
    base = [EN_CLIPS[2], "--presets", "whisper-tiny.en-ar", "--out", tmp_path]
    for bad in ("2,1", "0", "x"):
        res = _bench([*base, "--batch-sizes", bad])
        assert res.exit_code == 2 and "--batch-sizes" in res.stderr, res.output
    res = _bench([*base, "--peers", "faster-whisper:int9"])
    assert res.exit_code == 2 and "compute type must be one of" in res.stderr, res.output
    res = _bench(["--from-runs", __file__, "--batch-sizes", "1,2", "--out", tmp_path])
    assert res.exit_code == 2 and "--from-runs" in res.output
