"""``specli bench`` for synthesis presets: text -> speech tokens, interleaved, against an AR baseline.

Each pass runs every utterance through every preset in turn, the first preset rotating from one utterance to the
next: oneDNN builds its kernels for each new input length, so whoever renders a length first pays for it (~30% of a
HiFi-GAN call on a 2-3 s utterance on an AVX2 EPYC) and a fixed order would charge it to one preset. Pool drafters
are rebuilt per pass. The report reuses :mod:`specli.bench.report` (``Run`` records, median-wall repeat,
acceptance and speedups) and adds the exactness column:

- greedy presets: tokens identical to the AR preset of the same model (greedy);
- sampling presets: the same seed gives identical tokens across the repeated passes of the preset.

With ``audio`` every utterance is also rendered (flow + vocoder, :class:`~specli.tts.acoustic.pipeline.Vocalizer`,
the vocoder's noise from the run seed and the id as ``synthesize`` draws it): the report then has the
real-time factor of each stage, the LLM-stage speedup and the end-to-end (text -> audio) speedup.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specli.bench.report import Run, SystemInfo, acceptance_stats, aggregate, speedups
from specli.tts.acoustic.pipeline import (AUDIO_DTYPES, AudioDtype, RenderError, Vocalizer, VoicePrompt, audio_dtype,
                                          stage_dtypes)
from specli.tts.audio_out import vocoder_generator
from specli.tts.synthesis import (PresetOverrides, SynthesisInputError, SynthesisRequest, Synthesizer,
                                  build_synthesizer)
from specli.models.cosyvoice.lm import CosyVoiceModel, load_cosyvoice
from specli.presets.synthesis import SynthesisPreset, load_synthesis_preset
from specli.tts.pipeline import read_items


@dataclass(frozen=True)
class SynthesisBenchOptions:
    """What to benchmark and how."""

    presets: tuple[str, ...]  # synthesis preset names or TOML files
    baseline: str | None = None  # AR preset the speedups are relative to; None = first AR preset given
    repeat: int = 3  # measured passes
    warmup: bool = True  # one unrecorded pass first
    seed: int = 0  # run seed (each utterance's generator from (seed, id))
    model: str | None = None  # override every preset's model (a checkpoint directory)
    audio: bool = False  # also render each utterance to audio: per-stage real-time factors, end-to-end speedup
    # the flow's and vocoder's compute dtype (pipeline.audio_dtype); None: synthesize's default (stage_dtypes: a
    # float32 flow, the vocoder's own default: bf16 HiFi-GAN at one thread of a native-bf16 CPU)
    audio_dtype: AudioDtype | None = None

    def __post_init__(self) -> None:
        if not self.presets or self.repeat < 1:
            raise ValueError("give at least one preset and repeat >= 1")
        if self.audio_dtype is not None and self.audio_dtype not in AUDIO_DTYPES:
            raise ValueError(f"audio dtype must be one of {', '.join(AUDIO_DTYPES)}")


def _systems(opts: SynthesisBenchOptions) -> tuple[list[SynthesisPreset], str]:
    presets = [load_synthesis_preset(p) for p in opts.presets]
    if opts.baseline:
        base = load_synthesis_preset(opts.baseline)
    else:
        base = next((p for p in presets if p.draft.strategy == "ar"), None)
        if base is None:
            raise ValueError("no AR preset among --presets: give --baseline")
    if all(p.name != base.name for p in presets):
        presets.insert(0, base)
    presets.sort(key=lambda p: p.name != base.name)
    return presets, base.name


def run_synthesis_bench(inputs: Sequence[str], opts: SynthesisBenchOptions,
                        progress: Callable[[str], None] | None = None) -> dict:
    """Measure every preset on the utterances of ``inputs`` (text files / manifests); return the report."""
    presets, baseline = _systems(opts)
    requests = [it.request for it in read_items(inputs) if it.request is not None]
    if not requests:
        raise ValueError("no utterances to measure")
    models: dict[tuple[str, str], CosyVoiceModel] = {}
    for p in presets:
        key = (opts.model or p.model, p.dtype)
        if key not in models:
            models[key] = load_cosyvoice(*key)
    flow_dtype, vocoder = stage_dtypes(opts.audio_dtype, None)  # as synthesize picks them
    vocalizers = {key: Vocalizer.from_dir(m.path, m.spec.kind, m.lm.qwen.device,
                                          dtype=audio_dtype(flow_dtype, m.lm.qwen.device), vocoder=vocoder)
                  for key, m in models.items()} if opts.audio else {}
    runs: list[Run] = []
    for rep in range(-1 if opts.warmup else 0, opts.repeat):
        synths = [(p, (opts.model or p.model, p.dtype)) for p in presets]
        synths = [(p, key, build_synthesizer(p, models[key], PresetOverrides(seed=opts.seed))) for p, key in synths]
        for i, req in enumerate(requests):
            turn = (i + rep + 1) % len(synths)  # who goes first rotates (see the module's docstring)
            for p, key, synth in synths[turn:] + synths[:turn]:
                run = _measure(p, synth, vocalizers.get(key), req, rep, opts.seed, progress)
                if run is not None and rep >= 0:
                    runs.append(run)
    report = build_synthesis_report(presets, baseline, runs)
    if vocalizers:  # the stages' compute dtype (one per model: the same rule for every model)
        report["audio_dtype"] = sorted({str(v.dtype).removeprefix("torch.") for v in vocalizers.values()})
        report["vocoder_dtype"] = sorted({str(v.vocoder_dtype).removeprefix("torch.") for v in vocalizers.values()})
    return report


def _measure(p: SynthesisPreset, synth: Synthesizer, vocalizer: Vocalizer | None, req: SynthesisRequest,
             rep: int, seed: int, progress: Callable[[str], None] | None) -> Run | None:
    """One utterance through one preset (and the acoustic stages with a ``vocalizer``); None when it is refused."""
    t0 = time.perf_counter()
    try:
        res = synth.synthesize(req)
    except SynthesisInputError as exc:
        if progress:
            progress(f"skip {req.id}: {exc}")
        return None
    llm = time.perf_counter() - t0
    stages, duration = None, 0.0
    if vocalizer is not None:
        try:
            audio = vocalizer.render(res.tokens, VoicePrompt.none(vocalizer.spec.mel.n_mels),
                                     vocoder_generator(seed, req.id))
        except RenderError as exc:
            if progress:
                progress(f"skip {req.id}: {exc}")
            return None
        stages = {"llm": llm, "flow": audio.flow_seconds, "vocoder": audio.vocoder_seconds}
        duration = audio.duration
    wall = llm if stages is None else sum(stages.values())
    if progress:
        progress(f"{'warmup' if rep < 0 else f'pass {rep + 1}'} {p.name} {req.id}: {len(res.tokens)} tokens, "
                 f"{wall:.2f} s")
    return Run(p.name, req.id, rep, duration, wall, 0.0, res.stats, tuple(res.tokens), req.text, stages=stages)


def build_synthesis_report(presets: Sequence[SynthesisPreset], baseline: str, runs: Sequence[Run]) -> dict:
    """Per preset: tokens/s, acceptance (micro and per position), speedup vs baseline, exactness."""
    utts = aggregate(runs)
    base = {f: u for (s, f), u in utts.items() if s == baseline}
    summaries = []
    for p in presets:
        mine = [u for (s, _), u in sorted(utts.items()) if s == p.name]
        tokens = sum(len(u.run.token_ids or ()) for u in mine)
        decode = sum(u.run.stat("decode_seconds") for u in mine)
        info = SystemInfo(p.name, "preset", p.model, p.draft.strategy)
        summary = {"system": info.name, "model": info.model, "strategy": info.strategy, "sampler": p.sampler,
                   "utterances": len(mine), "tokens": tokens, "wall_seconds": sum(u.run.wall_seconds for u in mine),
                   "tokens_per_second": tokens / decode if decode else None,
                   **acceptance_stats(mine), **speedups(mine, base), **_stage_stats(mine, base),
                   "exactness": _exactness(p, mine, presets, utts)}
        summaries.append(summary)
    return {"task": "synthesize", "baseline": baseline, "summaries": summaries,
            "runs": [r.to_dict() for r in runs]}


def _stage_stats(mine, base) -> dict:
    """With audio: seconds and real-time factor of each stage, and the LLM-stage speedup vs the baseline (over
    the utterances both have); the end-to-end speedup is ``speedup_e2e`` (walls are text -> audio)."""
    if not mine or mine[0].run.stages is None:
        return {}
    names = ("llm", "flow", "vocoder")
    audio = sum(u.run.audio_seconds for u in mine)
    seconds = {k: sum(u.run.stages[k] for u in mine) for k in names}
    pairs = [(u, base[u.run.file]) for u in mine if u.run.file in base and base[u.run.file].run.stages]
    llm_mine = sum(u.run.stages["llm"] for u, _ in pairs)
    llm_base = sum(b.run.stages["llm"] for _, b in pairs)
    return {"audio_seconds": audio, "stage_seconds": seconds,
            "rtf": {k: v / audio if audio else None for k, v in {**seconds, "total": sum(seconds.values())}.items()},
            "speedup_llm": llm_base / llm_mine if llm_mine > 0 else None}


def _exactness(p: SynthesisPreset, mine, presets: Sequence[SynthesisPreset], utts) -> dict:
    if p.sampler == "greedy":
        ref = next((q.name for q in presets if q.draft.strategy == "ar" and q.sampler == "greedy" and q.model == p.model
                    and q.name != p.name), None)
        if ref is None:
            return {"kind": "greedy: identical tokens vs AR", "reference": None, "identical": 0, "compared": 0}
        pairs = [(u, utts.get((ref, u.run.file))) for u in mine]
        same = [u.run.token_ids == r.run.token_ids for u, r in pairs if r is not None]
        return {"kind": "greedy: identical tokens vs AR", "reference": ref, "identical": sum(same),
                "compared": len(same)}
    return {"kind": "sampling: same seed, identical across repeats", "reference": p.name,
            "identical": sum(u.stable for u in mine), "compared": len(mine)}


def _x(value: float | None, fmt: str = "{:.2f}x") -> str:
    return "-" if value is None else fmt.format(value)


def summary_lines(report: dict) -> list[str]:
    """One line per preset for stderr."""
    lines = []
    for s in report["summaries"]:
        e = s["exactness"]
        tps = _x(s["tokens_per_second"], "{:.1f}")
        acc = _x(s["acceptance_micro"], "{:.2f}")
        audio = ""
        if "rtf" in s:
            r = s["rtf"]
            audio = (f"  llm {_x(s['speedup_llm'])}  rtf llm {r['llm']:.3f} flow {r['flow']:.3f} vocoder "
                     f"{r['vocoder']:.3f} total {r['total']:.3f}")
        lines.append(f"{s['system']:24s} {tps:>8s} tok/s  tau {acc:>5s}  speedup {_x(s['speedup_e2e']):>6s}{audio}"
                     f"  exact {e['identical']}/{e['compared']} ({e['kind']})")
    return lines


def write_synthesis_report(report: dict, out: Path) -> list[Path]:
    """``report.json`` and a short ``report.md`` table in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "report.json", out / "report.md"
    js.write_text(json.dumps(report, indent=1))
    audio = any("rtf" in s for s in report["summaries"])
    extra = " LLM-stage speedup | RTF llm / flow / vocoder / total |" if audio else ""
    rows = ["| preset | sampler | tok/s | tau | per-position acceptance | speedup vs "
            f"{report['baseline']}{' (text to audio)' if audio else ''} |{extra} exactness |",
            "|---|---|---|---|---|---|" + "---|" * (2 if audio else 0) + "---|"]
    for s in report["summaries"]:
        e = s["exactness"]
        rates = ", ".join(f"{r:.2f}" for r in s["position_rates"]) or "-"
        cells = [s["system"], s["sampler"], _x(s["tokens_per_second"], "{:.1f}"), _x(s["acceptance_micro"], "{:.2f}"),
                 rates, _x(s["speedup_e2e"])]
        if audio:
            r = s.get("rtf") or {}
            cells += [_x(s.get("speedup_llm")),
                      " / ".join(_x(r.get(k), "{:.3f}") for k in ("llm", "flow", "vocoder", "total"))]
        rows.append("| " + " | ".join(cells) + f" | {e['identical']}/{e['compared']} {e['kind']} |")
    note = (f"Flow in {', '.join(report['audio_dtype'])}, vocoder in {', '.join(report['vocoder_dtype'])}.\n\n"
            if report.get("audio_dtype") else "")
    md.write_text("# specli bench: synthesis\n\n" + note + "\n".join(rows) + "\n")
    return [js, md]
