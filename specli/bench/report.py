"""Pure arithmetic over per-run records: medians, ratios, acceptance, length bins, losslessness, WER.

Nothing here measures or prints; :mod:`specli.bench.runner` produces :class:`Run` records and
:mod:`specli.bench.render` formats what :func:`build_report` returns.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields

from specli.bench.wer import error_counts, normalize
from specli.core.types import DecodeStats


@dataclass(frozen=True)
class SystemInfo:
    """One benchmarked system: a specli preset or a peer implementation."""

    name: str  # preset name, or a peer spec ("hf", "faster-whisper:int8", ...)
    kind: str  # "preset" or "peer"
    model: str  # model name the system decodes with
    strategy: str = ""  # preset strategy ("ar", "chain", ...); "" for peers
    dtype: str = ""  # dtype it ran in (presets: the resolved one; faster-whisper: compute type); "" unknown


@dataclass(frozen=True)
class Run:
    """One timed run of one system on one file."""

    system: str  # SystemInfo.name
    file: str  # input path as given
    repeat: int  # 0-based measured repeat
    audio_seconds: float  # duration of the file
    wall_seconds: float  # whole transcription of the in-memory audio
    encode_seconds: float = 0.0  # log-mel + encoder (presets only)
    decode: DecodeStats | None = None  # the file's decode counters and times (presets); None for peers
    token_ids: tuple[int, ...] | None = None  # text tokens of the transcript; None for peers
    text: str = ""  # transcript
    language: str | None = None  # language decoded with
    # MoE targets: distinct experts touched by the decode's non-prefill forwards (each a verify step, or a plain
    # decode step), by tokens in the forward: {"n": [forwards, experts summed over the MoE layers]}; None: dense
    experts: dict[str, list[int]] | None = None
    # synthesis presets with audio: wall seconds of each stage {"llm", "flow", "vocoder"} (their sum is wall_seconds,
    # audio_seconds the rendered audio's duration); None: speech tokens only
    stages: dict[str, float] | None = None

    def stat(self, name: str) -> float:
        """A :class:`DecodeStats` counter or time (``tokens``, ``decode_seconds``, ...); 0 for peers."""
        return getattr(self.decode, name) if self.decode is not None else 0

    @property
    def position_attempts(self) -> list[int]:
        return list(self.decode.position_attempts) if self.decode is not None else []

    @property
    def position_accepts(self) -> list[int]:
        return list(self.decode.position_accepts) if self.decode is not None else []

    def to_dict(self) -> dict:
        """A JSON-ready record (one line of runs.jsonl)."""
        out = asdict(self)
        out["token_ids"] = list(self.token_ids) if self.token_ids is not None else None
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> Run:
        """Inverse of :meth:`to_dict`; unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        if kwargs.get("decode") is not None:
            stat_fields = {f.name for f in fields(DecodeStats)}
            kwargs["decode"] = DecodeStats(**{k: v for k, v in kwargs["decode"].items() if k in stat_fields})
        if kwargs.get("token_ids") is not None:
            kwargs["token_ids"] = tuple(kwargs["token_ids"])
        return cls(**kwargs)


@dataclass(frozen=True)
class Skip:
    """A run a system could not do on one file, with the reason (reported, never silent)."""

    system: str  # SystemInfo.name
    file: str  # input path as given
    repeat: int  # 0-based measured repeat (-1: warm-up)
    audio_seconds: float  # duration of the file
    reason: str  # why, in one line


@dataclass(frozen=True)
class Utterance:
    """One (system, file): the repeat with the median wall time (lower median for an even count).

    Taking every time from that one repeat keeps the split (encoder + decode + other = wall) consistent.
    """

    run: Run  # the median-wall repeat
    walls: tuple[float, ...]  # every repeat's wall time
    stable: bool  # every repeat produced the same text (and tokens)

    @property
    def steps(self) -> int:
        """Token-producing target steps: verify steps (plain greedy records each of its steps as one with no
        draft); runs recorded before it did: every forward."""
        return int(self.run.stat("verify_steps") or self.run.stat("target_forwards"))

    @property
    def acceptance(self) -> float | None:
        """Tokens per step (tau) of this utterance; None for peers."""
        return self.run.stat("tokens") / self.steps if self.steps else None


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def aggregate(runs: Sequence[Run]) -> dict[tuple[str, str], Utterance]:
    """Group runs by (system, file) and keep the median-wall repeat, all walls, and a stability flag."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.system, r.file), []).append(r)
    out = {}
    for key, rs in groups.items():
        rs = sorted(rs, key=lambda r: r.repeat)
        mid = sorted(rs, key=lambda r: (r.wall_seconds, r.repeat))[(len(rs) - 1) // 2]
        stable = len({(r.text, r.token_ids) for r in rs}) == 1
        out[key] = Utterance(mid, tuple(r.wall_seconds for r in rs), stable)
    return out


def ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


@dataclass(frozen=True)
class Lossless:
    """Outputs identical to the reference system's (tokens for presets, normalised text for peers)."""

    reference: str | None  # system compared against; None when none has the same model
    identical: int = 0
    compared: int = 0
    differing: tuple[str, ...] = ()  # files whose output differs


def reference_system(info: SystemInfo, systems: Sequence[SystemInfo], baseline: str) -> str | None:
    """Whom ``info`` must match: the baseline when the model is the same, else that model's AR preset."""
    base = next(s for s in systems if s.name == baseline)
    if info.name == baseline:
        return None
    if info.model == base.model:
        return baseline
    ar = [s.name for s in systems if s.kind == "preset" and s.strategy == "ar" and s.model == info.model]
    return ar[0] if ar and ar[0] != info.name else None


def losslessness(info: SystemInfo, ref: str | None, utts: Mapping[tuple[str, str], Utterance],
                 files: Sequence[str]) -> Lossless:
    """Count files whose output equals the reference system's output."""
    if ref is None:
        return Lossless(None)
    identical, compared, differing = 0, 0, []
    for f in files:
        mine, theirs = utts.get((info.name, f)), utts.get((ref, f))
        if mine is None or theirs is None:
            continue
        compared += 1
        if info.kind == "preset" and mine.run.token_ids is not None and theirs.run.token_ids is not None:
            same = mine.run.token_ids == theirs.run.token_ids
        else:
            same = normalize(mine.run.text, mine.run.language) == normalize(theirs.run.text, mine.run.language)
        identical += same
        if not same:
            differing.append(f)
    return Lossless(ref, identical, compared, tuple(differing))


def _sum(utts: Sequence[Utterance], name: str) -> float:
    """Sum of a Run field (``wall_seconds``, ``audio_seconds``, ...) or of a DecodeStats counter."""
    return sum(getattr(u.run, name) if hasattr(u.run, name) else u.run.stat(name) for u in utts)


def acceptance_stats(utts: Sequence[Utterance]) -> dict:
    """Micro (total tokens / total steps) and macro (mean per utterance) acceptance, per-position rates."""
    steps = sum(u.steps for u in utts)
    taus = [u.acceptance for u in utts if u.acceptance is not None]
    depth = max((len(u.run.position_attempts) for u in utts), default=0)
    attempts = [sum(u.run.position_attempts[d] for u in utts if d < len(u.run.position_attempts))
                for d in range(depth)]
    accepts = [sum(u.run.position_accepts[d] for u in utts if d < len(u.run.position_accepts))
               for d in range(depth)]
    rates = [a / n if n else 0.0 for a, n in zip(accepts, attempts)]
    lengths: list[int] = []
    for u in utts:
        for k, n in enumerate(u.run.decode.draft_lengths if u.run.decode is not None else ()):
            lengths.extend([0] * (k + 1 - len(lengths)))
            lengths[k] += n
    return {
        "draft_lengths": lengths,  # draft_lengths[k]: verify steps that drafted k tokens (goodput's choices)
        "acceptance_micro": ratio(_sum(utts, "tokens"), steps) if steps else None,
        "acceptance_macro": statistics.fmean(taus) if taus else None,
        "position_attempts": attempts,
        "position_accepts": accepts,
        "position_rates": rates,
        "position0_rate": rates[0] if rates else None,
    }


def expert_stats(utts: Sequence[Utterance]) -> dict:
    """MoE targets: mean distinct experts touched per verify step (every non-prefill forward: a verification,
    or a plain decode step), and per forward by tokens verified (draft + 1); empty for dense targets."""
    by: dict[int, list[int]] = {}
    for u in utts:
        for n, (f, e) in (u.run.experts or {}).items():
            entry = by.setdefault(int(n), [0, 0])
            entry[0], entry[1] = entry[0] + f, entry[1] + e
    if not by:
        return {}
    forwards, experts = sum(f for f, _ in by.values()), sum(e for _, e in by.values())
    return {"experts_per_step": ratio(experts, forwards),
            "experts_by_tokens": {str(n): e / f for n, (f, e) in sorted(by.items()) if f}}


def speedups(utts: Sequence[Utterance], base: Mapping[str, Utterance]) -> dict:
    """End-to-end and decoder-phase speedups vs the baseline over the files both have."""
    pairs = [(u, base[u.run.file]) for u in utts if u.run.file in base]
    mine = [u for u, _ in pairs]
    theirs = [b for _, b in pairs]
    per_utt = [b.run.wall_seconds / u.run.wall_seconds for u, b in pairs if u.run.wall_seconds > 0]
    decode = ratio(_sum(theirs, "decode_seconds"), _sum(mine, "decode_seconds"))
    return {
        "speedup_e2e": ratio(_sum(theirs, "wall_seconds"), _sum(mine, "wall_seconds")),
        "speedup_decode": decode if _sum(mine, "decode_seconds") > 0 else None,
        "speedup_e2e_median_utt": median(per_utt) if per_utt else None,
    }


def system_summary(info: SystemInfo, utts: Sequence[Utterance], base: Mapping[str, Utterance]) -> dict:
    """Totals (sums of per-file medians), RTF, time split, acceptance and speedups of one system."""
    wall, audio = _sum(utts, "wall_seconds"), _sum(utts, "audio_seconds")
    encode, decode = _sum(utts, "encode_seconds"), _sum(utts, "decode_seconds")
    preset = info.kind == "preset"
    out = {
        "system": info.name, "kind": info.kind, "model": info.model, "strategy": info.strategy, "dtype": info.dtype,
        "utterances": len(utts), "audio_seconds": audio, "wall_seconds": wall, "rtf": ratio(wall, audio),
        "encode_seconds": encode if preset else None, "decode_seconds": decode if preset else None,
        "draft_seconds": _sum(utts, "draft_seconds") if preset else None,
        "verify_seconds": _sum(utts, "verify_seconds") if preset else None,
        "other_seconds": wall - encode - decode if preset else None,
        "tokens": int(_sum(utts, "tokens")) if preset else None,
        "target_forwards": int(_sum(utts, "target_forwards")) if preset else None,
        "unstable": [u.run.file for u in utts if not u.stable],
    }
    acc = acceptance_stats(utts) if preset else {}
    out.update(acc)
    out.update(expert_stats(utts))
    out.update(speedups(utts, base))
    if not preset:
        out["speedup_decode"] = None
    return out


@dataclass(frozen=True)
class Bins:
    """Utterance-length bins: edges in seconds, e.g. (3, 6) -> <3 s, 3-6 s, >=6 s."""

    edges: tuple[float, ...] = (3.0, 6.0)  # ascending bin boundaries in seconds

    def labels(self) -> list[str]:
        e = self.edges
        if not e:
            return ["all"]
        mids = [f"{_fmt(a)}-{_fmt(b)} s" for a, b in zip(e, e[1:])]
        return [f"<{_fmt(e[0])} s", *mids, f">={_fmt(e[-1])} s"]

    def index(self, seconds: float) -> int:
        return sum(seconds >= edge for edge in self.edges)


def _fmt(x: float) -> str:
    return f"{x:g}"


def length_bins(systems: Sequence[SystemInfo], by_system: Mapping[str, list[Utterance]],
                base: Mapping[str, Utterance], bins: Bins) -> list[dict]:
    """Per bin and system: utterances, speedups vs the baseline, acceptance."""
    labels = bins.labels()
    rows = []
    for i, label in enumerate(labels):
        for info in systems:
            utts = [u for u in by_system.get(info.name, []) if bins.index(u.run.audio_seconds) == i]
            if not utts:
                continue
            row = {"bin": label, "system": info.name, "utterances": len(utts),
                   "audio_seconds": _sum(utts, "audio_seconds")}
            row.update(speedups(utts, base))
            if info.kind != "preset":
                row["speedup_decode"] = None
            row["acceptance_micro"] = acceptance_stats(utts)["acceptance_micro"] if info.kind == "preset" else None
            rows.append(row)
    return rows


def error_rates(utts: Sequence[Utterance], references: Mapping[str, str]) -> dict | None:
    """Corpus WER / CER (edits summed over utterances) against the references that exist."""
    counts = [error_counts(references[u.run.file], u.run.text, u.run.language)
              for u in utts if u.run.file in references]
    if not counts:
        return None
    total = sum(counts[1:], counts[0])
    return {"utterances": len(counts), "wer": total.wer, "cer": total.cer, "word_edits": total.word_edits,
            "words": total.words, "char_edits": total.char_edits, "chars": total.chars}


def skipped(skips: Sequence[Skip]) -> list[dict]:
    """One row per (system, file, reason) with the repeats it covers, in first-seen order."""
    rows: dict[tuple[str, str, str], dict] = {}
    for k in skips:
        row = rows.setdefault((k.system, k.file, k.reason), {
            "system": k.system, "file": k.file, "audio_seconds": k.audio_seconds, "reason": k.reason, "repeats": []})
        row["repeats"].append(k.repeat)
    return list(rows.values())


def build_report(systems: Sequence[SystemInfo], baseline: str, runs: Sequence[Run],
                 references: Mapping[str, str] | None = None, bins: Bins = Bins(),
                 skips: Sequence[Skip] = ()) -> dict:
    """Everything report.json holds except the machine block: summaries, bins, utterances, skips."""
    names = [s.name for s in systems]
    if baseline not in names:
        raise ValueError(f"baseline {baseline!r} is not one of the systems {names}")
    utts = aggregate(runs)
    files = list(dict.fromkeys(r.file for r in runs))
    by_system = {s.name: [utts[(s.name, f)] for f in files if (s.name, f) in utts] for s in systems}
    base = {u.run.file: u for u in by_system[baseline]}
    skip_rows = skipped([k for k in skips if k.repeat >= 0])
    summaries = []
    for info in systems:
        summary = system_summary(info, by_system[info.name], base)
        ref = reference_system(info, systems, baseline)
        summary["lossless"] = losslessness(info, ref, utts, files).__dict__
        summary["errors"] = error_rates(by_system[info.name], references or {})
        summary["skipped"] = len({row["file"] for row in skip_rows if row["system"] == info.name})
        summaries.append(summary)
    return {
        "baseline": baseline,
        "systems": [s.__dict__ for s in systems],
        "bins": {"edges": list(bins.edges), "labels": bins.labels()},
        "summaries": summaries,
        "length_bins": length_bins(systems, by_system, base, bins),
        "pairwise_speedup": pairwise(systems, by_system),
        "skipped": skip_rows,
        "utterances": [_utt_record(u, references or {}) for u in utts.values()],
    }


def pairwise(systems: Sequence[SystemInfo], by_system: Mapping[str, list[Utterance]]) -> dict:
    """``[a][b]`` = b's wall seconds / a's wall seconds over the files both ran: how much faster a is than b."""
    walls = {s.name: {u.run.file: u.run.wall_seconds for u in by_system[s.name]} for s in systems}
    out: dict[str, dict[str, float | None]] = {}
    for a in systems:
        out[a.name] = {}
        for b in systems:
            common = walls[a.name].keys() & walls[b.name].keys()
            out[a.name][b.name] = ratio(sum(walls[b.name][f] for f in common), sum(walls[a.name][f] for f in common))
    return out


def _utt_record(u: Utterance, references: Mapping[str, str]) -> dict:
    rec = u.run.to_dict()
    rec.pop("repeat")
    rec["walls"], rec["stable"], rec["acceptance"] = list(u.walls), u.stable, u.acceptance
    if u.run.file in references:
        counts = error_counts(references[u.run.file], u.run.text, u.run.language)
        rec["wer"], rec["cer"] = counts.wer, counts.cer
    return rec
