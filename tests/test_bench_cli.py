"""``specli bench`` end to end on two real clips: report files exist, parse, and outputs are lossless."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import EN_CLIPS
from specli.cli import main

pytestmark = pytest.mark.slow


def test_bench_tiny_en_two_clips(tmp_path):
    out = tmp_path / "bench"
    clips = [str(EN_CLIPS[2]), str(EN_CLIPS[4])]  # 3.0 s and 4.9 s: two length bins
    args = ["bench", *clips, "--presets", "whisper-tiny.en-ar,whisper-tiny.en-pool", "--peers", "hf",
            "--repeat", "1", "--no-warmup", "--threads", "2", "--references", "sidecar", "--out", str(out), "-q"]
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
    from specli.engines.targets.resolve import is_ct2_dir

    tiny = ct2_dir("whisper-tiny.en", root=tmp_path)
    assert is_ct2_dir(tiny) and not list(tmp_path.iterdir())  # single model.bin: used in place
    base = ct2_dir("whisper-base", root=tmp_path)
    assert base.parent == tmp_path and is_ct2_dir(base)
    assert (base / "model.bin").stat().st_size == 2 * 72608766
    assert not list(base.glob("model.bin.part*"))
    mtime = (base / "model.bin").stat().st_mtime_ns
    assert ct2_dir("whisper-base", root=tmp_path) == base and (base / "model.bin").stat().st_mtime_ns == mtime
