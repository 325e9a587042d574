"""Report arithmetic of ``specli bench`` on synthetic runs: no models, no timing."""

from __future__ import annotations

import json

import pytest

from specli.bench.references import load_references, manifest_references
from specli.bench.render import markdown, write_report
from specli.bench.report import Bins, Run, Skip, SystemInfo, acceptance_stats, aggregate, build_report
from specli.bench.runlog import RunLog, read_runlog
from specli.bench.wer import cer, error_counts, normalize, wer
from specli.core.types import DecodeStats

AR = SystemInfo("base-ar", "preset", "base", "ar")
SPEC = SystemInfo("base-spec", "preset", "base", "chain")
TINY_AR = SystemInfo("tiny-ar", "preset", "tiny", "ar")
TINY_SPEC = SystemInfo("tiny-spec", "preset", "tiny", "chain")
PEER = SystemInfo("hf", "peer", "base")


def run(system, file, repeat=0, audio=2.0, wall=1.0, decode=0.5, tokens=10, steps=0, forwards=None,
        ids=(1, 2, 3), text="hello world", attempts=(), accepts=()):
    if ids is None:  # a peer: no decode counters
        return Run(system, file, repeat, audio, wall, text=text)
    stats = DecodeStats(tokens=tokens, target_forwards=forwards if forwards is not None else tokens,
                        decode_seconds=decode, verify_steps=steps, position_attempts=list(attempts),
                        position_accepts=list(accepts))
    return Run(system, file, repeat, audio, wall, encode_seconds=0.2, decode=stats, token_ids=tuple(ids), text=text)


def summary(report, name):
    return next(s for s in report["summaries"] if s["system"] == name)


def test_medians_over_repeats_and_stability():
    runs = [run("base-ar", "a", r, wall=w, decode=d) for r, (w, d) in enumerate([(3.0, 1.0), (1.0, 9.0), (2.0, 2.0)])]
    runs.append(run("base-spec", "a", 0, text="x"))
    runs.append(run("base-spec", "a", 1, text="y"))
    utts = aggregate(runs)
    u = utts[("base-ar", "a")]
    assert u.run.wall_seconds == 2.0 and u.run.decode.decode_seconds == 2.0
    assert u.walls == (3.0, 1.0, 2.0) and u.stable
    assert not utts[("base-spec", "a")].stable
    even = aggregate([run("s", "f", 0, wall=4.0), run("s", "f", 1, wall=1.0)])[("s", "f")]
    assert even.run.wall_seconds == 1.0 and even.run.repeat == 1  # lower median


def test_speedups_are_ratios_of_summed_medians():
    runs = [
        run("base-ar", "a", wall=4.0, decode=3.0), run("base-ar", "b", wall=2.0, decode=1.0),
        run("base-spec", "a", wall=2.0, decode=1.0, steps=5), run("base-spec", "b", wall=2.0, decode=1.0, steps=5),
        run("hf", "a", wall=3.0, ids=None), run("hf", "b", wall=3.0, ids=None),
    ]
    rep = build_report([AR, SPEC, PEER], "base-ar", runs)
    spec, peer, base = summary(rep, "base-spec"), summary(rep, "hf"), summary(rep, "base-ar")
    assert spec["speedup_e2e"] == pytest.approx(6.0 / 4.0)
    assert spec["speedup_decode"] == pytest.approx(4.0 / 2.0)
    assert spec["speedup_e2e_median_utt"] == pytest.approx((2.0 + 1.0) / 2)
    assert peer["speedup_e2e"] == pytest.approx(1.0) and peer["speedup_decode"] is None
    assert base["speedup_e2e"] == pytest.approx(1.0)
    assert spec["rtf"] == pytest.approx(4.0 / 4.0)
    assert spec["other_seconds"] == pytest.approx(4.0 - 0.4 - 2.0)


def test_micro_and_macro_acceptance_differ():
    runs = [run("s", "a", tokens=4, steps=4, attempts=[4], accepts=[0]),
            run("s", "b", tokens=30, steps=10, attempts=[10, 8, 6], accepts=[8, 6, 2])]
    utts = list(aggregate(runs).values())
    acc = acceptance_stats(utts)
    assert acc["acceptance_micro"] == pytest.approx(34 / 14)
    assert acc["acceptance_macro"] == pytest.approx((1.0 + 3.0) / 2)
    assert acc["position_attempts"] == [14, 8, 6] and acc["position_accepts"] == [8, 6, 2]
    assert acc["position_rates"] == pytest.approx([8 / 14, 6 / 8, 2 / 6])
    assert acc["position0_rate"] == pytest.approx(8 / 14)


def test_plain_greedy_has_acceptance_one():
    (u,) = aggregate([run("ar", "a", tokens=7, steps=0, forwards=7)]).values()
    assert u.acceptance == 1.0


def test_length_bins():
    bins = Bins((3.0, 6.0))
    assert bins.labels() == ["<3 s", "3-6 s", ">=6 s"]
    assert [bins.index(s) for s in (0.5, 2.99, 3.0, 5.9, 6.0, 60.0)] == [0, 0, 1, 1, 2, 2]
    runs = [run("base-ar", "short", audio=2.0, wall=2.0), run("base-ar", "long", audio=8.0, wall=8.0),
            run("base-spec", "short", audio=2.0, wall=1.0, steps=5), run("base-spec", "long", audio=8.0, wall=2.0,
                                                                       steps=5)]
    rep = build_report([AR, SPEC], "base-ar", runs, bins=bins)
    rows = {(r["bin"], r["system"]): r for r in rep["length_bins"]}
    assert set(rows) == {("<3 s", "base-ar"), ("<3 s", "base-spec"), (">=6 s", "base-ar"), (">=6 s", "base-spec")}
    assert rows[("<3 s", "base-spec")]["speedup_e2e"] == pytest.approx(2.0)
    assert rows[(">=6 s", "base-spec")]["speedup_e2e"] == pytest.approx(4.0)
    assert rows[(">=6 s", "base-spec")]["acceptance_micro"] == pytest.approx(10 / 5)


def test_losslessness_counts_tokens_text_and_own_model_reference():
    runs = [
        run("base-ar", "a", ids=(1, 2)), run("base-ar", "b", ids=(3, 4), text="Good day."),
        run("base-spec", "a", ids=(1, 2), steps=3), run("base-spec", "b", ids=(3, 5), text="Good day.", steps=3),
        run("hf", "a", ids=None, text="HELLO, world!"), run("hf", "b", ids=None, text="good night"),
        run("tiny-ar", "a", ids=(7,)), run("tiny-spec", "a", ids=(7,), steps=1),
    ]
    rep = build_report([AR, SPEC, PEER, TINY_AR, TINY_SPEC], "base-ar", runs)
    assert summary(rep, "base-ar")["lossless"]["reference"] is None
    spec = summary(rep, "base-spec")["lossless"]
    assert (spec["identical"], spec["compared"], spec["differing"]) == (1, 2, ("b",))  # same text, other tokens
    peer = summary(rep, "hf")["lossless"]
    assert (peer["identical"], peer["compared"], peer["differing"]) == (1, 2, ("b",))
    tiny = summary(rep, "tiny-spec")["lossless"]
    assert (tiny["reference"], tiny["identical"], tiny["compared"]) == ("tiny-ar", 1, 1)
    assert summary(rep, "tiny-ar")["lossless"]["reference"] is None


def test_normalizer_and_error_rates():
    # Whisper's English normaliser: contractions, titles, British spellings, numbers, fillers
    assert normalize("  Hello,   World!  It's  \"fine\".  ") == "hello world it is fine"
    spoken = "Mr. Smith paid twenty-five dollars for the colour TV, um."
    assert normalize(spoken) == "mister smith paid $25 for the color tv"
    assert wer("and mister john dashwood", "And Mr. John Dashwood.") == 0.0
    # other languages: Whisper's basic normaliser (lower case, no punctuation, accents kept)
    assert normalize("¿Hola, Señor? Ça va!", "es") == "hola señor ça va"
    assert wer("Merci d'avoir essayé.", "merci d avoir essayé", "fr") == 0.0
    assert wer("the cat sat on the mat", "The cat sat on a mat.") == pytest.approx(1 / 6)
    assert wer("a b c", "a c") == pytest.approx(1 / 3)
    assert wer("a b", "a b x y") == pytest.approx(2 / 2)
    assert cer("abcd", "abed") == pytest.approx(1 / 4)
    total = error_counts("a b", "a c") + error_counts("c d e", "c d e")
    assert (total.word_edits, total.words, total.wer) == (1, 5, pytest.approx(1 / 5))


def test_corpus_wer_in_report():
    runs = [run("base-ar", "a", text="the red fox jumps"), run("base-ar", "b", text="x")]
    rep = build_report([AR], "base-ar", runs, references={"a": "the red fox sleeps", "c": "unused"})
    err = summary(rep, "base-ar")["errors"]
    assert err["utterances"] == 1 and err["wer"] == pytest.approx(0.25)
    assert build_report([AR], "base-ar", runs)["summaries"][0]["errors"] is None


def test_references_sidecar_and_manifest(tmp_path):
    (tmp_path / "a.wav").write_bytes(b"")
    (tmp_path / "a.txt").write_text("Hello\n  there\n")
    (tmp_path / "b.wav").write_bytes(b"")
    files = [str(tmp_path / "a.wav"), str(tmp_path / "b.wav")]
    assert load_references("sidecar", files) == {files[0]: "Hello there"}
    plain = tmp_path / "refs.tsv"
    plain.write_text("b.wav\tbee text\n")
    assert manifest_references(plain, files) == {files[1]: "bee text"}
    headed = tmp_path / "manifest.tsv"
    headed.write_text("path\tlanguage\treference_text\na.wav\ten\tay text\n")
    assert load_references(str(headed), files) == {files[0]: "ay text"}


def test_render_markdown_and_files(tmp_path):
    runs = [run("base-ar", "a"), run("base-spec", "a", steps=5, attempts=[5, 3], accepts=[3, 1], wall=0.5)]
    rep = build_report([AR, SPEC], "base-ar", runs, references={"a": "hello world"})
    rep["machine"] = {"cpu": "test cpu", "cpu_id": "family 26 model 2", "cpu_features": ["avx2", "avx512_bf16"],
                      "cpu_count": 2, "threads": 2, "platform": "x", "versions": {"torch": "1"},
                      "loadavg_before": [1.0, 1.0, 1.0], "loadavg_after": None}
    rep["run"] = {"command": "specli bench a", "date": "d", "elapsed_seconds": 1.0, "inputs": ["a"],
                  "input_errors": [], "references": "sidecar", "references_found": 1,
                  "options": {"repeat": 1, "warmup": False, "timestamps": False}}
    md = markdown(rep)
    assert "| base-spec | `base-ar` | tokens | 1/1 | - |" in md
    assert "| base-spec | 0.60 (5) | 0.33 (3) |" in md
    assert "2.00x" in md
    assert "- machine: test cpu (family 26 model 2; avx2, avx512_bf16) (2 cores), 2 threads; x" in md
    written = write_report(rep, tmp_path / "out", plots=False)
    assert [p.name for p in written] == ["report.json", "report.md"]
    assert json.loads(written[0].read_text())["baseline"] == "base-ar"


def test_pairwise_speedups():
    runs = [run("base-ar", "a", wall=4.0), run("base-ar", "b", wall=4.0),
            run("base-spec", "a", wall=2.0, steps=1), run("hf", "a", wall=8.0, ids=None), run("hf", "b", wall=8.0,
                                                                                              ids=None)]
    pw = build_report([AR, SPEC, PEER], "base-ar", runs)["pairwise_speedup"]
    assert pw["base-spec"]["base-ar"] == pytest.approx(2.0)  # only file a is common
    assert pw["base-ar"]["hf"] == pytest.approx(2.0) and pw["hf"]["base-ar"] == pytest.approx(0.5)
    assert pw["hf"]["hf"] == pytest.approx(1.0)


def test_skips_are_counted_listed_and_rendered():
    runs = [run("base-ar", "a"), run("base-ar", "long", audio=40.0), run("hf", "a", ids=None)]
    skips = [Skip("hf", "long", -1, 40.0, "warm-up only"),  # warm-up skips are warned, not reported
             Skip("hf", "long", 0, 40.0, "transformers cannot"), Skip("hf", "long", 1, 40.0, "transformers cannot")]
    rep = build_report([AR, PEER], "base-ar", runs, skips=skips)
    assert rep["skipped"] == [{"system": "hf", "file": "long", "audio_seconds": 40.0, "reason": "transformers cannot",
                               "repeats": [0, 1]}]
    assert (summary(rep, "hf")["utterances"], summary(rep, "hf")["skipped"]) == (1, 1)
    assert summary(rep, "base-ar")["skipped"] == 0
    rep["machine"] = {"cpu": "c", "cpu_count": 2, "threads": 2, "platform": "x", "versions": {},
                      "loadavg_before": None, "loadavg_after": None}
    rep["run"] = {"command": "c", "date": "d", "elapsed_seconds": None, "inputs": ["a", "long"], "input_errors": [],
                  "references": None, "references_found": 0, "options": {"repeat": 2, "warmup": True}}
    md = markdown(rep)
    assert "## Skipped runs" in md and "| hf | long | 40.0 | 1, 2 | transformers cannot |" in md
    assert "| hf | peer | - | 1 | 1 |" in md and "| base-ar | preset | - | 2 | 0 |" in md
    assert "elapsed - s" in md and "on clips over 30 s only" in md
    assert "## Skipped runs" not in markdown({**rep, "skipped": []})


def test_unknown_baseline_is_a_clear_error():
    with pytest.raises(ValueError, match="baseline 'my.toml' is not one of the systems"):
        build_report([AR], "my.toml", [run("base-ar", "a")])


def test_run_records_round_trip_through_runs_jsonl(tmp_path):
    path = tmp_path / "out" / "runs.jsonl"
    log = RunLog(path, {"systems": [AR.__dict__, PEER.__dict__], "baseline": "base-ar", "options": {"repeat": 1}})
    assert [json.loads(line)["kind"] for line in path.read_text().splitlines()] == ["header"]
    records = [run("base-ar", "a", tokens=7, steps=3, attempts=[3, 2], accepts=[2, 1], text="héllo"),
               run("hf", "a", ids=None, text="hello"), Skip("hf", "b", 0, 31.5, "why")]
    for i, record in enumerate(records, 1):
        log.add(record)
        assert len(path.read_text().splitlines()) == 1 + i  # on disk, whole, after every record
    assert not list(path.parent.glob(".*.part"))  # written through a temporary file and a rename
    data = read_runlog(path)
    assert data.runs == records[:2] and data.skips == records[2:]
    assert data.runs[0].decode.position_accepts == [2, 1] and data.runs[0].token_ids == (1, 2, 3)
    assert data.runs[1].decode is None and data.baseline == "base-ar" and data.systems == [AR, PEER]
    path.write_text(path.read_text() + '{"kind": "run", "system": \n')
    with pytest.raises(ValueError, match=r"runs.jsonl:5: not a specli bench record"):
        read_runlog(path)


def test_missing_scoring_packages_are_named(monkeypatch):
    import importlib.util

    from specli.bench import wer as wer_mod

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jiwer" else real(name, *a))
    assert wer_mod.missing_packages() == ["jiwer"]
    with pytest.raises(wer_mod.WerPackagesMissing, match=r"WER scoring needs jiwer: pip install 'specli\[bench\]'"):
        wer_mod.require()


def test_cli_rebuilds_a_report_from_runs(tmp_path):
    """`specli bench --from-runs`: no model, no measurement; a bad file is a one-line error."""
    from click.testing import CliRunner

    from specli.cli import main

    runs = tmp_path / "runs.jsonl"
    header = {"systems": [AR.__dict__, SPEC.__dict__, PEER.__dict__], "baseline": "base-ar", "command": "specli bench x",
              "date": "2026-01-01T00:00:00+00:00", "options": {"repeat": 1, "warmup": False, "timestamps": None},
              "bins": [3.0], "inputs": ["a.wav"], "input_errors": [], "references": None,
              "machine": {"cpu": "c", "cpu_count": 2, "threads": 2, "platform": "p", "versions": {},
                          "loadavg_before": None}}
    log = RunLog(runs, header)
    for record in (run("base-ar", "a.wav", wall=2.0), run("base-spec", "a.wav", wall=1.0, steps=4),
                   run("hf", "a.wav", ids=None, text="Hello, world."), Skip("hf", "b.wav", 0, 31.0, "cannot")):
        log.add(record)
    out = tmp_path / "report"
    cmd = ["bench", "--from-runs", str(runs), "--out", str(out), "--no-plots"]
    done = CliRunner().invoke(main, cmd, catch_exceptions=False)
    assert done.exit_code == 0, done.stderr
    assert "warning: 1 system/file pair(s) skipped on 1 file(s)" in done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["bins"]["edges"] == [3.0]  # the measurement's bins
    assert summary(report, "base-spec")["speedup_e2e"] == pytest.approx(2.0)
    assert summary(report, "hf")["lossless"]["identical"] == 1  # "Hello, world." == "hello world" normalised
    runs.write_text("not json\n")
    done = CliRunner().invoke(main, cmd, catch_exceptions=False)
    assert done.exit_code == 2 and "runs.jsonl:1: not a specli bench record" in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_paired_wer_diff_is_the_difference_with_a_paired_interval() -> None:
    from specli.bench.wer import ErrorCounts, paired_wer_diff

    a = [ErrorCounts(1, 10, 0, 0), ErrorCounts(0, 5, 0, 0), ErrorCounts(2, 5, 0, 0)] * 10  # 30 utterances, WER 0.15
    same = paired_wer_diff(a, a)
    assert same["wer_diff"] == 0 and same["ci95"] == [0, 0] and same["better"] == same["worse"] == 0
    worse = [ErrorCounts(c.word_edits + 1, c.words, 0, 0) for c in a]  # one more edit everywhere: +30 / 200 words
    res = paired_wer_diff(a, worse)
    assert res["wer_diff"] == pytest.approx(30 / 200, abs=1e-4) and res["worse"] == 30 and res["better"] == 0
    assert 0 < res["ci95"][0] <= res["wer_diff"] <= res["ci95"][1]  # every draw is worse: the interval excludes 0
    mixed = [ErrorCounts(c.word_edits + (1 if i % 2 else -c.word_edits), c.words, 0, 0) for i, c in enumerate(a)]
    res = paired_wer_diff(a, mixed)
    edits = sum(m.word_edits - c.word_edits for m, c in zip(mixed, a, strict=True))
    assert res["wer_diff"] == pytest.approx(edits / 200, abs=1e-4)
    assert res["ci95"][0] < res["wer_diff"] < res["ci95"][1] and res["better"] > 0 and res["worse"] > 0
    with pytest.raises(ValueError, match="equal"):
        paired_wer_diff(a, a[:-1])


def test_the_machine_names_its_cpu_family_and_the_features_that_change_its_figures():
    from specli.bench.runner import cpu_description

    zen5 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n"
            "flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n\nprocessor\t: 1\nmodel name\t: other\n")
    assert cpu_description(zen5, "x86_64") == {"cpu": "AMD EPYC", "cpu_id": "family 26 model 2",
                                              "cpu_features": ["avx2", "avx512f", "avx512_bf16", "avx512_vnni"]}
    arm = "processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\n"
    assert cpu_description(arm, "aarch64") == {"cpu": "aarch64", "cpu_id": None, "cpu_features": []}
    assert cpu_description("", "x86_64") == {"cpu": "x86_64", "cpu_id": None, "cpu_features": []}
