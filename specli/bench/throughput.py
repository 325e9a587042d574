"""``specli bench --batch-sizes``: throughput of whole-archive transcription at several batch sizes.

Each system transcribes the whole clip set in one call per pass, as a user transcribes an archive:
presets through :func:`specli.asr.pipeline.transcribe` (reading the files, ``batch_size`` windows decoded
together), peers through ``transcribe_many`` in their worker processes (files read there with the same
loader inside the timed region, timed in the worker; a peer that cannot, fails or whose worker is gone is
recorded as skipped for that pass and batch size).
Throughput = total audio seconds / wall seconds of that call. A preset and ``faster-whisper-batched``
run at every batch size (a preset whose decoding cannot run batched only at 1; the report says why);
a sequential peer (``hf``, ``faster-whisper``) once per pass, at batch size 1; the baseline always at
batch size 1 too (the "vs AR" reference). Order per pass: batch sizes ascending, every system in turn at
each, so load drift hits all alike. The warm-up pass runs every (system, batch size) once on the first
``max(batch sizes)`` clips (new batch shapes build new oneDNN primitives). Timestamp tokens are one
setting for the whole set: as asked, else on when any clip is over 30 s (long-form seeks by them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from specli.asr.pipeline import batch_size_for, transcribe
from specli.bench.peer_worker import call_timeout
from specli.bench.peers import BenchError
from specli.bench.render import fmt, machine_lines, table, times
from specli.bench.runner import (BenchOptions, Clip, PeerSystem, PresetSystem, build_systems, close_systems,
                                 load_clips, machine_info, peer_processes, read_loadavg, require_scoring)
from specli.bench.references import load_references
from specli.bench.wer import error_counts, normalize
from specli.asr.strategies import Engine
from specli.core.threads import torch_threads
from specli.io.atomic import write_atomic

Progress = Callable[[str], None]
System = PresetSystem | PeerSystem


@dataclass(frozen=True)
class ArchiveRun:
    """One system transcribing the whole clip set once at one batch size."""

    system: str  # SystemInfo.name
    batch_size: int  # windows decoded together (1: sequential)
    repeat: int  # 0-based measured pass
    audio_seconds: float  # total audio of the clip set
    wall_seconds: float  # the whole call, file reading included
    files: tuple[str, ...]  # clip paths, in order
    texts: tuple[str, ...]  # transcript per file
    languages: tuple[str | None, ...]  # language per file (decoded with)

    @property
    def throughput(self) -> float:
        """Audio seconds transcribed per wall second."""
        return self.audio_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``: positive integers, strictly ascending; ValueError otherwise."""
    try:
        sizes = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError("comma-separated positive integers, e.g. 1,2,4,8,16") from None
    if not sizes or min(sizes) < 1 or list(sizes) != sorted(set(sizes)):
        raise ValueError("batch sizes must be positive integers in strictly ascending order, e.g. 1,2,4,8,16")
    return sizes


def preset_archive(system: PresetSystem, clips: Sequence[Clip], timestamps: bool,
                   batch_size: int) -> tuple[list[str], list[str | None]]:
    """Texts and languages of ``clips`` transcribed by the preset through the library entry point."""
    system.new_pass()  # pool drafters start empty at every archive run
    engine = Engine(system.preset, system.model, system.decode)
    topts = replace(system.topts, timestamps=timestamps)
    texts, languages = [], []
    for out in transcribe([c.path for c in clips], engine.preset, topts, engine=engine, batch_size=batch_size):
        if out.result is None:
            raise BenchError(f"{system.info.name} failed on {out.path}: {out.error}")
        texts.append(out.result.text)
        languages.append(out.result.language)
    if len(texts) != len(clips):
        raise BenchError(f"{system.info.name}: {len(texts)} results for {len(clips)} files")
    return texts, languages


@dataclass(frozen=True)
class ArchiveSkip:
    """One system that could not transcribe the clip set once at one batch size (a peer), with the reason."""

    system: str  # SystemInfo.name
    batch_size: int  # windows decoded together
    repeat: int  # 0-based measured pass (-1: warm-up)
    reason: str  # why (PeerCannot's message, the library's error, or the worker that died or hung)


def peer_archive(system: PeerSystem, clips: Sequence[Clip], timestamps: bool, batch_size: int,
                 languages: Sequence[str | None]) -> tuple[list[str], float] | str:
    """Texts of ``clips`` from a peer and the wall seconds its worker measured (the files read inside the
    timed call, as the presets read them); or why it could not."""
    got = system.worker.transcribe_files([c.path for c in clips], languages, timestamps, batch_size,
                                         call_timeout(sum(c.seconds for c in clips), system.timeout))
    return (list(got.texts), got.seconds) if got.status == "ok" else got.skip_reason(system.info.name)


def plan(systems: Sequence[System], baseline: str,
         batch_sizes: Sequence[int]) -> tuple[dict[str, list[int]], list[dict]]:
    """Batch sizes each system runs at, and the (system, batch size) pairs left out with the reason.

    Presets and batched peers run at every size (the baseline at 1 too); sequential peers at 1 only; a
    preset whose decoding cannot run batched (:func:`specli.asr.pipeline.batch_size_for`) only at 1.
    """
    sizes: dict[str, list[int]] = {}
    left_out: list[dict] = []
    for system in systems:
        name = system.info.name
        if isinstance(system, PeerSystem):
            sizes[name] = list(batch_sizes) if system.batched else [1]
            continue
        wanted = sorted(set(batch_sizes) | ({1} if name == baseline else set()))
        sizes[name] = []
        for b in wanted:
            runs_at, why = batch_size_for(system.model, system.decode, b)
            if runs_at == b:
                sizes[name].append(b)
            else:
                left_out.append({"system": name, "batch_size": b, "reason": why or f"runs at batch size {runs_at}"})
    return sizes, left_out


def run_archives(systems: Sequence[System], sizes: Mapping[str, Sequence[int]], baseline: str,
                 clips: Sequence[Clip], opts: BenchOptions, progress: Progress | None = None,
                 warn: Progress | None = None) -> tuple[list[ArchiveRun], list[ArchiveSkip]]:
    """Warm-up, then ``opts.repeat`` passes of every (system, batch size in ``sizes``) over all clips;
    the measured runs, and the skips (``warn`` gets one line each, warm-up included)."""
    with torch_threads(opts.threads):  # the caller's thread count is restored on return
        timestamps = opts.timestamps if opts.timestamps is not None else any(c.timestamps(None) for c in clips)
        every = sorted({b for bs in sizes.values() for b in bs})
        languages: list[str | None] = [opts.language] * len(clips)
        runs: list[ArchiveRun] = []
        skips: list[ArchiveSkip] = []
        for rep in ([-1] if opts.warmup else []) + list(range(opts.repeat)):
            subset = list(clips[:max(every)]) if rep < 0 else list(clips)
            label = "warm-up" if rep < 0 else f"pass {rep + 1}/{opts.repeat}"
            for b in every:
                for system in (s for s in systems if b in sizes[s.info.name]):
                    if isinstance(system, PresetSystem):
                        t0 = time.perf_counter()
                        texts, langs = preset_archive(system, subset, timestamps, b)
                        wall = time.perf_counter() - t0
                    else:
                        langs = languages[:len(subset)]
                        got = peer_archive(system, subset, timestamps, b, langs)
                        if isinstance(got, str):
                            skips.append(ArchiveSkip(system.info.name, b, rep, got))
                            if warn is not None:
                                warn(f"{system.info.name} skipped batch size {b} ({label}): {got}")
                            continue
                        texts, wall = got
                    if system.info.name == baseline and b == 1:
                        languages[:len(langs)] = langs  # peers reuse the baseline's languages (it runs first)
                    if progress is not None:
                        progress(f"{label} batch {b} {system.info.name}: {len(subset)} files in {wall:.2f} s")
                    if rep >= 0:
                        runs.append(ArchiveRun(system.info.name, b, rep, sum(c.seconds for c in subset), wall,
                                               tuple(c.path for c in subset), tuple(texts), tuple(langs)))
        return runs, [s for s in skips if s.repeat >= 0]


def _median_run(runs: Sequence[ArchiveRun]) -> ArchiveRun:
    """The repeat with the median wall time (lower median for an even count)."""
    return sorted(runs, key=lambda r: (r.wall_seconds, r.repeat))[(len(runs) - 1) // 2]


def _same(a: ArchiveRun, b: ArchiveRun) -> int:
    """Files whose normalised texts are equal in both runs."""
    return sum(normalize(x, lang) == normalize(y, lang) for x, y, lang in zip(a.texts, b.texts, a.languages))


def _wer(run: ArchiveRun, refs: Mapping[str, str]) -> float | None:
    counts = [error_counts(refs[f], t, lang) for f, t, lang in zip(run.files, run.texts, run.languages) if f in refs]
    return sum(counts[1:], counts[0]).wer if counts else None


def throughput_table(runs: Sequence[ArchiveRun], baseline: str, refs: Mapping[str, str] | None = None) -> list[dict]:
    """One row per (system, batch size), in first-seen order: median-wall repeat, throughput, speedups,
    transcripts identical to the same system at batch size 1 and to the baseline at batch size 1, WER."""
    groups: dict[tuple[str, int], list[ArchiveRun]] = {}
    for r in runs:
        groups.setdefault((r.system, r.batch_size), []).append(r)
    med = {key: _median_run(rs) for key, rs in groups.items()}
    if (baseline, 1) not in med:
        raise ValueError(f"no run of the baseline {baseline!r} at batch size 1")
    base1 = med[(baseline, 1)]
    rows = []
    for (name, b), r in med.items():
        same_b = med.get((baseline, b))
        own1 = med.get((name, 1))
        rows.append({
            "system": name, "batch_size": b, "files": len(r.files), "audio_seconds": r.audio_seconds,
            "wall_seconds": r.wall_seconds, "walls": [x.wall_seconds for x in groups[(name, b)]],
            "throughput": r.throughput, "speedup_vs_ar": base1.wall_seconds / r.wall_seconds,
            "speedup_vs_ar_same_batch": same_b.wall_seconds / r.wall_seconds if same_b else None,
            "identical_to_batch1": _same(r, own1) if own1 else None,
            "identical_to_baseline": _same(r, base1),
            "wer": _wer(r, refs or {}),
        })
    return rows


def markdown_section(rows: Sequence[dict], baseline: str) -> list[str]:
    """The throughput tables: long form (every row) and systems side by side per batch size."""
    long = [[r["system"], r["batch_size"], r["files"], fmt(r["audio_seconds"], 1), fmt(r["wall_seconds"], 2),
             fmt(r["throughput"], 2), times(r["speedup_vs_ar"]), times(r["speedup_vs_ar_same_batch"]),
             f"{fmt(r['identical_to_batch1'])}/{r['files']}", f"{r['identical_to_baseline']}/{r['files']}",
             "-" if r["wer"] is None else f"{100 * r['wer']:.1f}%"] for r in rows]
    names = list(dict.fromkeys(r["system"] for r in rows))
    sizes = sorted({r["batch_size"] for r in rows})
    cell = {(r["system"], r["batch_size"]): r for r in rows}
    side = [[b, *[("-" if (n, b) not in cell else f"{cell[(n, b)]['throughput']:.2f} "
                   f"({times(cell[(n, b)]['speedup_vs_ar'])})") for n in names]] for b in sizes]
    return [
        "## Throughput by batch size", "",
        f"Each system transcribes the whole clip set in one call (files read inside it). Throughput = audio "
        f"seconds / wall second; speedups are `{baseline}` wall seconds (at batch size 1, and at the same "
        f"batch size) / this wall seconds. Identical: normalised transcripts equal to the same system at "
        f"batch size 1, and to `{baseline}` at batch size 1.", "",
        *table(["system", "batch", "files", "audio s", "wall s", "audio s / s", "vs AR b=1", "vs AR same b",
                "same as own b=1", f"same as {baseline}", "WER"], long),
        "Side by side: audio s / s (speedup vs AR at batch size 1); a sequential peer runs at batch size 1 only.",
        "", *table(["batch", *names], side),
    ]


def run_throughput(inputs: Sequence[str], opts: BenchOptions, references: str | None = None,
                   progress: Progress | None = None, command: str = "", warn: Progress | None = None) -> dict:
    """Measure every (system, batch size) over the clip set and return the report (tables, machine, run);
    ``warn`` gets a line per skipped (peer, batch size, pass)."""
    clips, errors = load_clips(inputs)
    if not clips:
        raise BenchError("no readable audio among the inputs" + (": " + "; ".join(errors) if errors else ""))
    if references or opts.peers:
        require_scoring()
    refs = load_references(references, [c.path for c in clips])
    systems, baseline = build_systems(opts)
    try:
        started, t0 = datetime.now(timezone.utc), time.perf_counter()
        machine = {**machine_info(opts.threads), "processes": peer_processes(systems),
                   "loadavg_before": read_loadavg()}
        sizes, left_out = plan(systems, baseline, opts.batch_sizes)
        for row in left_out:
            if progress is not None:
                progress(f"{row['system']} not measured at batch size {row['batch_size']}: {row['reason']}")
        runs, skips = run_archives(systems, sizes, baseline, clips, opts, progress, warn)
    finally:
        close_systems(systems)
    return {
        "baseline": baseline, "systems": [asdict(s.info) for s in systems],
        "throughput": throughput_table(runs, baseline, refs), "left_out": left_out,
        "skipped": [asdict(s) for s in skips], "runs": [asdict(r) for r in runs],
        "machine": {**machine, "loadavg_after": read_loadavg()},
        "run": {"command": command, "date": started.isoformat(timespec="seconds"),
                "elapsed_seconds": round(time.perf_counter() - t0, 1), "options": asdict(opts),
                "inputs": [c.path for c in clips], "input_errors": errors, "references": references,
                "references_found": len(refs)},
    }


def write_throughput_report(report: dict, out_dir: Path) -> list[Path]:
    """report.json and report.md of a ``--batch-sizes`` run."""
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    r = report["run"]
    dtypes = ", ".join(f"{s['name']} {s['dtype'] or '-'}" for s in report["systems"])
    lines = ["# specli bench report: throughput by batch size", "", *machine_lines(report),
             f"- inputs: {len(r['inputs'])} files, {fmt(report['throughput'][0]['audio_seconds'], 1)} s of audio; "
             f"repeats: {r['options']['repeat']} (warm-up: {r['options']['warmup']}); per (system, batch "
             f"size) the repeat with the median wall time", f"- baseline: `{report['baseline']}`; dtypes: {dtypes}",
             "", *markdown_section(report["throughput"], report["baseline"])]
    if report["left_out"]:
        lines += ["Not measured (the preset's decoding does not run batched; it would run one file at a time):", "",
                  *[f"- `{x['system']}` at batch size {x['batch_size']}: {x['reason']}" for x in report["left_out"]],
                  ""]
    if report.get("skipped"):
        lines += ["## Skipped runs", "", *table(["system", "batch", "pass", "skipped: reason"], [
            [x["system"], x["batch_size"], x["repeat"] + 1, x["reason"]] for x in report["skipped"]])]
    if r["input_errors"]:
        lines += ["## Inputs that could not be read", "", *[f"- {e}" for e in r["input_errors"]], ""]
    write_atomic(out_dir / "report.json", json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    write_atomic(out_dir / "report.md", "\n".join(lines))
    return [out_dir / "report.json", out_dir / "report.md"]
