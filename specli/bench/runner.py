"""Run presets and peers on the same in-memory clips, interleaved, and collect :class:`Run` records.

Order: an optional warm-up pass (not recorded), then ``repeat`` passes; in each pass every file is
run by every system in turn (baseline first), so load drift on a shared machine hits all systems alike.
Pool drafters are rebuilt at the start of every pass, so a repeat never drafts from its own earlier
transcript of the same file.

Presets run in this process; each peer runs in its own worker process (:mod:`specli.bench.peer_worker`:
CTranslate2's OpenMP pool beside torch's slowed both down), timed there around the same call. This
process never imports faster-whisper or CTranslate2.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time
from datetime import datetime, timezone
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import transformers

from specli import __version__ as specli_version
from specli.io.audio import SAMPLE_RATE, load_audio
from specli.asr.batched_longform import transcribe_long_audio
from specli.asr.pipeline import DEFAULT_BATCH_SIZE, discover
from specli.bench import wer
from specli.bench.peer_worker import PeerWorker, call_timeout
from specli.bench.peers import MAX_SHORT_FORM_SECONDS, BenchError, PeerTarget, parse_peer
from specli.bench.references import load_references
from specli.bench.report import Bins, Run, Skip, SystemInfo, build_report
from specli.bench.runlog import RunLog, read_runlog
from specli.models.speech import DecodingOptions
from specli.core.device import CPUINFO, cpu_flags, dtype_name
from specli.core.threads import torch_threads
from specli.asr.strategies import build_decoder
from specli.models.registry import family
from specli.asr.windows import Task, TranscribeOptions, transcribe_stream
from specli.errors import AudioError, UsageError
from specli.presets import Preset, load_preset

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BenchOptions:
    """What to benchmark and how."""

    presets: tuple[str, ...]  # preset names or TOML paths, in report order
    baseline: str | None = None  # preset the speedups are relative to; None = first AR preset
    peers: tuple[str, ...] = ()  # "hf", "faster-whisper[:COMPUTE]", "faster-whisper-batched[:COMPUTE]" (peers.py)
    repeat: int = 3  # measured passes over the inputs
    warmup: bool = True  # one unrecorded pass first
    threads: int | None = None  # torch / CTranslate2 CPU threads; None = library default
    language: str | None = None  # language code; None = detect (peers reuse the baseline's language)
    task: Task = "transcribe"  # presets and peers alike: transcribe, or translate (X -> English)
    timestamps: bool | None = None  # timestamp tokens, presets and peers alike; None = only on clips over 30 s
    device: str | None = None  # every preset on this device (auto, cpu, cuda, cuda:N); None = each preset's
    dtype: str | None = None  # every preset in this dtype (auto, float32, bfloat16, float16, int8); None = each preset's
    batch_sizes: tuple[int, ...] = ()  # throughput mode (specli.bench.throughput): these batch sizes; () = per file
    peer_timeout: float | None = None  # seconds a peer call may take before its worker is stopped; None = 300 + 20/audio s

    def __post_init__(self) -> None:
        if not self.presets:
            raise BenchError("give at least one preset")
        if self.repeat < 1:
            raise BenchError("repeat must be >= 1")
        if list(self.batch_sizes) != sorted(set(self.batch_sizes)) or min(self.batch_sizes, default=1) < 1:
            raise BenchError("batch sizes must be positive integers in strictly ascending order")
        if self.peer_timeout is not None and self.peer_timeout <= 0:
            raise BenchError("the peer timeout must be positive")
        names = [parse_peer(p).name for p in self.peers]  # BenchError on an unknown peer or compute type
        if len(set(names)) < len(names):
            raise BenchError(f"peer(s) given twice: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")


@dataclass(frozen=True)
class Clip:
    """One input decoded once into memory."""

    path: str  # as discovered
    audio: np.ndarray  # 16 kHz mono float32

    @property
    def seconds(self) -> float:
        return len(self.audio) / SAMPLE_RATE

    def timestamps(self, asked: bool | None) -> bool:
        """Decode with timestamp tokens: as asked, else only when over 30 s (long-form seeks by them)."""
        return asked if asked is not None else self.seconds > MAX_SHORT_FORM_SECONDS


def choose_baseline(presets: Sequence[Preset], baseline: str | None) -> Preset:
    """``baseline`` (a preset name or TOML file), else the first AR preset given that decodes long files
    sequentially (a batched long-form preset's text differs by design), else ``whisper-base-ar``."""
    if baseline:
        return load_preset(baseline)
    plain = (p for p in presets if p.draft.strategy == "ar" and p.longform == "sequential")
    return next(plain, None) or load_preset("whisper-base-ar")


class PresetSystem:
    """A specli preset: shared model, decoder rebuilt per pass for pool drafters."""

    def __init__(self, preset: Preset, model: object, opts: BenchOptions) -> None:
        self.preset, self.model = preset, model
        # greedy at every window (no temperature fallback): outputs are compared token for token
        self.topts = TranscribeOptions(task=opts.task, language=opts.language, timestamps=False,
                                       decoding=DecodingOptions(temperatures=(0.0,)))
        self.timestamps = opts.timestamps
        self.info = SystemInfo(preset.name, "preset", preset.model, preset.draft.strategy, preset.dtype)
        self._lang = opts.language or "en"
        self.decode = build_decoder(preset, model, self._lang)

    def new_pass(self) -> None:
        if self.preset.draft.learns:
            self.decode = build_decoder(self.preset, self.model, self._lang)

    def run(self, clip: Clip, repeat: int, language: str | None) -> Run:
        topts = replace(self.topts, timestamps=clip.timestamps(self.timestamps))
        tally = getattr(self.model.target, "experts", None)  # an MoE target's ExpertTally (models/moe.py)
        if tally is not None:
            tally.reset()
        t0 = time.perf_counter()
        if self.preset.longform == "batched":
            res = transcribe_long_audio(self.model, [clip.audio], topts, self.decode, DEFAULT_BATCH_SIZE)
        else:
            res = transcribe_stream(self.model, [clip.audio], topts, self.decode)
        wall = time.perf_counter() - t0
        experts = None if tally is None else {str(n): list(v) for n, v in sorted(tally.by_tokens.items())}
        return Run(self.info.name, clip.path, repeat, clip.seconds, wall, res.stats.encode_seconds, res.stats.decode,
                   tuple(t for s in res.segments for t in s.tokens), res.text, res.language, experts)


class PeerSystem:
    """A peer implementation in its own worker process, timed there around its whole transcription call."""

    def __init__(self, worker: PeerWorker, model: str, timestamps: bool | None, timeout: float | None) -> None:
        self.worker, self.timestamps, self.timeout = worker, timestamps, timeout
        info = worker.info or worker.ready()
        self.batched = info.batched  # decodes several windows per forward: measured at every --batch-sizes entry
        self.info = SystemInfo(info.name, "peer", model, dtype=info.dtype)

    def new_pass(self) -> None:
        pass

    def run(self, clip: Clip, repeat: int, language: str | None) -> Run | Skip:
        got = self.worker.transcribe(clip.path, clip.audio, language, clip.timestamps(self.timestamps),
                                     call_timeout(clip.seconds, self.timeout))
        if got.status != "ok":
            return Skip(self.info.name, clip.path, repeat, clip.seconds, got.skip_reason(self.info.name))
        return Run(self.info.name, clip.path, repeat, clip.seconds, got.seconds, text=got.texts[0], language=language)


def build_systems(opts: BenchOptions) -> tuple[list[PresetSystem | PeerSystem], str]:
    """Load every model once, build the systems (baseline first) and return the baseline's name."""
    presets = [load_preset(p) for p in opts.presets]
    base_preset = choose_baseline(presets, opts.baseline)
    baseline = base_preset.name  # a TOML path resolves to its file's stem, the name the report uses
    same = [p for p in presets if p.name == baseline]
    if same and same[0] != base_preset:
        raise BenchError(f"two different presets are named {baseline!r}: rename one of the TOML files")
    if not same:
        presets.insert(0, base_preset)
    names = [p.name for p in presets]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise BenchError(f"preset(s) given twice: {', '.join(dupes)}")
    presets.sort(key=lambda p: p.name != baseline)
    models: dict[tuple[str, str, str, str], object] = {}
    systems: list[PresetSystem | PeerSystem] = []
    for p in presets:
        p = replace(p, device=opts.device or p.device, dtype=opts.dtype or p.dtype)
        key = (p.family, p.model, p.dtype, p.device)
        if key not in models:
            models[key] = family(p.family).load(p.model, p.dtype, device=p.device)
        model = models[key]  # the preset as run: effective dtype and device
        try:  # the family's hooks: an English-only Whisper cannot translate, ...
            model.speech_hooks().check_support(p.model, opts.task, opts.language)
        except UsageError as exc:
            raise BenchError(f"{p.name}: {exc}") from exc
        p = replace(p, dtype=dtype_name(model.target.dtype), device=str(model.target.device))
        systems.append(PresetSystem(p, model, opts))
    base = systems[0]
    return systems + start_peers(opts, PeerTarget.of(base.model), base.preset.model), baseline


def start_peers(opts: BenchOptions, target: PeerTarget, model: str) -> list[PeerSystem]:
    """One worker process per peer, started together; each ready (peer built) or :class:`BenchError`."""
    workers = [PeerWorker(parse_peer(spec), target, opts.threads, opts.task) for spec in opts.peers]
    try:
        for worker in workers:
            worker.ready()
    except BaseException:  # a peer that cannot start (or Ctrl-C): no worker is left behind
        close_systems(workers)
        raise
    return [PeerSystem(w, model, opts.timestamps, opts.peer_timeout) for w in workers]


def close_systems(systems: Sequence[PresetSystem | PeerSystem | PeerWorker]) -> None:
    """Stop the peers' worker processes among ``systems`` (PeerSystem or PeerWorker; others are skipped)."""
    for system in systems:
        worker = system.worker if isinstance(system, PeerSystem) else system
        if isinstance(worker, PeerWorker):
            worker.close()


def peer_processes(systems: Sequence[PresetSystem | PeerSystem]) -> dict:
    """This process's id, and each peer worker's id and torch threads, for report.json."""
    workers = {s.info.name: s.worker.info for s in systems if isinstance(s, PeerSystem)}
    return {"pid": os.getpid(), "peers": {name: {"pid": w.pid, "torch_threads": w.torch_threads}
                                          for name, w in workers.items() if w is not None}}


def load_clips(inputs: Sequence[str]) -> tuple[list[Clip], list[str]]:
    """Discover and decode the inputs once; unreadable inputs become error lines."""
    found, bad = discover(inputs)
    errors = [o.error or str(o.path) for o in bad]
    clips = []
    for path, _root in found:
        try:
            clips.append(Clip(str(path), load_audio(path)))
        except AudioError as exc:
            errors.append(str(exc))
    return clips, errors


def run_passes(systems: Sequence[PresetSystem | PeerSystem], clips: Sequence[Clip], opts: BenchOptions,
               progress: Progress | None = None, *, on_record: Callable[[Run | Skip], None] | None = None,
               warn: Progress | None = None) -> tuple[list[Run], list[Skip]]:
    """Warm-up pass, then ``opts.repeat`` interleaved passes; returns the measured runs and the skips.

    ``on_record`` gets every measured run and skip as soon as it finishes (runs.jsonl); ``warn`` gets one
    line per system and file that was skipped (warm-up included), so no skip is silent.
    """
    with torch_threads(opts.threads):  # the caller's thread count is restored on return
        runs: list[Run] = []
        skips: list[Skip] = []
        warned: set[tuple[str, str]] = set()
        languages: dict[str, str | None] = {}
        passes = ([-1] if opts.warmup else []) + list(range(opts.repeat))
        for rep in passes:
            for system in systems:
                system.new_pass()
            label = "warm-up" if rep < 0 else f"pass {rep + 1}/{opts.repeat}"
            for i, clip in enumerate(clips):
                for system in systems:
                    run = system.run(clip, rep, opts.language or languages.get(clip.path))
                    if isinstance(run, Skip):
                        if warn is not None and (run.system, run.file) not in warned:
                            warn(f"{run.system} skipped {run.file} ({label}): {run.reason}")
                        warned.add((run.system, run.file))
                        if rep >= 0:
                            skips.append(run)
                            if on_record is not None:
                                on_record(run)
                        continue
                    if system is systems[0]:
                        languages[clip.path] = run.language
                    if rep >= 0:
                        runs.append(run)
                        if on_record is not None:
                            on_record(run)
                    if progress is not None:
                        progress(f"{label} file {i + 1}/{len(clips)} {system.info.name}: {run.wall_seconds:.2f} s")
        return runs, skips


def read_loadavg() -> list[float] | None:
    """1, 5 and 15-minute load averages, when /proc/loadavg exists."""
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return None


CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")  # what makes this CPU's figures differ


def cpu_description(cpuinfo: str, fallback: str) -> dict:
    """The first processor of ``cpuinfo`` (Linux's /proc/cpuinfo text; empty: ``fallback`` names it): its model
    name, ``family F model M`` (None where the file has no family, e.g. ARM) and which of ``CPU_FEATURES`` it has."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            break  # the first processor's block ends at its blank line
        fields.setdefault(key.strip(), value.strip())
    flags = cpu_flags(cpuinfo)
    family = f"family {fields['cpu family']} model {fields.get('model', '?')}" if "cpu family" in fields else None
    return {"cpu": fields.get("model name", fallback), "cpu_id": family,
            "cpu_features": [f for f in CPU_FEATURES if f in flags]}


def machine_info(threads: int | None) -> dict:
    """CPU (:func:`cpu_description`), core count, threads and library versions, for report.json."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:  # no /proc (macOS, Windows)
        text = ""
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "specli": specli_version}
    for pkg, dist in (("faster_whisper", "faster-whisper"), ("ctranslate2", "ctranslate2")):
        try:  # read from the installed metadata: importing them here would load CTranslate2's OpenMP pool
            versions[pkg] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {**cpu_description(text, platform.processor() or platform.machine()), "cpu_count": os.cpu_count(),
            "threads": threads or torch.get_num_threads(), "platform": platform.platform(), "versions": versions,
            "gpu": gpu, "cuda": torch.version.cuda}


def run_bench(inputs: Sequence[str], opts: BenchOptions, references: str | None = None, bins: Bins = Bins(),
              progress: Progress | None = None, command: str = "", runs_path: Path | None = None,
              warn: Progress | None = None) -> dict:
    """Measure, then return the whole report (machine and run blocks included).

    With ``runs_path``, every measured run and skip is written there (runs.jsonl, atomically, as it
    finishes) before the report is built, so a failure while building the report loses no measurement.
    """
    clips, errors = load_clips(inputs)
    if not clips:
        raise BenchError("no readable audio among the inputs" + (": " + "; ".join(errors) if errors else ""))
    if references or opts.peers:  # before measuring: WER and the peers' text comparison need them
        require_scoring()
    refs = load_references(references, [c.path for c in clips])
    systems, baseline = build_systems(opts)
    try:
        started, t0 = datetime.now(timezone.utc), time.perf_counter()
        header = {
            "systems": [asdict(s.info) for s in systems], "baseline": baseline, "command": command,
            "date": started.isoformat(timespec="seconds"), "options": asdict(opts), "bins": list(bins.edges),
            "inputs": [c.path for c in clips], "input_errors": errors, "references": references,
            "machine": {**machine_info(opts.threads), "processes": peer_processes(systems),
                        "loadavg_before": read_loadavg()},
        }
        log = RunLog(runs_path, header) if runs_path is not None else None
        runs, skips = run_passes(systems, clips, opts, progress, on_record=log.add if log else None, warn=warn)
    finally:
        close_systems(systems)
    return assemble_report(header, runs, skips, refs, bins, round(time.perf_counter() - t0, 1))


def require_scoring() -> None:
    try:
        wer.require()
    except wer.WerPackagesMissing as exc:
        raise BenchError(str(exc)) from None


def assemble_report(header: dict, runs: Sequence[Run], skips: Sequence[Skip], refs: dict[str, str], bins: Bins,
                    elapsed: float | None) -> dict:
    """The report of measured runs, with the machine and run blocks from a runs.jsonl header."""
    systems = [SystemInfo(**s) for s in header["systems"]]
    report = build_report(systems, header["baseline"], runs, refs, bins, skips)
    report["machine"] = {**header["machine"], "loadavg_after": read_loadavg() if elapsed is not None else None}
    report["run"] = {
        "command": header["command"], "date": header["date"], "elapsed_seconds": elapsed,
        "options": header["options"], "inputs": header["inputs"], "input_errors": header["input_errors"],
        "references": header["references"], "references_found": len(refs),
    }
    return report


def report_from_runs(path: Path, references: str | None = None, bins: Bins | None = None) -> dict:
    """Build the report again from a runs.jsonl (after an interrupted run or a report failure).

    ``references`` / ``bins`` default to the ones the measurement used.
    """
    try:
        data = read_runlog(path)
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot read the runs: {exc}") from exc
    if not data.runs:
        raise BenchError(f"{path}: no measured run in it")
    spec = references if references is not None else data.header.get("references")
    if spec or any(s.kind == "peer" for s in data.systems):
        require_scoring()
    files = list(dict.fromkeys(r.file for r in data.runs))
    refs = load_references(spec, files)
    header = {**data.header, "references": spec}
    edges = bins if bins is not None else Bins(tuple(data.header.get("bins", Bins().edges)))
    return assemble_report(header, data.runs, data.skips, refs, edges, None)
