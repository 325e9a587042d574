"""Labels that survive a machine (issue 26): `distill labels` keeps token ids and window spans, `distill rebuild`
recomputes the shards from them and the audio, equal to the shards labelling wrote (real tiny.en, real speech,
a long-form file of several windows)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from click.testing import CliRunner

from conftest import EN_CLIPS
from specli.cli import main
from specli.core.device import CPUINFO, cpu_flags
from specli.distill.data import load_windows, read_manifest

PRESET = "whisper-tiny.en-ar"


def run(*args, code: int = 0):
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exit_code == code, res.output
    return res


@pytest.fixture(scope="module")
def labelled(tmp_path_factory, one_torch_thread):
    """Two short real clips and a ~47-s file of them joined (two windows or more), labelled by tiny.en."""
    root = tmp_path_factory.mktemp("labels")
    audio = root / "audio"
    audio.mkdir()
    clips = [shutil.copy(c, audio / c.name) for c in sorted(EN_CLIPS)[:2]]
    pause = np.zeros(16000, dtype=np.float32)
    joined = np.concatenate([x for c in sorted(EN_CLIPS) for x in (sf.read(c, dtype="float32")[0], pause)] * 2)
    sf.write(audio / "long.wav", joined, 16000)
    shards = root / "shards"
    run("distill", "data", audio, "--preset", PRESET, "--out", shards, "-q")
    run("distill", "labels", shards, "-o", root / "labels.jsonl")
    return root, [Path(c) for c in clips] + [audio / "long.wav"]


def _by_file(data_dir: Path) -> dict[str, list[dict]]:
    manifest = read_manifest(data_dir)
    return {key: torch.load(data_dir / e["shard"], weights_only=True)["windows"] for key, e in manifest["done"].items()}


def _assert_same(a: dict[str, list[dict]], b: dict[str, list[dict]]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert len(a[key]) == len(b[key])
        for x, y in zip(a[key], b[key]):
            assert x.keys() == y.keys()
            for k in x:
                assert torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k], (key, k)


def test_label_file_is_small_and_names_each_window(labelled):
    root, files = labelled
    lines = (root / "labels.jsonl").read_text().splitlines()
    header, entries = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    assert header["specli_labels"] == 1 and header["model"] == "whisper-tiny.en" and header["dtype"]
    assert sorted(e["audio"] for e in entries) == sorted(str(f.resolve()) for f in files)
    long = next(e for e in entries if e["audio"].endswith("long.wav"))
    starts = [w["start"] for w in long["windows"]]
    assert len(starts) >= 2 and starts[0] == 0 and starts == sorted(starts) and starts[1] > 0
    assert all(w["temperature"] == 0.0 and w["plen"] < len(w["tokens"]) for e in entries for w in e["windows"])
    assert (root / "labels.jsonl").stat().st_size < 20_000  # vs megabytes of shards


def test_rebuild_equals_labelling_bit_for_bit(labelled, tmp_path):
    root, _ = labelled
    run("distill", "rebuild", root / "labels.jsonl", "--preset", PRESET, "--out", tmp_path / "re", "-q")
    _assert_same(_by_file(root / "shards"), _by_file(tmp_path / "re"))
    assert len(load_windows(tmp_path / "re")) == len(load_windows(root / "shards"))
    res = run("distill", "rebuild", root / "labels.jsonl", "--preset", PRESET, "--out", tmp_path / "re", "-q")
    assert "0 file(s), 0 window(s) rebuilt; 3 already done" in res.output  # resumes


def test_moved_audio_is_found_by_name_and_checked_by_sha256(labelled, tmp_path):
    root, files = labelled
    moved = tmp_path / "moved"
    moved.mkdir()
    labels = (root / "labels.jsonl").read_text().replace(str(files[0].parent.resolve()), str(tmp_path / "gone"))
    (tmp_path / "labels.jsonl").write_text(labels)
    for f in files:
        shutil.copy(f, moved / f.name)
    (moved / files[1].name).write_bytes((moved / files[1].name).read_bytes()[:-2000])  # changed: wrong sha256
    res = run("distill", "rebuild", tmp_path / "labels.jsonl", "--preset", PRESET, "--out", tmp_path / "re",
              "--audio-dir", moved, "-q", code=1)
    assert files[1].name in res.output and "not found" in res.output
    done = read_manifest(tmp_path / "re")["done"]
    assert sorted(Path(k).name for k in done) == sorted([files[0].name, "long.wav"])  # the good ones rebuilt


def test_bad_label_files_are_clear_errors(labelled, tmp_path):
    root, _ = labelled
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"specli_labels": 1}\n{"audio": "x.wav", "windows": [{"start": 0}]}\n')
    res = run("distill", "rebuild", bad, "--preset", PRESET, "--out", tmp_path / "o", code=1)
    assert "bad.jsonl:2: missing sha256, plen, samples, temperature, tokens" in res.output
    bad.write_text("not json\n")
    assert "bad.jsonl:1: not JSON" in run("distill", "rebuild", bad, "--preset", PRESET, "--out", tmp_path / "o",
                                          code=1).output
    bad.write_text('{"audio": "x.wav"}\n')
    assert "not a specli label file" in run("distill", "rebuild", bad, "--preset", PRESET, "--out", tmp_path / "o",
                                            code=1).output
    other = tmp_path / "other.jsonl"
    lines = (root / "labels.jsonl").read_text().splitlines()
    other.write_text("\n".join([json.dumps(json.loads(lines[0]) | {"fingerprint": "0" * 16})] + lines[1:]))
    res = run("distill", "rebuild", other, "--preset", PRESET, "--out", tmp_path / "o2", code=1)
    assert "labelled by another target" in res.output


def test_shards_without_spans_cannot_be_exported(labelled, tmp_path):
    root, _ = labelled
    old = tmp_path / "old"
    shutil.copytree(root / "shards", old)
    manifest = json.loads((old / "manifest.json").read_text())
    for entry in manifest["done"].values():
        entry.pop("sha256")
    (old / "manifest.json").write_text(json.dumps(manifest))
    res = run("distill", "labels", old, "-o", tmp_path / "l.jsonl", code=1)
    assert "made before labels were kept" in res.output and not (tmp_path / "l.jsonl").exists()


def _within_one_timestamp_step(got: list[list[int]], want: list[list[int]]) -> bool:
    """The same windows of the same tokens, but that a timestamp token (>= <|0.00|>) may be one 20-ms step away
    from the label's."""
    return len(got) == len(want) and all(
        len(g) == len(w) and all(a == b or (min(a, b) >= TIMESTAMP_BEGIN and abs(a - b) == 1)
                                 for a, b in zip(g, w, strict=True))
        for g, w in zip(got, want, strict=True))


TIMESTAMP_BEGIN = 50363  # <|0.00|> of the English-only Whisper vocabulary (tiny.en)
COMMITTED = Path(__file__).resolve().parent.parent / "data" / "labels" / "tiny.en" / \
    "train__asterisk-en.transcribe.ts.jsonl"
ASTERISK_EN = Path("/usr/share/asterisk/sounds/en_US_f_Allison")


@pytest.mark.skipif(not ASTERISK_EN.is_dir(), reason="needs Debian's asterisk-core-sounds-en-wav (.ci/run installs it)")
def test_committed_labels_rebuild_from_regenerated_audio_and_stay_on_policy(tmp_path, one_torch_thread):
    """The committed tiny.en labels of real Asterisk speech: the clips regenerated by make_distill_audio.py are
    found by sha256, the shards rebuild, and labelling the same clips again gives the same token ids."""
    import subprocess
    import sys

    from specli.distill.labels import locate, read_labels

    repo = COMMITTED.parent.parent.parent.parent
    subprocess.run([sys.executable, str(repo / "scripts" / "make_distill_audio.py"), "--out", str(tmp_path / "audio"),
                    "--recordings-only", "--languages", "en"], check=True, capture_output=True)
    header, entries = read_labels(COMMITTED)
    subset = tmp_path / "subset.jsonl"
    subset.write_text("\n".join(json.dumps(x) for x in [header, *entries[:2]]) + "\n")
    run("distill", "rebuild", subset, "--preset", PRESET, "--out", tmp_path / "re", "--audio-dir", tmp_path / "audio",
        "-q")
    rebuilt = _by_file(tmp_path / "re")
    files = [locate(e, [tmp_path / "audio"]) for e in entries[:2]]
    run("distill", "data", *files, "--preset", PRESET, "--out", tmp_path / "again", "--dtype", header["dtype"], "-q")
    again = {Path(k).name: v for k, v in _by_file(tmp_path / "again").items()}
    # the labels were made in bf16 through oneDNN's AVX-512 BF16 kernels (a Zen 4): a CPU without native bf16, or
    # one with AMX (whose tile kernels oneDNN prefers: another summation order), rounds otherwise, and a near-tie
    # may move a timestamp pair (seen on an AVX2 machine: one more segment boundary; on a Sapphire Rapids Xeon: a
    # timestamp one 20-ms step earlier); there the words must still be the labelled ones. Even AVX-512 BF16 without
    # AMX is not one kernel everywhere (a Zen 5 rounds otherwise than the Zen 4: a timestamp pair one step later):
    # there every token must be the label's but a timestamp, which may be one 20-ms step away
    amx = "amx_bf16" in cpu_flags(CPUINFO.read_text(encoding="utf-8", errors="replace"))
    same_kernels = header["dtype"] != "bfloat16" or (bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) and not amx)
    for entry in entries[:2]:
        labelled = [w["tokens"] for w in entry["windows"]]
        assert [r["tokens"].tolist() for r in rebuilt[entry["audio"]]] == labelled
        relabelled = [r["tokens"].tolist() for r in again[Path(entry["audio"]).name]]
        if same_kernels:
            assert _within_one_timestamp_step(relabelled, labelled)
        else:
            words = lambda windows: [[t for t in w if t < 50256] for w in windows]  # noqa: E731 (text tokens)
            assert words(relabelled) == words(labelled)
