"""Split a py-spy raw profile (``py-spy record -f raw``) of ``whisper_decode_workload.py`` into decode phases.

Each sample is put in the first phase (in the order below) whose frame its stack holds; shares are of the
samples inside ``transcribe`` (model loading and imports excluded)::

    python benchmarks/decode_profile_phases.py prof.txt [PROJ_LINE]

``PROJ_LINE``: the line of ``WhisperTarget.score`` that projects onto the vocabulary in the profiled code
(default: found in the current ``target.py``).
"""

from __future__ import annotations

import sys
from collections import Counter

PROJ_LINE = "logits = self.proj_out("  # the score line that projects onto the vocabulary (found in target.py)


def _proj_line() -> int:
    from pathlib import Path
    src = (Path(__file__).resolve().parent.parent / "specli/models/whisper/target.py").read_text().splitlines()
    return next(i + 1 for i, line in enumerate(src) if PROJ_LINE in line and "last" in line)


def _has(frames: list[str], func: str, file: str) -> bool:
    # py-spy names a method by its qualified name ("WhisperTarget.score (path:line)")
    return any(f.split(" (")[0].split(".")[-1] == func and file in f for f in frames)


def phase_of(frames: list[str], proj: str) -> str:
    """The phase of one sample's stack (root first)."""
    if _has(frames, "window_features", "audio.py"):
        return "features (log-mel)"
    for func, file, name in (("encode", "whisper/target.py", "encoder"), ("_cross_kv", "target.py", "cross K/V"),
                             ("align_words", "", "word timing"), ("add_word_timestamps", "", "word timing")):
        if _has(frames, func, file):
            return name
    in_score = _has(frames, "score", "whisper/target.py")
    where = "prompt prefill" if _has(frames, "prefill", "core/job.py") else "step"
    if in_score:
        return f"{where}: vocab projection" if any(proj in f for f in frames) else f"{where}: decoder layers"
    for func, file, name in (("_force_timestamps", "rules.py", "rules: force-timestamp log_softmax"),
                             ("_timestamp_masks", "rules.py", "rules: timestamp masks"),
                             ("__call__", "whisper/rules.py", "rules: clone + suppress ids"),
                             ("filter_logits", "logits.py", "filter_logits rest"),
                             ("greedy_decode", "greedy.py", "greedy loop: argmax, log_softmax, readback, Python")):
        if _has(frames, func, file):
            return name
    return "other under transcribe (segments, fallback, windows, audio I/O)"


def main(path: str, proj_line: int | None = None) -> None:
    counts: Counter[str] = Counter()
    proj = f"whisper/target.py:{proj_line or _proj_line()})"
    for line in open(path):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        frames = stack.split(";")
        if not any(f.startswith("transcribe ") for f in frames):
            continue
        counts[phase_of(frames, proj)] += int(n)
    total = sum(counts.values())
    print(f"| phase | share of transcribe samples ({total}) |\n|---|---|")
    for name, n in counts.most_common():
        print(f"| {name} | {100 * n / total:.1f}% |")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)  # [line of the projection when profiled]
