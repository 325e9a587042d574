"""Run presets and peers on the same in-memory clips, interleaved, and collect :class:`Run` records.

Order: an optional warm-up pass (not recorded), then ``repeat`` passes; in each pass every file is
run by every system in turn (baseline first), so load drift on a shared machine hits all systems alike.
Pool drafters are rebuilt at the start of every pass, so a repeat never drafts from its own earlier
transcript of the same file.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from specli.audio import SAMPLE_RATE, load_audio
from specli.batch import discover
from specli.bench.peers import PEERS, BenchError, FasterWhisperPeer, HFPeer, MAX_PEER_SECONDS
from specli.bench.references import load_references
from specli.bench.report import Bins, Run, SystemInfo, build_report
from specli.engines.strategies import build_decoder
from specli.engines.targets.loader import WhisperModel, load_whisper
from specli.engines.transcription import TranscribeOptions, transcribe_stream
from specli.errors import AudioError
from specli.presets import Preset, load_preset

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BenchOptions:
    """What to benchmark and how."""

    presets: tuple[str, ...]  # preset names or TOML paths, in report order
    baseline: str | None = None  # preset the speedups are relative to; None = first AR preset
    peers: tuple[str, ...] = ()  # "hf", "faster-whisper": same weights as the baseline, greedy
    repeat: int = 3  # measured passes over the inputs
    warmup: bool = True  # one unrecorded pass first
    threads: int | None = None  # torch / CTranslate2 CPU threads; None = library default
    language: str | None = None  # language code; None = detect (peers reuse the baseline's language)
    timestamps: bool = False  # presets decode timestamp tokens (peers never do)

    def __post_init__(self) -> None:
        if not self.presets:
            raise BenchError("give at least one preset")
        if self.repeat < 1:
            raise BenchError("repeat must be >= 1")
        unknown = sorted(set(self.peers) - set(PEERS))
        if unknown:
            raise BenchError(f"unknown peer(s) {unknown}; known: {', '.join(PEERS)}")


@dataclass(frozen=True)
class Clip:
    """One input decoded once into memory."""

    path: str  # as discovered
    audio: np.ndarray  # 16 kHz mono float32

    @property
    def seconds(self) -> float:
        return len(self.audio) / SAMPLE_RATE


def choose_baseline(presets: Sequence[Preset], baseline: str | None) -> str:
    """``baseline``, else the first AR preset given, else ``whisper-base-ar``."""
    if baseline:
        return baseline
    return next((p.name for p in presets if p.strategy == "ar"), "whisper-base-ar")


class PresetSystem:
    """A specli preset: shared model, decoder rebuilt per pass for pool drafters."""

    def __init__(self, preset: Preset, model: WhisperModel, opts: BenchOptions) -> None:
        self.preset, self.model = preset, model
        self.topts = TranscribeOptions(language=opts.language, timestamps=opts.timestamps)
        self.info = SystemInfo(preset.name, "preset", preset.model, preset.strategy)
        self._lang = opts.language or "en"
        self.decode = build_decoder(preset, model, self._lang)

    def new_pass(self) -> None:
        if self.preset.drafter == "pool":
            self.decode = build_decoder(self.preset, self.model, self._lang)

    def run(self, clip: Clip, repeat: int, language: str | None) -> Run:
        t0 = time.perf_counter()
        res = transcribe_stream(self.model, [clip.audio], self.topts, self.decode)
        wall = time.perf_counter() - t0
        st = res.stats
        return Run(
            self.info.name, clip.path, repeat, clip.seconds, wall, st.encode_seconds, st.decode_seconds,
            st.draft_seconds, st.verify_seconds, st.tokens, st.target_forwards, st.verify_steps, st.accepted,
            st.drafted, tuple(st.position_attempts), tuple(st.position_accepts),
            tuple(t for s in res.segments for t in s.tokens), res.text, res.language)


class PeerSystem:
    """A peer implementation, timed around its whole transcription call."""

    def __init__(self, peer: HFPeer | FasterWhisperPeer, model: str) -> None:
        self.peer = peer
        self.info = SystemInfo(peer.name, "peer", model)

    def new_pass(self) -> None:
        pass

    def run(self, clip: Clip, repeat: int, language: str | None) -> Run | None:
        if clip.seconds > MAX_PEER_SECONDS:
            return None
        t0 = time.perf_counter()
        text = self.peer.transcribe(clip.audio, language)
        return Run(self.info.name, clip.path, repeat, clip.seconds, time.perf_counter() - t0, text=text,
                   language=language)


def build_systems(opts: BenchOptions) -> tuple[list[PresetSystem | PeerSystem], str]:
    """Load every model once, build the systems (baseline first) and return the baseline's name."""
    presets = [load_preset(p) for p in opts.presets]
    baseline = choose_baseline(presets, opts.baseline)
    if baseline not in [p.name for p in presets]:
        presets.insert(0, load_preset(baseline))
    presets.sort(key=lambda p: p.name != baseline)
    models: dict[tuple[str, str], WhisperModel] = {}
    systems: list[PresetSystem | PeerSystem] = []
    for p in presets:
        key = (p.model, p.dtype)
        if key not in models:
            models[key] = load_whisper(p.model, p.dtype)
        systems.append(PresetSystem(p, models[key], opts))
    base = systems[0]
    for name in opts.peers:
        peer = HFPeer(base.model) if name == "hf" else FasterWhisperPeer(base.model, opts.threads)
        systems.append(PeerSystem(peer, base.preset.model))
    return systems, baseline


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
               progress: Progress | None = None) -> list[Run]:
    """Warm-up pass, then ``opts.repeat`` interleaved passes; returns the measured runs."""
    if opts.threads:
        torch.set_num_threads(opts.threads)
    runs: list[Run] = []
    languages: dict[str, str | None] = {}
    passes = ([-1] if opts.warmup else []) + list(range(opts.repeat))
    for rep in passes:
        for system in systems:
            system.new_pass()
        for i, clip in enumerate(clips):
            for system in systems:
                run = system.run(clip, rep, opts.language or languages.get(clip.path))
                if run is None:
                    continue
                if system is systems[0]:
                    languages[clip.path] = run.language
                if rep >= 0:
                    runs.append(run)
                if progress is not None:
                    label = "warm-up" if rep < 0 else f"pass {rep + 1}/{opts.repeat}"
                    progress(f"{label} file {i + 1}/{len(clips)} {system.info.name}: {run.wall_seconds:.2f} s")
    return runs


def read_loadavg() -> list[float] | None:
    """1, 5 and 15-minute load averages, when /proc/loadavg exists."""
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return None


def machine_info(threads: int | None) -> dict:
    """CPU model, core count, threads and library versions, for report.json."""
    import os
    import platform

    import transformers

    import specli

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "specli": specli.__version__}
    for pkg in ("faster_whisper", "ctranslate2"):
        try:
            versions[pkg] = __import__(pkg).__version__
        except ImportError:
            versions[pkg] = None
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "threads": threads or torch.get_num_threads(),
            "platform": platform.platform(), "versions": versions}


def run_bench(inputs: Sequence[str], opts: BenchOptions, references: str | None = None, bins: Bins = Bins(),
              progress: Progress | None = None, command: str = "") -> dict:
    """Measure, then return the whole report (machine and run blocks included); writes nothing."""
    clips, errors = load_clips(inputs)
    if not clips:
        raise BenchError("no readable audio among the inputs" + (": " + "; ".join(errors) if errors else ""))
    refs = load_references(references, [c.path for c in clips])
    systems, baseline = build_systems(opts)
    load_before, started, t0 = read_loadavg(), datetime.now(timezone.utc), time.perf_counter()
    runs = run_passes(systems, clips, opts, progress)
    report = build_report([s.info for s in systems], baseline, runs, refs, bins)
    report["machine"] = {**machine_info(opts.threads), "loadavg_before": load_before, "loadavg_after": read_loadavg()}
    report["run"] = {
        "command": command, "date": started.isoformat(timespec="seconds"),
        "elapsed_seconds": round(time.perf_counter() - t0, 1), "options": asdict(opts),
        "inputs": [c.path for c in clips], "input_errors": errors, "references": references,
        "references_found": len(refs),
    }
    return report
