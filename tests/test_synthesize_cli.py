"""``specli synthesize`` end to end on tiny CosyVoice2/3 checkpoints (Click runner)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cosyvoice_fixtures import write_checkpoint
from specli.cli import main
from specli.tts.acoustic.pipeline import vocoder_dtype


@pytest.fixture(scope="module")
def cv2(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("cv2") / "ckpt", "cosyvoice2", seed=3)


@pytest.fixture(scope="module")
def cv3(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("cv3") / "ckpt", "cosyvoice3", seed=4)


def _run(args, input=None):
    return CliRunner().invoke(main, ["synthesize", "--format", "npy", *args], input=input, catch_exceptions=False)


def _npy(path):
    return np.load(path).tolist()


def _outputs(folder):
    """The outputs in ``folder``, without the hidden resume sidecars (``.<output>.specli``)."""
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def test_batch_with_bad_lines_resume_and_overwrite(tmp_path, cv2):
    lines = tmp_path / "lines.txt"
    lines.write_text("hi\n\nok then\n" + "w" * 600 + "\n")  # too long, and no boundary to split it at
    manifest = tmp_path / "set.jsonl"
    manifest.write_text("\n".join([
        json.dumps({"id": "m1", "text": "yes", "prompt_text": "a b", "prompt_tokens": [1, 2, 3]}),
        json.dumps({"id": "m2", "text": "no", "prompt_wav": "p.wav"}),
        "{not json",
        json.dumps({"id": "m1", "text": "again"}),
    ]) + "\n")
    out = tmp_path / "out"
    args = ["--model", str(cv2), str(lines), str(manifest), "--text", "hey", "-o", str(out), "--jsonl", "-"]
    res = _run(args)
    assert res.exit_code == 1
    assert [p.name for p in _outputs(out)] == ["lines_00001.npy", "lines_00003.npy", "m1.npy", "text_00001.npy"]
    err = res.stderr
    assert f"{lines}:2: empty line" in err and f"{lines}:4: too long" in err
    assert f"{manifest}:2: prompt_wav needs the speech-tokenizer frontend" in err
    assert f"{manifest}:3: not valid JSON" in err and f"{manifest}:4: duplicate id 'm1'" in err
    records = [json.loads(x) for x in res.stdout.splitlines()]
    assert [r["id"] for r in records] == ["text_00001", "lines_00001", "lines_00003", "m1"]
    for r in records:
        toks = _npy(out / f"{r['id']}.npy")
        assert r["tokens"] == len(toks) <= r["max_len"] and all(0 <= t < 6561 for t in toks)
        assert r["stats"]["target_forwards"] >= 1
    first = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    # resume: everything done is skipped (records read back from the sidecars), the bad lines are reported again
    res = _run(args)
    assert res.exit_code == 1 and [json.loads(x) for x in res.stdout.splitlines()] == records
    assert "4 skipped" in res.stderr and "redoing" not in res.stderr
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == first
    # --overwrite redoes them, with the same tokens (same seed)
    before = {p.name: _npy(p) for p in _outputs(out)}
    res = _run([*args, "--overwrite"])
    assert res.exit_code == 1 and len(res.stdout.splitlines()) == 4
    assert {p.name: _npy(p) for p in _outputs(out)} == before


def test_seeded_output_does_not_depend_on_order(tmp_path, cv3):
    a, b = tmp_path / "a", tmp_path / "b"
    for out, texts in ((a, ["one", "two"]), (b, ["two", "one"])):
        f = out / "in.jsonl"
        out.mkdir()
        f.write_text("\n".join(json.dumps({"id": t, "text": t}) for t in texts) + "\n")
        assert _run(["--model", str(cv3), str(f), "-o", str(out), "--seed", "5"]).exit_code == 0
    assert _npy(a / "one.npy") == _npy(b / "one.npy") and _npy(a / "two.npy") == _npy(b / "two.npy")
    c = tmp_path / "c"
    assert _run(["--model", str(cv3), "--text", "one", "-o", str(c), "--seed", "6"]).exit_code == 0


def test_pool_drafter_greedy_equals_ar(tmp_path, cv3):
    texts = ["--text", "hello", "--text", "hello", "--text", "the other"]
    outs = {}
    for draft in ("none", "pool"):
        out = tmp_path / draft
        res = _run(["--model", str(cv3), *texts, "--sampler", "greedy", "--draft", draft, "-o", str(out),
                    "--jsonl", "-"])
        assert res.exit_code == 0, res.stderr
        outs[draft] = ({p.name: _npy(p) for p in _outputs(out)}, [json.loads(x) for x in res.stdout.splitlines()])
    assert outs["none"][0] == outs["pool"][0]
    # the second "hello" is proposed by the pool: its tokens are accepted
    assert outs["pool"][1][1]["stats"]["accepted"] > 0 and outs["none"][1][1]["stats"]["accepted"] == 0


def test_usage_errors(tmp_path, cv2):
    res = _run(["--model", str(cv2), "--text", "hi", "--temperature", "0.7", "-o", str(tmp_path)])
    assert res.exit_code == 2 and "ras has no temperature" in res.stderr
    res = _run(["--model", str(tmp_path / "missing"), "--text", "hi"])
    assert res.exit_code == 3 and "neither a CosyVoice model name" in res.stderr
    res = _run(["--text", "hi", "--preset", "whisper-base-ar"])
    assert res.exit_code == 2 and "transcription preset" in res.stderr
    assert _run([]).exit_code == 2


def test_stdin_and_vllm(tmp_path, cv2):
    res = _run(["--model", str(cv2), "-", "--sampler", "vllm", "--repetition-penalty", "1.1", "--top-k", "15",
                "-o", str(tmp_path), "--jsonl", "-"], input="hi there\n")
    assert res.exit_code == 0, res.stderr
    rec = json.loads(res.stdout)
    assert rec["id"] == "stdin_00001" and rec["tokens"] == len(_npy(tmp_path / "stdin_00001.npy"))


def test_missing_named_model_says_where_to_put_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLI_MODELS_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HOME", str(tmp_path))
    res = _run(["--model", "cosyvoice2", "--text", "hi"])
    assert res.exit_code == 3 and "llm.pt" in res.stderr and "never downloads" in res.stderr
    assert str(tmp_path / "cosyvoice2") in res.stderr


def test_bench_synthesis_presets(tmp_path, cv3):
    presets = {}
    for name, extra in {"g-ar": "", "g-pool": 'strategy = "chain"\ndrafter = "pool"\n',
                        "r-pool": 'strategy = "chain"\ndrafter = "pool"\n'}.items():
        sampler = "ras" if name.startswith("r") else "greedy"
        presets[name] = tmp_path / f"{name}.toml"
        presets[name].write_text(f'family = "cosyvoice"\nmodel = "{cv3}"\nsampler = "{sampler}"\n{extra}')
    texts = tmp_path / "t.txt"
    texts.write_text("hello\nhello\n")
    out = tmp_path / "bench"
    res = CliRunner().invoke(main, ["bench", str(texts), "--presets", ",".join(str(p) for p in presets.values()),
                                    "--repeat", "2", "--no-warmup", "-q", "--out", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    report = json.loads((out / "report.json").read_text())
    by = {s["system"]: s for s in report["summaries"]}
    assert report["baseline"] == "g-ar" and by["g-ar"]["speedup_e2e"] == 1.0
    assert by["g-pool"]["exactness"] == {"kind": "greedy: identical tokens vs AR", "reference": "g-ar",
                                         "identical": 2, "compared": 2}
    assert by["r-pool"]["exactness"]["identical"] == 2  # same seed: identical across the two passes
    assert by["g-pool"]["acceptance_micro"] > 1.0 and by["g-pool"]["position_rates"]
    assert by["g-ar"]["tokens_per_second"] > 0 and "| g-pool | greedy |" in (out / "report.md").read_text()
    mixed = CliRunner().invoke(main, ["bench", str(texts), "--presets", f"{presets['g-ar']},whisper-base-ar"])
    assert mixed.exit_code == 2 and "mixes" in mixed.stderr


def test_bench_synthesis_audio_stages_on_the_shipped_voice(tmp_path):
    """--audio renders every utterance with specli-en's flow and vocoder: per-stage RTF, LLM and text-to-audio
    speedups; --model points every preset at the voice."""
    voice = Path(__file__).resolve().parent.parent / "specli" / "voices" / "specli-en"
    texts = tmp_path / "t.txt"
    texts.write_text("Hello there.\nGood night.\n")
    out = tmp_path / "bench"
    res = CliRunner().invoke(main, ["bench", str(texts), "--presets", "cosyvoice3-ar,cosyvoice3-pool", "--model",
                                    str(voice), "--audio", "--audio-dtype", "bfloat16", "--repeat", "1", "--no-warmup",
                                    "-q", "--out", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    report = json.loads((out / "report.json").read_text())
    by = {s["system"]: s for s in report["summaries"]}
    for s in by.values():
        assert s["audio_seconds"] > 0.5 and set(s["rtf"]) == {"llm", "flow", "vocoder", "total"}
        assert s["rtf"]["total"] == pytest.approx(sum(s["rtf"][k] for k in ("llm", "flow", "vocoder")))
        assert s["speedup_llm"] > 0 and s["speedup_e2e"] > 0
    assert by["cosyvoice3-ar"]["speedup_llm"] == 1.0
    for run in report["runs"]:
        assert run["wall_seconds"] == pytest.approx(sum(run["stages"].values()))
    assert report["audio_dtype"] == report["vocoder_dtype"] == ["bfloat16"]
    assert "LLM-stage speedup" in (out / "report.md").read_text() and "in bfloat16" in (out / "report.md").read_text()
    res = CliRunner().invoke(main, ["bench", str(texts), "--presets", "specli-en-ar", "--audio", "--threads", "1",
                                    "--repeat", "1", "--no-warmup", "-q", "--out", str(tmp_path / "default")],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    report = json.loads((tmp_path / "default" / "report.json").read_text())
    # no --audio-dtype: the stages compute as `synthesize` runs them (a float32 flow, HiFi-GAN's own default)
    want = str(vocoder_dtype("auto", "hifigan", "cpu")).removeprefix("torch.")
    assert (report["audio_dtype"], report["vocoder_dtype"]) == (["float32"], [want])
    refused = CliRunner().invoke(main, ["bench", str(texts), "--presets", "whisper-base-ar", "--audio"])
    assert refused.exit_code == 2 and "synthesis presets" in refused.stderr


def test_presets_listing_and_task_separation():
    from specli.errors import PresetError
    from specli.presets import available_presets, load_preset
    from specli.presets.synthesis import load_synthesis_preset

    res = CliRunner().invoke(main, ["presets"])
    assert res.exit_code == 0 and "cosyvoice3-pool\tcosyvoice3\tchain" in res.stdout
    assert "cosyvoice2-ar" not in available_presets() and "cosyvoice2-ar" in available_presets("synthesize")
    with pytest.raises(PresetError, match="synthesis preset"):
        load_preset("cosyvoice2-ar")
    p = load_synthesis_preset("cosyvoice3-pool")
    assert (p.model, p.draft.strategy, p.draft.drafter, p.sampler) == ("cosyvoice3", "chain", "pool", "ras")


def test_an_undecodable_byte_fails_its_line_only(tmp_path, cv2):
    """One bad byte on line 3 of 5: the other 4 lines are spoken, line 3 is reported by number, exit 1."""
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"\xef\xbb\xbfone two\nthree four\nfive \xff six\nseven\r\neight nine\n")
    out = tmp_path / "out"
    res = _run(["--model", str(cv2), str(lines), "-o", str(out), "--sampler", "greedy"])
    assert res.exit_code == 1
    assert [p.name for p in _outputs(out)] == [f"lines_0000{n}.npy" for n in (1, 2, 4, 5)]
    assert f"{lines}:3: not UTF-8 text: byte 0xff at column 6" in res.stderr
    assert "4 ok, 1 failed" in res.stderr and res.stderr.count("failed: ") == 1
    piped = _run(["--model", str(cv2), "-", "-o", str(tmp_path / "piped"), "--sampler", "greedy"],
                 input=lines.read_bytes())
    assert piped.exit_code == 1 and "<stdin>:3: not UTF-8 text" in piped.stderr
    assert len(_outputs(tmp_path / "piped")) == 4
