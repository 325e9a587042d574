"""The flow and vocoder stages in float32 vs bfloat16 (``--audio-dtype``) on specli-en, one process, interleaved.

The voice's LM speaks ``--sentences`` held-out sentences once (greedy, the preset's dtype); then each pass renders
every utterance with the float32 and the bfloat16 :class:`~specli.tts.acoustic.pipeline.Vocalizer` in turn (the
same tokens, the same generator seed), timing the flow and the vocoder; the best of ``--repeat`` passes per
utterance and dtype is kept. Reports the real-time factor of each stage and dtype, the speedups, how far bf16's
mel and audio are from float32's (mean |diff| of the log-mel), and the machine (CPU model, AMX / AVX-512 BF16).
The round-trip WER of both dtypes is ``benchmarks/voice_roundtrip.py --variant "fp32=--audio-dtype float32"``.

    python benchmarks/bench_audio_dtype.py --sentences 20 --threads 2 --repeat 2 --out docs/benchmarks/synthesis-bf16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # scripts.voice, the voice's build

from scripts.voice.corpus.texts import sentences  # noqa: E402  (the corpus's held-out sentences)

from specli.bench.runner import machine_info  # noqa: E402
from specli.core.device import cpu_native_bf16  # noqa: E402
from specli.models.cosyvoice.lm import load_cosyvoice  # noqa: E402
from specli.presets.synthesis import load_synthesis_preset  # noqa: E402
from specli.tts.acoustic.pipeline import Vocalizer, VoicePrompt  # noqa: E402
from specli.tts.synthesis import PresetOverrides, SynthesisRequest, build_synthesizer  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def machine() -> dict:
    """The bench reports' machine block (CPU name, family / model, features, versions) and native bf16."""
    m = machine_info(torch.get_num_threads())
    return {**m, "native_bf16": cpu_native_bf16(), "torch": torch.__version__}


def render(vocalizer: Vocalizer, tokens: list[int]) -> tuple[float, float, np.ndarray, torch.Tensor]:
    """(flow seconds, vocoder seconds, audio, mel) of one utterance."""
    prompt = VoicePrompt.none(80)
    t0 = time.perf_counter()
    mel = vocalizer.mel(tokens, prompt)
    t1 = time.perf_counter()
    with vocalizer.compute():
        audio = vocalizer.vocoder.vocode(mel, torch.Generator().manual_seed(0))[0].float().numpy()
    return t1 - t0, time.perf_counter() - t1, audio, mel


def measure(voices: dict[str, Vocalizer], utterances: list[list[int]], repeat: int) -> dict:
    """Best-of-``repeat`` stage seconds per utterance and dtype, passes interleaved; outputs of the last pass."""
    best = {name: [[float("inf"), float("inf")] for _ in utterances] for name in voices}
    outputs: dict[str, list[tuple[np.ndarray, torch.Tensor]]] = {name: [] for name in voices}
    for rep in range(repeat + 1):  # pass 0 warms up
        for u, tokens in enumerate(utterances):
            for name, vocalizer in voices.items():
                flow, voc, audio, mel = render(vocalizer, tokens)
                if rep:
                    best[name][u] = [min(best[name][u][0], flow), min(best[name][u][1], voc)]
                if rep == repeat:
                    outputs[name].append((audio, mel))
    return {"best": best, "outputs": outputs}


def summarise(voices: dict[str, Vocalizer], got: dict, audio_seconds: float, llm_seconds: float) -> dict:
    out = {}
    heard = {name: [voices["float32"].vocoder.mel(torch.from_numpy(a)) for a, _ in got["outputs"][name]]
             for name in voices}
    for name in voices:
        flow = sum(b[0] for b in got["best"][name])
        voc = sum(b[1] for b in got["best"][name])
        mel_diff = [float((m - m32).abs().mean()) for (_, m), (_, m32) in zip(got["outputs"][name],
                                                                              got["outputs"]["float32"])]
        heard_diff = [float((h - h32).abs().mean()) for h, h32 in zip(heard[name], heard["float32"])]
        out[name] = {"flow_seconds": flow, "vocoder_seconds": voc,
                     "rtf": {"llm": llm_seconds / audio_seconds, "flow": flow / audio_seconds,
                             "vocoder": voc / audio_seconds,
                             "total": (llm_seconds + flow + voc) / audio_seconds},
                     "mel_mean_abs_diff_vs_float32": float(np.mean(mel_diff)),
                     "audio_logmel_mean_abs_diff_vs_float32": float(np.mean(heard_diff))}
    base = out["float32"]
    for name in voices:
        out[name]["speedup"] = {k: base[f"{k}_seconds"] / out[name][f"{k}_seconds"] for k in ("flow", "vocoder")}
        out[name]["speedup"]["acoustic"] = ((base["flow_seconds"] + base["vocoder_seconds"])
                                            / (out[name]["flow_seconds"] + out[name]["vocoder_seconds"]))
    return out


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"# Flow + vocoder in float32 vs bfloat16 on specli-en ({report['utterances']} held-out sentences, "
             f"{report['audio_seconds']:.1f} s of audio)", "",
             f"{m['cpu']} ({m['cpu_id'] or '?'}; {', '.join(m['cpu_features'])}), torch {m['torch']}, "
             f"{m['threads']} threads, one process, dtypes interleaved per utterance, best of {report['repeat']}. "
             f"LLM stage: {report['preset']} ({report['llm_dtype']}), the same tokens for both dtypes.", "",
             "| audio dtype | RTF llm | RTF flow | RTF vocoder | RTF total | flow speedup | vocoder speedup | "
             "flow + vocoder speedup | mel mean abs diff vs fp32 | audio log-mel mean abs diff vs fp32 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in report["dtypes"].items():
        r, x = s["rtf"], s["speedup"]
        lines.append(f"| {name} | {r['llm']:.3f} | {r['flow']:.3f} | {r['vocoder']:.3f} | {r['total']:.3f} | "
                     f"{x['flow']:.2f}x | {x['vocoder']:.2f}x | {x['acoustic']:.2f}x | "
                     f"{s['mel_mean_abs_diff_vs_float32']:.4f} | {s['audio_logmel_mean_abs_diff_vs_float32']:.4f} |")
    lines += ["", f"Reproduce: `{report['command']}`", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--voice", type=Path, default=REPO / "specli" / "voices" / "specli-en")
    ap.add_argument("--sentences", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--preset", default="cosyvoice3-ar")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    preset = load_synthesis_preset(args.preset)
    model = load_cosyvoice(str(args.voice), preset.dtype)
    synth = build_synthesizer(preset, model, PresetOverrides(seed=0))
    voices = {name: Vocalizer.from_dir(args.voice, "cosyvoice3", dtype=dtype) for name, dtype in DTYPES.items()}
    utterances, llm_seconds = [], 0.0
    for sid, text in sentences("heldout")[: args.sentences]:
        t0 = time.perf_counter()
        tokens = synth.synthesize(SynthesisRequest(id=sid, text=text)).tokens
        llm_seconds += time.perf_counter() - t0
        utterances.append(voices["float32"].flow_tokens(tokens))
    audio_seconds = sum(4 * len(t) * 256 / 22050 for t in utterances)
    got = measure(voices, utterances, args.repeat)
    report = {"utterances": len(utterances), "audio_seconds": audio_seconds, "repeat": args.repeat,
              "preset": preset.name, "llm_dtype": str(model.lm.qwen.dtype).removeprefix("torch."),
              "machine": machine(), "dtypes": summarise(voices, got, audio_seconds, llm_seconds),
              "command": "python benchmarks/bench_audio_dtype.py " + " ".join(sys.argv[1:])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "README.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
