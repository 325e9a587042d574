"""Where the test suite's time goes: a pytest run's per-test seconds into one section of ``docs/testing.md``.

Reads a ``--junitxml`` report (every test, with its outcome) or the text of ``--durations=0`` (setup, call and
teardown lines; summed per test) and writes, between ``<!-- durations:LABEL -->`` and ``<!-- /durations:LABEL -->``
in the output file (created, or the section appended, when missing):

- the run's totals (tests, seconds summed over tests, and the wall time when given);
- the slowest 40 tests with their seconds;
- seconds and tests per file;
- tests and seconds per guarantee class, by file name (``CLASSES`` below: the first pattern that matches).

    python -m pytest -q -p no:warnings --junitxml=/tmp/junit.xml --durations=0 | tee /tmp/durations.txt
    python scripts/test_durations.py /tmp/junit.xml --label after --wall 1130 --note "2-vCPU EPYC, -n 2"
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

#: Guarantee classes by test file name (fnmatch patterns, first match wins; "other" when none does).
CLASSES: list[tuple[str, str]] = [
    ("test_*_cli.py", "CLI/robustness"),  # before the families' parity files below
    ("test_bench_*.py", "bench"), ("test_audio_llm_bench.py", "bench"),
    ("test_distill_*.py", "training"), ("test_speech_distill.py", "training"),
    ("test_audio_llm_distill.py", "training"),
    ("test_voice_lm_training.py", "training"), ("test_eagle.py", "training"), ("test_specforge_format.py", "training"),
    ("test_synthesis_exactness.py", "statistical"), ("test_speech_drafters.py", "statistical"),
    ("test_sampling.py", "statistical"), ("test_synthesis_sampling.py", "statistical"),
    ("test_fallback.py", "statistical"), ("test_audio_llm_drafters.py", "statistical"),
    ("test_*exact.py", "exactness/losslessness"), ("test_exact_*.py", "exactness/losslessness"),
    ("test_real_speculative.py", "exactness/losslessness"),
    ("test_int8_*.py", "exactness/losslessness"), ("test_speculative.py", "exactness/losslessness"),
    ("test_batched*.py", "exactness/losslessness"), ("test_beam.py", "exactness/losslessness"),
    ("test_dynamic_tree.py", "exactness/losslessness"), ("test_verify_*.py", "exactness/losslessness"),
    ("test_stop_drafting.py", "exactness/losslessness"), ("test_flow_batch.py", "exactness/losslessness"),
    ("test_synthesis_batch.py", "exactness/losslessness"), ("test_voice_speculative.py", "exactness/losslessness"),
    ("test_audio_dtype.py", "exactness/losslessness"), ("test_fast_path.py", "exactness/losslessness"),
    ("test_goodput*.py", "exactness/losslessness"), ("test_draft_vocab_filter.py", "exactness/losslessness"),
    ("test_real_whisper.py", "reference parity"), ("test_whisper_target.py", "reference parity"),
    ("test_qwen*.py", "reference parity"), ("test_audio_llm_contract.py", "reference parity"),
    ("test_hifigan.py", "reference parity"),
    ("test_hift*.py", "reference parity"),
    ("test_flow*.py", "reference parity"), ("test_cosyvoice.py", "reference parity"),
    ("test_acoustic_frontend.py", "reference parity"), ("test_rules.py", "reference parity"),
    ("test_word_timestamps.py", "reference parity"), ("test_audio.py", "reference parity"),
    ("test_cli*.py", "CLI/robustness"), ("test_bad_input.py", "CLI/robustness"),
    ("test_batch_pipeline.py", "CLI/robustness"), ("test_interrupts.py", "CLI/robustness"),
    ("test_synthesi*.py", "CLI/robustness"), ("test_device.py", "CLI/robustness"),
    ("test_decoding_options.py", "CLI/robustness"), ("test_sharding.py", "CLI/robustness"),
    ("test_writers.py", "CLI/robustness"), ("test_vad.py", "CLI/robustness"), ("test_longform.py", "CLI/robustness"),
    ("test_music.py", "CLI/robustness"), ("test_segments.py", "CLI/robustness"),
    ("test_voice_roundtrip.py", "CLI/robustness"),
    ("test_resolve.py", "loaders"), ("test_voice_files.py", "loaders"), ("test_voice_layout.py", "loaders"),
    ("test_voice_tokenizer.py", "loaders"), ("test_speculators_format.py", "loaders"), ("test_ct2.py", "loaders"),
    ("test_dependencies.py", "loaders"),
]
ORDER = ["exactness/losslessness", "statistical", "reference parity", "CLI/robustness", "loaders", "training",
         "bench", "other"]
SLOWEST = 40
_DURATION = re.compile(r"^\s*([0-9.]+)s\s+(setup|call|teardown)\s+(\S+)")


@dataclass(frozen=True)
class Test:
    """One test of the run."""

    file: str  # tests/<file>.py
    nodeid: str  # file::name[params]
    seconds: float  # setup + call + teardown
    outcome: str  # passed, failed, error, skipped ("passed" for --durations text, which has no outcomes)


def guarantee_class(file: str) -> str:
    name = Path(file).name
    return next((cls for pattern, cls in CLASSES if fnmatch.fnmatch(name, pattern)), "other")


def read_junit(path: Path) -> list[Test]:
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        # pytest's classname is dotted: tests.test_x or tests.test_x.TestClass
        mods = [i for i, part in enumerate(module) if part.startswith("test_")]
        file = "/".join(module[:mods[0] + 1]) + ".py" if mods else case.get("file", "?")
        inner = "::".join(module[mods[0] + 1:] + [case.get("name", "?")]) if mods else case.get("name", "?")
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
        tests.append(Test(file, f"{file}::{inner}", float(case.get("time", 0.0)), outcome))
    return tests


def read_durations(path: Path) -> list[Test]:
    seconds: dict[str, float] = defaultdict(float)
    for line in path.read_text().splitlines():
        if m := _DURATION.match(line):
            seconds[m.group(3)] += float(m.group(1))
    return [Test(node.split("::")[0], node, s, "passed") for node, s in seconds.items()]


def section(tests: list[Test], label: str, wall: float | None, note: str) -> str:
    ran = [t for t in tests if t.outcome != "skipped"]
    total = sum(t.seconds for t in tests)
    outcomes = defaultdict(int)
    for t in tests:
        outcomes[t.outcome] += 1
    lines = [f"## {label}", ""]
    if note:
        lines += [note, ""]
    counts = ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))
    lines += [f"{len(tests)} tests ({counts}); {total:,.0f} s summed over tests"
              + (f"; {wall:,.0f} s wall" if wall else "") + ".", ""]
    lines += [f"### Slowest {SLOWEST}", "", "| s | test |", "|---:|---|"]
    lines += [f"| {t.seconds:.2f} | `{t.nodeid}` |" for t in sorted(ran, key=lambda t: -t.seconds)[:SLOWEST]]
    by_file: dict[str, list[Test]] = defaultdict(list)
    for t in tests:
        by_file[t.file].append(t)
    lines += ["", "### Per file", "", "| s | tests | file | class |", "|---:|---:|---|---|"]
    for file, ts in sorted(by_file.items(), key=lambda kv: -sum(t.seconds for t in kv[1])):
        lines.append(f"| {sum(t.seconds for t in ts):.1f} | {len(ts)} | {file} | {guarantee_class(file)} |")
    by_class: dict[str, list[Test]] = defaultdict(list)
    for t in tests:
        by_class[guarantee_class(t.file)].append(t)
    lines += ["", "### Per guarantee class", "", "| class | tests | skipped | files | s |", "|---|---:|---:|---:|---:|"]
    for cls in ORDER:
        ts = by_class.get(cls, [])
        lines.append(f"| {cls} | {len(ts)} | {sum(t.outcome == 'skipped' for t in ts)} | "
                     f"{len({t.file for t in ts})} | {sum(t.seconds for t in ts):.1f} |")
    return "\n".join(lines) + "\n"


def write_section(out: Path, label: str, body: str) -> None:
    """Replace the LABEL section of ``out`` (or append it) with ``body``."""
    start, end = f"<!-- durations:{label} -->", f"<!-- /durations:{label} -->"
    block = f"{start}\n{body}{end}\n"
    text = out.read_text() if out.exists() else "# The test suite: where its time goes\n\n"
    if start in text and end in text:
        text = text[:text.index(start)] + block + text[text.index(end) + len(end) + 1:]
    else:
        text = text.rstrip("\n") + "\n\n" + block
    out.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path, help="a pytest --junitxml file, or the saved text of --durations=0")
    ap.add_argument("--label", default="after", help="the section of the output to (re)write")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "testing.md")
    ap.add_argument("--wall", type=float, help="the run's wall seconds, as pytest printed them")
    ap.add_argument("--note", default="", help="a line under the heading: machine, command, threads")
    args = ap.parse_args()
    is_xml = args.report.read_text(errors="replace").lstrip().startswith("<")
    tests = read_junit(args.report) if is_xml else read_durations(args.report)
    write_section(args.out, args.label, section(tests, args.label, args.wall, args.note))


if __name__ == "__main__":
    main()
