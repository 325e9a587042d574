"""Speculative decoding on the tiny audio-LLM targets with drafters trained by `specli distill`.

For Qwen2-Audio and the Qwen3-Omni thinker (tiny random configs of the transformers classes, the test suite's
fixtures, written as local model directories) this script labels the training clips on-policy with
`specli distill data`, trains an EAGLE-3 and a DFlash drafter with `specli distill train` (the family's aux
layers scaled to the tiny depth), then runs `specli bench` on held-out clips: AR, EAGLE-3, DFlash and the n-gram
pool (Qwen3-ASR: AR and pool; it has no trained-drafter presets). On the tiny MoE thinker it also runs the
EAGLE-3 drafter at maximum draft lengths 1, 2, 4 and 7 (preset TOML files beside the report) for the distinct
experts touched per verify step against k, and with the goodput draft length (up to 7), which sizes each draft
by the measured costs and an MoE-aware prior (verifying more tokens reads more experts). Each bench report (acceptance by draft position, draft and verify
seconds, experts) lands in OUT/<family>/ and OUT/README.md sums them up.

Every step is skipped when its output exists (labels and drafters resume), so `--prepare-only` may run first
(e.g. beside other work) and the timed bench later on a quiet machine. Tiny random targets are not speech
models: their "transcripts" are whatever the random weights emit, so the numbers describe the machinery
(how much a drafter trained on a target's own outputs accepts, what a verify step costs), not real speech.

    python scripts/make_distill_audio.py --out /work/distill/audio --recordings-only --languages en
    python benchmarks/audio_llm_tiny.py --train /work/distill/audio/train/asterisk-en \\
        --heldout samples/en /work/distill/audio/heldout-in/asterisk-en --work /tmp/alm-tiny \\
        --out docs/benchmarks/audio-llm
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tiny model writers are the test suite's fixtures

FAMILIES = {  # family -> (fixture module, writer, trained drafters)
    "qwen2-audio": ("qwen2_audio_fixtures", "write_tiny_qwen2_audio", ("eagle3", "dflash")),
    "qwen3-omni": ("qwen3_omni_fixtures", "write_tiny_qwen3_omni", ("eagle3", "dflash")),
    "qwen3-asr": ("qwen3_asr_fixtures", "write_tiny_qwen3_asr", ()),
}
EXPERT_DRAFTS = (1, 2, 4, 7)  # maximum draft lengths of the MoE experts-vs-k runs


def specli(args: list, env: dict, log: Path) -> None:
    """Run `python -m specli ARGS`, appending its output to ``log``; a failure stops the script."""
    cmd = [sys.executable, "-m", "specli", *map(str, args)]
    with log.open("a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, check=False).returncode
    if rc:
        sys.exit(f"failed ({rc}): {' '.join(cmd)}; see {log}")


def prepare(family: str, models: Path, work: Path, args: argparse.Namespace, env: dict) -> None:
    """The tiny model directory, on-policy labels of the training clips, and the trained drafters."""
    module, writer, drafters = FAMILIES[family]
    model_dir = models / family
    if not (model_dir / "config.json").exists():
        getattr(__import__(module), writer)(model_dir)
    if not drafters:
        return
    data = work / "data" / family
    log = work / f"{family}.log"
    specli(["distill", "data", *args.train, "--preset", f"{family}-ar", "--model", model_dir,
           "--language", "en", "--out", data, "-q"], env, log)  # resumes: labelled files are skipped
    for kind in drafters:
        out = models / f"{family}-{kind}"
        if not (out / "config.json").exists():
            specli(["distill", "train", data, "--preset", f"{family}-ar", "--model", model_dir, "--drafter", kind,
                    "--epochs", args.epochs, "--steps", args.steps, "--batch", args.batch, "--lr", args.lr,
                    "--out", out, "-q"], env, log)


def expert_presets(out: Path) -> list[Path]:
    """qwen3-omni-eagle3 at each maximum draft length of EXPERT_DRAFTS and with the goodput draft length, as preset
    TOML files."""
    base = (ROOT / "specli" / "presets" / "qwen3-omni-eagle3.toml").read_text().splitlines()

    def write(name: str, k: int, *extra: str) -> Path:
        path = out / f"qwen3-omni-eagle3-{name}.toml"
        lines = [f"max_draft = {k}" if ln.startswith("max_draft") else ln for ln in base]
        path.write_text("\n".join([*lines, *extra]) + "\n")
        return path

    # the last: the draft length sized by goodput (MoE-aware cost prior), up to the longest fixed draft
    return [*(write(f"k{k}", k) for k in EXPERT_DRAFTS),
            write("goodput", EXPERT_DRAFTS[-1], 'draft_length = "goodput"')]


def bench(family: str, out: Path, work: Path, args: argparse.Namespace, env: dict) -> None:
    drafters = FAMILIES[family][2]
    presets = [f"{family}-ar", *(f"{family}-{k}" for k in drafters), f"{family}-pool"]
    dest = out / family
    if (dest / "report.json").exists():  # measured already (delete the folder to measure again)
        return
    dest.mkdir(parents=True, exist_ok=True)
    if family == "qwen3-omni":
        presets += [str(p) for p in expert_presets(dest)]
    specli(["bench", *args.heldout, "--presets", ",".join(presets), "--repeat", args.repeat, "--threads",
            args.threads, "--language", "en", "--no-plots", "--out", dest, "-q"], env, work / f"{family}.log")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", nargs="+", type=Path, required=True, help="training clips (files or folders)")
    ap.add_argument("--heldout", nargs="+", type=Path, required=True, help="held-out clips (files or folders)")
    ap.add_argument("--work", type=Path, required=True, help="tiny models, labels, drafters, logs (resumable)")
    ap.add_argument("--out", type=Path, required=True, help="bench reports and README.md")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--epochs", type=int, default=10, help="drafter training passes over the labels")
    ap.add_argument("--steps", type=int, default=0, help="drafter training steps at most (0: the epochs)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prepare-only", action="store_true", help="models, labels and drafters; no bench")
    args = ap.parse_args()
    models = args.work / "models"
    models.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"SPECLI_MODELS_DIR": str(models), "PYTHONPATH": str(ROOT)}
    families = args.families.split(",")
    for family in families:
        prepare(family, models, args.work, args, env)
    if args.prepare_only:
        return
    for family in families:
        bench(family, args.out, args.work, args, env)
    summarize(args.out, families)


def summarize(out: Path, families: list[str]) -> None:
    """OUT/README.md: each family's acceptance, per-position rates, draft / verify seconds and experts."""
    lines = ["# Audio-LLM targets: tiny random models, drafters trained by `specli distill`", "",
             "Generated by `benchmarks/audio_llm_tiny.py` (its docstring says how to reproduce); each family's "
             "full `specli bench` report is in its folder.", ""]
    for family in families:
        report = json.loads((out / family / "report.json").read_text())
        lines += [f"## {family}", "", "| system | tau | decode speedup | draft s | verify s | acceptance by "
                  "position | experts / verify step |", "|---|---|---|---|---|---|---|"]
        for s in report["summaries"]:
            pos = ", ".join(f"{float(v):.2f}" for v in (s.get("position_rates") or [])[:8]) or "-"
            experts = s.get("experts_per_step")
            lines.append(f"| {s['system']} | {s.get('acceptance_micro') or 1:.2f} | {s['speedup_decode'] or 1:.2f}x "
                         f"| {s['draft_seconds']:.3f} | {s['verify_seconds']:.3f} | {pos} | "
                         f"{'-' if experts is None else f'{experts:.1f}'} |")
        lines.append("")
    (out / "README.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
