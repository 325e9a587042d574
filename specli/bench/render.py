"""Write a bench report: report.json, report.md and (when matplotlib is importable) PNG plots."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path

from specli.io.atomic import write_atomic


def fmt(value: object, digits: int = 2) -> str:
    """Table cell: '-' for None, fixed digits for floats."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def times(value: float | None) -> str:
    """Speedup cell: '2.05x', or '-' for None."""
    return "-" if value is None else f"{value:.2f}x"


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in row) + " |" for row in rows]
    return lines + [""]


def machine_lines(report: dict) -> list[str]:
    """Date, command, machine, load and versions: the first lines of a report's header."""
    m, r = report["machine"], report["run"]
    v = ", ".join(f"{k} {val}" for k, val in m["versions"].items() if val)
    return [
        f"- date: {r['date']}; elapsed {fmt(r['elapsed_seconds'], 1)} s",
        f"- command: `{r['command']}`",
        f"- machine: {m['cpu']}{_cpu_detail(m)} ({m['cpu_count']} cores), {m['threads']} threads; {m['platform']}",
        f"- load average (1/5/15 min) before: {m['loadavg_before']}, after: {m['loadavg_after']}",
        f"- versions: {v}",
        *_process_lines(m.get("processes")),
    ]


def _cpu_detail(m: dict) -> str:
    """`` (family 26 model 2; avx2, avx512_bf16)``: reports made before these fields have none."""
    parts = [p for p in (m.get("cpu_id"), ", ".join(m.get("cpu_features") or ())) if p]
    return f" ({'; '.join(parts)})" if parts else ""


def _process_lines(processes: dict | None) -> list[str]:
    """Where the peers ran: each in its own worker process (reports made before that have no such block)."""
    if not processes or not processes.get("peers"):
        return []
    peers = ", ".join(f"{name} pid {p['pid']} ({p['torch_threads']} torch threads)"
                      for name, p in processes["peers"].items())
    return [f"- processes: presets in pid {processes['pid']}; each peer in its own worker process: {peers}"]


def _header(report: dict) -> list[str]:
    r = report["run"]
    opts = r["options"]
    return [
        "# specli bench report", "", *machine_lines(report),
        f"- inputs: {len(r['inputs'])} files; repeats: {opts['repeat']} (warm-up: {opts['warmup']}); "
        f"interleaved per file; per file, times come from the repeat with the median wall time; "
        f"totals are sums over files",
        f"- task: {opts.get('task', 'transcribe')}; language: {opts.get('language') or 'detected'}",
        f"- baseline: `{report['baseline']}`; timestamp tokens: {_timestamps(opts.get('timestamps'))}; "
        f"references: {r['references'] or 'none'} ({r['references_found']} found)",
        *(["- peers: same weights, greedy, one temperature; clips over 30 s long-form (sequential 30-s windows, "
           "each prompted with the previous text), as specli decodes them"]
          if any(s["kind"] == "peer" for s in report["systems"]) else []),
        "",
    ]


def _timestamps(asked: bool | None) -> str:
    if asked is None:
        return "on clips over 30 s only (long-form seeking), for presets and peers"
    return "always" if asked else "never (long clips in fixed 30-s windows)"


def _summary_tables(report: dict) -> list[str]:
    s = report["summaries"]
    time_rows = [[x["system"], x["kind"], x.get("dtype") or "-", x["utterances"], fmt(x.get("skipped", 0)),
                  fmt(x["audio_seconds"]), fmt(x["wall_seconds"], 3),
                  fmt(x["rtf"], 3), fmt(x["encode_seconds"], 3), fmt(x["decode_seconds"], 3),
                  fmt(x["draft_seconds"], 3), fmt(x["verify_seconds"], 3), fmt(x["other_seconds"], 3)] for x in s]
    spec_rows = [[x["system"], fmt(x["tokens"]), fmt(x["target_forwards"]), fmt(x.get("acceptance_micro")),
                  fmt(x.get("acceptance_macro")), fmt(x.get("position0_rate")), times(x["speedup_decode"]),
                  times(x["speedup_e2e"]), times(x["speedup_e2e_median_utt"])] for x in s]
    return [
        "## Time per system", "",
        *table(["system", "kind", "dtype", "utts", "skipped", "audio s", "wall s", "RTF", "encoder s", "decode s",
                "draft s", "verify s", "other s"], time_rows),
        "`decode s` is the whole decode loop (draft + verify + prefill / plain greedy steps); "
        "`other s` = wall - encoder - decode (language detection, segmenting, Python glue).", "",
        "## Acceptance and speedup vs the baseline", "",
        *table(["system", "tokens", "target fwd", "tau micro", "tau macro", "pos-0 acc", "decode speedup",
                "e2e speedup", "median utt e2e"], spec_rows),
        "tau micro = total tokens / total verify steps; tau macro = mean of per-utterance tau; "
        "plain greedy has tau = 1. Speedups: baseline seconds / system seconds, over the same files.", "",
        *_experts_table(report),
    ]


def _experts_table(report: dict) -> list[str]:
    """MoE targets: distinct experts touched per verify step (and by tokens verified); nothing for dense ones."""
    rows = [[x["system"], fmt(x["experts_per_step"], 1),
             ", ".join(f"{n}: {fmt(v, 1)}" for n, v in x["experts_by_tokens"].items())]
            for x in report["summaries"] if x.get("experts_per_step") is not None]
    if not rows:
        return []
    return ["## MoE experts touched", "", *table(["system", "experts / verify step", "by tokens verified"], rows),
            "Distinct experts a target forward after the prefill reads, summed over the MoE layers: verifying "
            "k + 1 tokens touches up to top_k x (k + 1) experts a layer (weight traffic grows with the draft).", ""]


def _position_table(report: dict) -> list[str]:
    spec = [x for x in report["summaries"] if x.get("position_rates")]
    if not spec:
        return []
    depth = max(len(x["position_rates"]) for x in spec)
    rows = [[x["system"], *[f"{r:.2f} ({n})" for r, n in zip(x["position_rates"], x["position_attempts"])],
             *["-"] * (depth - len(x["position_rates"]))] for x in spec]
    return ["## Acceptance by draft position", "",
            "Rate at depth d = accepted at d / verify steps whose draft reached d (attempts in brackets).", "",
            *table(["system", *[f"d{d + 1}" for d in range(depth)]], rows)]


def _lengths_table(report: dict) -> list[str]:
    spec = [x for x in report["summaries"] if any(x.get("draft_lengths", [])[1:])]
    if not spec:
        return []
    depth = max(len(x["draft_lengths"]) for x in spec)
    rows = [[x["system"], *[str(n) for n in x["draft_lengths"]], *["-"] * (depth - len(x["draft_lengths"]))]
            for x in spec]
    return ["## Draft lengths chosen", "",
            "Verify steps by the number of tokens drafted for them (k = 0: plain decoding steps).", "",
            *table(["system", *[f"k={k}" for k in range(depth)]], rows), ""]


def _bins_table(report: dict) -> list[str]:
    rows = [[b["bin"], b["system"], b["utterances"], fmt(b["audio_seconds"]), times(b["speedup_decode"]),
             times(b["speedup_e2e"]), fmt(b["acceptance_micro"])] for b in report["length_bins"]]
    return ["## By utterance length", "",
            *table(["length", "system", "utts", "audio s", "decode speedup", "e2e speedup", "tau micro"], rows)]


def _pairwise_table(report: dict) -> list[str]:
    pw = report["pairwise_speedup"]
    names = list(pw)
    rows = [[a, *[times(pw[a][b]) for b in names]] for a in names]
    return ["## Pairwise end-to-end speedup", "",
            "Row system vs column system: column wall seconds / row wall seconds, over the files both ran.", "",
            *table(["system", *names], rows)]


def _quality_tables(report: dict) -> list[str]:
    rows, wer_rows = [], []
    for x in report["summaries"]:
        ll = x["lossless"]
        if ll["reference"] is not None:
            how = "tokens" if x["kind"] == "preset" else "normalised text"
            rows.append([x["system"], f"`{ll['reference']}`", how, f"{ll['identical']}/{ll['compared']}",
                         ", ".join(Path(f).name for f in ll["differing"]) or "-"])
        if x["errors"]:
            e = x["errors"]
            wer_rows.append([x["system"], e["utterances"], f"{100 * e['wer']:.1f}%", f"{100 * e['cer']:.1f}%"])
    out = ["## Losslessness", "", *table(["system", "vs", "compared by", "identical", "differing"], rows)]
    unstable = [f"{x['system']}: {', '.join(x['unstable'])}" for x in report["summaries"] if x["unstable"]]
    if unstable:
        out += ["Outputs that changed between repeats: " + "; ".join(unstable), ""]
    if wer_rows:
        out += ["## Error rates against references", "",
                "Whisper's text normalisers (`whisper-normalizer`: the English one for English, the basic one "
                "otherwise), then `jiwer`; corpus rates = summed edits / summed reference words (characters).", "",
                *table(["system", "utts", "WER", "CER"], wer_rows)]
    if report["run"]["input_errors"]:
        out += ["## Inputs that could not be read", "", *[f"- {e}" for e in report["run"]["input_errors"]], ""]
    return out


def _skipped_table(report: dict) -> list[str]:
    rows = [[k["system"], k["file"], fmt(k["audio_seconds"], 1), ", ".join(str(r + 1) for r in k["repeats"]),
             k["reason"].replace("|", "/")] for k in report.get("skipped", [])]
    if not rows:
        return []
    return ["## Skipped runs", "",
            "These runs did not happen, so the systems' totals above leave these files out.", "",
            *table(["system", "file", "audio s", "passes", "skipped: reason"], rows)]


def markdown(report: dict, plots: Sequence[Path] = ()) -> str:
    """report.md."""
    lines = (_header(report) + _skipped_table(report) + _summary_tables(report) + _position_table(report)
             + _lengths_table(report))
    lines += _bins_table(report)
    lines += _pairwise_table(report) + _quality_tables(report)
    if plots:
        lines += ["## Plots", "", *[f"![{p.stem}]({p.name})" for p in plots], ""]
    return "\n".join(lines)


def plot(report: dict, out_dir: Path) -> list[Path]:
    """speedup_by_length.png and acceptance_by_position.png; nothing without matplotlib."""
    if importlib.util.find_spec("matplotlib") is None:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    labels = report["bins"]["labels"]
    systems = [x["system"] for x in report["summaries"] if x["system"] != report["baseline"]]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / max(1, len(systems))
    for k, name in enumerate(systems):
        vals = {b["bin"]: b["speedup_e2e"] for b in report["length_bins"] if b["system"] == name}
        xs = [i + k * width for i, lab in enumerate(labels) if vals.get(lab) is not None]
        ax.bar(xs, [vals[lab] for lab in labels if vals.get(lab) is not None], width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], labels)
    ax.set(ylabel=f"end-to-end speedup vs {report['baseline']}", xlabel="utterance length")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    paths.append(_save(fig, out_dir / "speedup_by_length.png"))
    spec = [x for x in report["summaries"] if x.get("position_rates")]
    if spec:
        fig, ax = plt.subplots(figsize=(10, 4.5))
        for x in spec:
            rates = x["position_rates"]
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=x["system"])
        ax.set(xlabel="draft position (depth)", ylabel="acceptance rate (given reached)", ylim=(0, 1.05))
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        paths.append(_save(fig, out_dir / "acceptance_by_position.png"))
    plt.close("all")
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def write_report(report: dict, out_dir: Path, plots: bool = True) -> list[Path]:
    """Write report.json, the plots and report.md into ``out_dir``; returns the written paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = plot(report, out_dir) if plots else []
    write_atomic(out_dir / "report.json", json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    write_atomic(out_dir / "report.md", markdown(report, pngs))
    return [out_dir / "report.json", out_dir / "report.md", *pngs]
