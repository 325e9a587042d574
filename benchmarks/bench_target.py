"""Lean Whisper target vs transformers on the same clip: encoder time and per-token decoder step.

Both run in this one process, interleaved, on the same features and the same greedy tokens, so the
printed ratios are fair on a noisy machine. Run:

    python benchmarks/bench_target.py --model whisper-base --threads 2
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers

from specli.io.audio import load_audio, window_features
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob
from specli.models.whisper.compiled import compile_encoder
from specli.models.whisper.loader import load_whisper
from specli.models.whisper.rules import WhisperLogitRules

DEFAULT_CLIP = Path(__file__).resolve().parent.parent / "samples/en/sense_and_sensibility_01_austen_64kb-0870.wav"


def _time(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _hf_step_times(hf, enc, prompt: list[int], tokens: list[int]) -> list[float]:
    """Per-token decoder forwards of transformers with its own cache (past_key_values)."""
    with torch.no_grad():
        out = hf.model.decoder(input_ids=torch.tensor([prompt]), encoder_hidden_states=enc, use_cache=True)
        hf.proj_out(out.last_hidden_state)
        past, times = out.cache, []
        for tok in tokens:
            t0 = time.perf_counter()
            out = hf.model.decoder(input_ids=torch.tensor([[tok]]), encoder_hidden_states=enc,
                                   cache=past, use_cache=True)
            hf.proj_out(out.last_hidden_state[:, -1])
            times.append(time.perf_counter() - t0)
            past = out.cache
    return times


def _lean_step_times(target, enc, prompt: list[int], tokens: list[int]) -> list[float]:
    state = target.start(enc)
    target.score(state, torch.tensor([prompt]))
    times = []
    for tok in tokens:
        t0 = time.perf_counter()
        target.score(state, torch.tensor([[tok]]))
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="whisper-base")
    ap.add_argument("--clip", type=Path, default=DEFAULT_CLIP)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="also time the torch.compile'd encoder (+ compile time)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_whisper(args.model)
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(model.path, attn_implementation="sdpa").eval()
    sp, target = model.special, model.target
    feats = window_features(load_audio(args.clip), target.dims.n_mels)
    prompt = sp.prompt("en")
    enc = target.encode(feats)
    job = DecodeJob(tuple(prompt), WhisperLogitRules.for_model(sp), sp.eot, 224)
    tokens = greedy_decode(target, target.start(enc), job).tokens
    compiled = compile_encoder(target) if args.compile else None
    lean_enc, hf_enc, lean_step, hf_step, comp_enc = [], [], [], [], []
    for _ in range(args.repeats):  # interleaved: A B A B ...
        lean_enc += _time(lambda: target.encode(feats), 1)
        if compiled is not None:
            comp_enc += _time(lambda: compiled.fn(feats), 1)
        with torch.no_grad():
            hf_enc += _time(lambda: hf.model.encoder(feats), 1)
        lean_step += _lean_step_times(target, enc, prompt, tokens)
        hf_step += _hf_step_times(hf, enc, prompt, tokens)
    med = statistics.median
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, threads {args.threads}")
    print(f"model {args.model}, clip {args.clip.name}, {len(tokens)} tokens, {args.repeats} interleaved repeats")
    print("| | lean (ms) | transformers (ms) | transformers / lean |")
    print("|---|---|---|---|")
    print(f"| encoder, one 30-s window | {med(lean_enc) * 1e3:.1f} | {med(hf_enc) * 1e3:.1f} | "
          f"{med(hf_enc) / med(lean_enc):.2f}x |")
    if compiled is not None:
        print(f"| encoder, torch.compile (compiled in {compiled.compile_seconds:.1f} s) | {med(comp_enc) * 1e3:.1f} | "
              f"{med(hf_enc) * 1e3:.1f} | {med(hf_enc) / med(comp_enc):.2f}x |")
    print(f"| decoder step, one token | {med(lean_step) * 1e3:.2f} | {med(hf_step) * 1e3:.2f} | "
          f"{med(hf_step) / med(lean_step):.2f}x |")


if __name__ == "__main__":
    main()
