"""Report arithmetic of ``specli bench`` on synthetic runs: no models, no timing."""

from __future__ import annotations

import json

import pytest

from specli.bench.references import load_references, manifest_references
from specli.bench.render import markdown, write_report
from specli.bench.report import Bins, Run, SystemInfo, acceptance_stats, aggregate, build_report
from specli.bench.wer import cer, edit_distance, error_counts, normalize, wer

AR = SystemInfo("base-ar", "preset", "base", "ar")
SPEC = SystemInfo("base-spec", "preset", "base", "chain")
TINY_AR = SystemInfo("tiny-ar", "preset", "tiny", "ar")
TINY_SPEC = SystemInfo("tiny-spec", "preset", "tiny", "chain")
PEER = SystemInfo("hf", "peer", "base")


def run(system, file, repeat=0, audio=2.0, wall=1.0, decode=0.5, tokens=10, steps=0, forwards=None,
        ids=(1, 2, 3), text="hello world", attempts=(), accepts=()):
    return Run(system, file, repeat, audio, wall, encode_seconds=0.2, decode_seconds=decode, tokens=tokens,
               target_forwards=forwards if forwards is not None else tokens, verify_steps=steps,
               position_attempts=tuple(attempts), position_accepts=tuple(accepts),
               token_ids=None if ids is None else tuple(ids), text=text)


def summary(report, name):
    return next(s for s in report["summaries"] if s["system"] == name)


def test_medians_over_repeats_and_stability():
    runs = [run("base-ar", "a", r, wall=w, decode=d) for r, (w, d) in enumerate([(3.0, 1.0), (1.0, 9.0), (2.0, 2.0)])]
    runs.append(run("base-spec", "a", 0, text="x"))
    runs.append(run("base-spec", "a", 1, text="y"))
    utts = aggregate(runs)
    u = utts[("base-ar", "a")]
    assert u.run.wall_seconds == 2.0 and u.run.decode_seconds == 2.0
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
    assert normalize("  Hello,   World!  It's  \"fine\"... ") == "hello world it's fine"
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance([], ["a"]) == 1
    assert wer("the cat sat on the mat", "The cat sat on a mat.") == pytest.approx(1 / 6)
    assert wer("a b c", "a c") == pytest.approx(1 / 3)
    assert wer("a b", "a b x y") == pytest.approx(2 / 2)
    assert cer("abcd", "abed") == pytest.approx(1 / 4)
    total = error_counts("a b", "a c") + error_counts("c d e", "c d e")
    assert (total.word_edits, total.words, total.wer) == (1, 5, pytest.approx(1 / 5))


def test_corpus_wer_in_report():
    runs = [run("base-ar", "a", text="one two three four"), run("base-ar", "b", text="x")]
    rep = build_report([AR], "base-ar", runs, references={"a": "one two three five", "c": "unused"})
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
    rep["machine"] = {"cpu": "test cpu", "cpu_count": 2, "threads": 2, "platform": "x", "versions": {"torch": "1"},
                      "loadavg_before": [1.0, 1.0, 1.0], "loadavg_after": None}
    rep["run"] = {"command": "specli bench a", "date": "d", "elapsed_seconds": 1.0, "inputs": ["a"],
                  "input_errors": [], "references": "sidecar", "references_found": 1,
                  "options": {"repeat": 1, "warmup": False, "timestamps": False}}
    md = markdown(rep)
    assert "| base-spec | `base-ar` | tokens | 1/1 | - |" in md
    assert "| base-spec | 0.60 (5) | 0.33 (3) |" in md
    assert "2.00x" in md
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


def test_bench_library_imports_no_cli_packages():
    import subprocess
    import sys

    code = ("import sys, specli.bench.runner, specli.bench.render; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('click', 'rich')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
