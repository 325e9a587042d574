"""HiFi-GAN's convolutions with the leaky ReLU / residual add fused into them as oneDNN post-ops vs separate ops
(``specli.tts.acoustic.hifigan._POINTWISE``), side by side in one process, interleaved, on specli-en's real vocoder and
the mels of held-out sentences (greedy AR speech tokens of the shipped default); the audio must be the same bytes.

    python benchmarks/bench_vocoder_fusion.py --sentences 20 --threads 2 --repeat 3 --out docs/benchmarks/vocoder-fusion
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # scripts.voice, the voice's build

from scripts.voice.corpus.texts import sentences  # noqa: E402  (the corpus's held-out sentences)

import specli.tts.acoustic.hifigan as hifigan  # noqa: E402
from specli.bench.runner import machine_info  # noqa: E402
from specli.presets.synthesis import load_synthesis_preset  # noqa: E402
from specli.tts.acoustic.pipeline import Vocalizer, VoicePrompt  # noqa: E402
from specli.tts.synthesis import SynthesisRequest, load_synthesizer  # noqa: E402


def greedy_tokens(requests: list[SynthesisRequest]) -> list[list[int]]:
    """The shipped default's (specli-en-ar, greedy) speech tokens of the sentences."""
    synth = load_synthesizer(load_synthesis_preset("specli-en-ar"))
    return [list(synth.synthesize(r).tokens) for r in requests]


def vocoder_part(token_lists: list[list[int]], repeat: int) -> dict:
    """Each utterance through both paths in turn, ``repeat`` times after a warm-up (interleaved per utterance, so
    a slow spell of a shared machine hits both): the best wall per utterance and path, summed; and the median
    over utterances of the per-utterance ratio."""
    voc = Vocalizer.from_dir(REPO / "specli" / "voices" / "specli-en", "cosyvoice3")
    prompt = VoicePrompt.none()
    mels = [voc.mel(t, prompt) for t in token_lists]
    vocoder = voc.vocoder
    seconds = sum(m.shape[-1] for m in mels) * vocoder.cfg.hop_size / vocoder.sample_rate
    names = ("fused post-ops", "separate ops")
    best = {name: [float("inf")] * len(mels) for name in names}
    same, fused = True, hifigan._POINTWISE
    try:
        for i, mel in enumerate(mels):
            for rep in range(repeat + 1):  # the first round warms up
                audio = {}
                for name in names:
                    hifigan._POINTWISE = fused and name == "fused post-ops"
                    t0 = time.perf_counter()
                    audio[name] = vocoder.vocode(mel)
                    if rep:
                        best[name][i] = min(best[name][i], time.perf_counter() - t0)
                same = same and torch.equal(audio[names[0]], audio[names[1]])
    finally:
        hifigan._POINTWISE = fused
    rows = {name: {"best_seconds": sum(w), "rtf": sum(w) / seconds} for name, w in best.items()}
    for row in rows.values():
        row["speedup"] = rows["separate ops"]["best_seconds"] / row["best_seconds"]
    ratios = sorted(s / f for s, f in zip(best["separate ops"], best["fused post-ops"]))
    return {"audio_seconds": seconds, "identical_audio": same, "fused_available": fused, "systems": rows,
            "median_utterance_speedup": ratios[len(ratios) // 2]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sentences", type=int, default=20, help="held-out sentences 0..N-1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="measured passes (best kept) after one warm-up")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    requests = [SynthesisRequest(id=sid, text=text) for sid, text in sentences("heldout")[: args.sentences]]
    report = {"machine": machine_info(args.threads), "sentences": len(requests), "repeat": args.repeat,
              "vocoder": vocoder_part(greedy_tokens(requests), args.repeat)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["vocoder"], indent=1))


if __name__ == "__main__":
    main()
