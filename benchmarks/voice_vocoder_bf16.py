"""HiFi-GAN in float32 vs bfloat16 on the SAME mels: transparency (round-trip WER / CER by the bundled whisper-base,
log-mel L1 of the re-analysed audio) and speed (vocoder real-time factor at 1 and 2 threads, interleaved).

Two mel sources for the first ``--sentences`` held-out sentences of the voice corpus:

- ``piper``: jik876's log-mel of piper's own clip (what the vocoder was made for: copy synthesis);
- ``e2e``: the shipped pipeline's mel: the voice's LM tokens (greedy default preset, as ``voice_flow_sweep.py``'s
  ``e2e`` tokens) through the voice's flow at its own settings, in float32.

Each mel is vocoded in float32 and under bf16 autocast (the vocoder's bf16 stage path, as ``Vocalizer.compute``
runs it); the audio is written under ``--work`` and read back by whisper-base with ``voice_flow_sweep.py``'s
transcripts and scores (the same WER path as the voice reports). The WER noise is the 95% interval of a paired
bootstrap over sentences of WER(bf16) - WER(fp32); the mel distance is the mean |log-mel(bf16 audio) -
log-mel(fp32 audio)|, beside the vocoder's own round-trip error |log-mel(fp32 audio) - input mel| for scale.

``--part speed``: the first ``--speed-sentences`` piper mels, every utterance at each thread count through both
dtypes in turn (A/B interleaved per utterance, thread counts too), best of ``--repeat`` after a warm-up at the
same length: the warm speed, without the ~1 s oneDNN spends on each new input length in bf16 (what a run of
sentences pays: the vocoder's length buckets, README's twenty-second-session section). Not a test:

    python benchmarks/voice_vocoder_bf16.py --part wer --sentences 100 --threads 1 --work /tmp/vocoder/work \\
        --out docs/benchmarks/voice/vocoder-bf16
    python benchmarks/voice_vocoder_bf16.py --part speed --speed-sentences 16 --repeat 2 \\
        --out docs/benchmarks/voice/vocoder-bf16
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from voice_flow_sweep import lm_tokens, piper_mel, scores, transcripts, true_tokens  # noqa: E402
from voice_roundtrip import heldout  # noqa: E402

from specli.bench.runner import machine_info  # noqa: E402
from specli.bench.wer import ErrorCounts, error_counts, paired_wer_diff  # noqa: E402
from specli.core.device import cpu_native_bf16  # noqa: E402
from specli.models.cosyvoice.lm import resolve_cosyvoice  # noqa: E402
from specli.tts.acoustic.pipeline import Vocalizer, VoicePrompt  # noqa: E402

DTYPES = ("float32", "bfloat16")


def compute(dtype: str) -> contextlib.AbstractContextManager:
    """The vocoder's compute context: bf16 autocast as ``Vocalizer.compute`` runs it, or nothing."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else contextlib.nullcontext()


def vocode(vocalizer: Vocalizer, mel: torch.Tensor, dtype: str) -> np.ndarray:
    """Audio of ``mel [80, T]`` in ``dtype``."""
    with compute(dtype):
        return vocalizer.vocoder.vocode(mel[None])[0].float().numpy()


def source_mels(source: str, vocalizer: Vocalizer, clips, args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """The mels ``[80, T]`` of one source, cached in ``--work`` (the flow's are the slow part)."""
    cache = args.work / f"mels-{source}.pt"
    mels = torch.load(cache) if cache.is_file() else {}
    todo = [(cid, text) for cid, text in clips if cid not in mels]
    if todo and source == "piper":
        mels.update({cid: piper_mel(args.corpus, cid, vocalizer) for cid, _ in todo})
    elif todo:
        tokens = lm_tokens(args.voice, clips, args.work, args.threads, args.seed)
        mels.update({cid: vocalizer.mel(tokens[cid], VoicePrompt.none())[0] for cid, _ in todo})
    if todo:
        torch.save(mels, cache)
    return {cid: mels[cid] for cid, _ in clips}


def per_sentence(clips, got: dict[str, str]) -> list[ErrorCounts]:
    return [error_counts(ref, got.get(cid, ""), "en") for cid, ref in clips]


def log_mel_l1(vocalizer: Vocalizer, audio: np.ndarray, ref: torch.Tensor) -> float:
    mel = vocalizer.vocoder.mel(audio)[0]
    n = min(mel.shape[1], ref.shape[1])
    return float((mel[:, :n] - ref[:, :n]).abs().mean())


def wer_part(vocalizer: Vocalizer, clips, lengths: dict[str, int], args: argparse.Namespace) -> dict:
    out = {}
    for source in ("piper", "e2e"):
        mels = source_mels(source, vocalizer, clips, args)
        got, l1_dtype, l1_input, snr = {}, [], [], []
        for dtype in DTYPES:
            folder = args.work / f"{source}-{dtype}"
            folder.mkdir(parents=True, exist_ok=True)
            for cid, _ in clips:
                if not (folder / f"{cid}.wav").is_file():
                    sf.write(folder / f"{cid}.wav", vocode(vocalizer, mels[cid], dtype), vocalizer.vocoder.sample_rate)
            got[dtype] = transcripts(folder, args.threads)
            print(source, dtype, "read back", file=sys.stderr, flush=True)
        for cid, _ in clips:
            a32 = sf.read(args.work / f"{source}-float32" / f"{cid}.wav", dtype="float32")[0]
            a16 = sf.read(args.work / f"{source}-bfloat16" / f"{cid}.wav", dtype="float32")[0]
            ref32 = vocalizer.vocoder.mel(a32)[0]
            l1_dtype.append(log_mel_l1(vocalizer, a16, ref32))
            l1_input.append(log_mel_l1(vocalizer, a32, mels[cid]))
            snr.append(10 * np.log10(np.mean(a32**2) / np.mean((a16 - a32) ** 2)))
        out[source] = {
            **{dtype: scores(clips, got[dtype], lengths) for dtype in DTYPES},
            "bf16_minus_fp32": paired_wer_diff(per_sentence(clips, got["float32"]),
                                               per_sentence(clips, got["bfloat16"])),
            "log_mel_l1_bf16_vs_fp32_audio": round(float(np.mean(l1_dtype)), 4),
            "log_mel_l1_bf16_vs_fp32_audio_max": round(float(np.max(l1_dtype)), 4),
            "log_mel_l1_fp32_audio_vs_input_mel": round(float(np.mean(l1_input)), 4),
            "waveform_snr_db_bf16_vs_fp32": round(float(np.mean(snr)), 1),
            "transcripts_differ": sum(got["float32"].get(c) != got["bfloat16"].get(c) for c, _ in clips)}
        print(source, json.dumps(out[source]), file=sys.stderr, flush=True)
    return out


def speed_part(vocalizer: Vocalizer, clips, args: argparse.Namespace) -> dict:
    """Best-of-``repeat`` vocoder seconds per utterance, thread count and dtype, all interleaved per utterance."""
    mels = [piper_mel(args.corpus, cid, vocalizer) for cid, _ in clips[: args.speed_sentences]]
    seconds = sum(m.shape[1] for m in mels) * vocalizer.vocoder.cfg.hop_size / vocalizer.vocoder.sample_rate
    keys = [(th, dt) for th in (1, 2) for dt in DTYPES]
    best = {k: [float("inf")] * len(mels) for k in keys}
    for i, mel in enumerate(mels):
        for rep in range(args.repeat + 1):  # the first round warms up
            for th, dt in keys:
                torch.set_num_threads(th)
                t0 = time.perf_counter()
                vocode(vocalizer, mel, dt)
                if rep:
                    best[th, dt][i] = min(best[th, dt][i], time.perf_counter() - t0)
        print(f"utterance {i}: " + " ".join(f"{th}t/{dt}={best[th, dt][i]:.3f}" for th, dt in keys),
              file=sys.stderr, flush=True)
    out = {"audio_seconds": round(seconds, 2), "utterances": len(mels), "repeat": args.repeat}
    for th in (1, 2):
        row = {dt: {"seconds": round(sum(best[th, dt]), 3), "rtf": round(sum(best[th, dt]) / seconds, 4)}
               for dt in DTYPES}
        ratios = sorted(a / b for a, b in zip(best[th, "float32"], best[th, "bfloat16"]))
        row["bf16_speedup"] = round(row["float32"]["seconds"] / row["bfloat16"]["seconds"], 3)
        row["median_utterance_speedup"] = round(ratios[len(ratios) // 2], 3)
        row["min_utterance_speedup"] = round(ratios[0], 3)
        out[f"{th}_threads"] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("wer", "speed"), required=True)
    ap.add_argument("--voice", default="specli-en", help="a shipped voice's name or a voice's model directory")
    ap.add_argument("--corpus", type=Path, default=Path("/work/voice/data"),
                    help="the voice corpus (<work>/data of python -m scripts.voice corpus)")
    ap.add_argument("--tokens", type=Path, default=Path("data/voice/tokens/tokens.npz"))
    ap.add_argument("--sentences", type=int, default=100)
    ap.add_argument("--speed-sentences", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=2, help="measured passes (best kept) after one warm-up")
    ap.add_argument("--threads", type=int, default=1, help="threads of the wer part (flow, vocoder, whisper)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/vocoder/work"), help="tokens, mels, audio (kept)")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks/voice/vocoder-bf16"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    clips = heldout(args.corpus, args.sentences)
    vocalizer = Vocalizer.from_dir(resolve_cosyvoice(args.voice), "cosyvoice3")
    rep = {"voice": args.voice, "machine": machine_info(args.threads), "native_bf16": cpu_native_bf16(),
           "command": "python benchmarks/voice_vocoder_bf16.py " + " ".join(sys.argv[1:])}
    if args.part == "wer":
        lengths = {cid: len(ids) for cid, ids in true_tokens(args.tokens, clips).items()}
        rep.update(sentences=len(clips), sources=wer_part(vocalizer, clips, lengths, args))
    else:
        rep.update(speed_part(vocalizer, clips, args))
    path = args.out / f"report-{args.part}.json"
    path.write_text(json.dumps(rep, indent=1) + "\n")
    print(json.dumps(rep, indent=1))


if __name__ == "__main__":
    main()
