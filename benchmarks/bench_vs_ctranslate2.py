"""specli's AR preset vs CTranslate2 (faster-whisper's engine) on the same weights, side by side.

Measures, interleaved in one process: encoder time per 30-s window, per-token decoder step, and
end-to-end wall time of a whole transcription (specli AR preset vs faster-whisper, beam 1, fp32,
without timestamps, language given). Needs `pip install 'specli[peers]'` (faster-whisper). Run:

    python benchmarks/bench_vs_ctranslate2.py --model whisper-base --threads 2 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from specli.audio import iter_audio_chunks, load_audio, window_features
from specli.engines.decoding import DecodingOptions
from specli.engines.targets.loader import load_whisper
from specli.engines.targets.resolve import BUNDLED, find_package_dir
from specli.engines.transcription import TranscribeOptions, transcribe_stream

ROOT = Path(__file__).resolve().parent.parent


def ct2_dir(name: str, work: Path) -> Path:
    """A CTranslate2 directory with one model.bin for a bundled model (parts joined once)."""
    model = BUNDLED[name]
    parts = [find_package_dir(p.package) / p.relpath for p in model.parts]
    if len(parts) == 1:
        return parts[0].parent
    out = work / f"ct2-{name}"
    if not (out / "model.bin").is_file():
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "model.bin.part"
        with open(tmp, "wb") as dst:
            for part in parts:
                dst.write(part.read_bytes())
        os.replace(tmp, out / "model.bin")
        meta = find_package_dir(model.meta_dir.package) / model.meta_dir.relpath
        for f in ("config.json", "tokenizer.json", "vocabulary.txt"):
            if (meta / f).is_file():
                (out / f).write_bytes((meta / f).read_bytes())
    return out


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="whisper-base")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clips", type=Path, nargs="*", default=sorted((ROOT / "samples/en").glob("*.wav")))
    ap.add_argument("--work", type=Path, default=ROOT / "bench-out")
    args = ap.parse_args()
    from faster_whisper import WhisperModel as FWModel

    torch.set_num_threads(args.threads)
    ours = load_whisper(args.model)
    fw = FWModel(str(ct2_dir(args.model, args.work)), device="cpu", compute_type="float32",
                 cpu_threads=args.threads, num_workers=1)
    lang = "en" if ours.special.multilingual else None
    opts = TranscribeOptions(language=lang or "en", timestamps=False,
                             decoding=DecodingOptions(temperatures=(0.0,), condition_on_previous_text=False))
    fw_kwargs = dict(language=lang, beam_size=1, temperature=0.0, without_timestamps=True,
                     condition_on_previous_text=False, vad_filter=False)
    e2e = {"specli": [], "faster-whisper": []}
    texts = {}
    for _ in range(args.repeats + 1):  # the first round warms up and is dropped
        for clip in args.clips:
            t0 = time.perf_counter()
            res = transcribe_stream(ours, iter_audio_chunks(clip), opts)
            e2e["specli"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            segs, _info = fw.transcribe(str(clip), **fw_kwargs)
            text = "".join(s.text for s in segs)
            e2e["faster-whisper"].append(time.perf_counter() - t0)
            texts[clip.name] = (res.text.strip(), text.strip())
    n = len(args.clips)
    totals = {k: [sum(v[i * n : (i + 1) * n]) for i in range(1, args.repeats + 1)] for k, v in e2e.items()}
    same = sum(a == b for a, b in texts.values())
    enc_ours, enc_ct2 = _encoder_times(ours, fw, args.clips[0], args.repeats)
    print(f"model {args.model}, threads {args.threads}, {n} clips, {args.repeats} interleaved repeats")
    print("| | specli | CTranslate2 | CTranslate2 / specli |")
    print("|---|---|---|---|")
    print(f"| encoder, one window (ms) | {_median_ms(enc_ours):.0f} | {_median_ms(enc_ct2):.0f} | "
          f"{statistics.median(enc_ct2) / statistics.median(enc_ours):.2f}x |")
    a, b = statistics.median(totals["specli"]), statistics.median(totals["faster-whisper"])
    print(f"| end to end, all clips (s) | {a:.2f} | {b:.2f} | {b / a:.2f}x |")
    step_ours, step_ct2 = _decoder_step_times(ours, fw, args.clips[0], args.repeats)
    print(f"| decoder, per token (ms) | {_median_ms(step_ours):.1f} | {_median_ms(step_ct2):.1f} | "
          f"{statistics.median(step_ct2) / statistics.median(step_ours):.2f}x |")
    print(f"identical text on {same}/{n} clips")
    for name, (a_text, b_text) in texts.items():
        if a_text != b_text:
            print(f"  {name}: specli {a_text!r} | faster-whisper {b_text!r}")


def _decoder_step_times(ours, fw, clip: Path, repeats: int) -> tuple[list[float], list[float]]:
    """Greedy decode phase per token on the same encoder input (no timestamps, language given)."""
    import ctranslate2

    from specli.engines.greedy import greedy_decode
    from specli.engines.targets.whisper_rules import WhisperLogitRules

    sp, target = ours.special, ours.target
    mel = window_features(load_audio(clip), target.dims.n_mels)
    enc = target.encode(mel)
    prompt = sp.prompt("en" if sp.multilingual else None)
    rules = WhisperLogitRules.for_model(sp)
    enc_ct2 = fw.model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(mel.numpy())), to_cpu=True)
    ours_t, ct2_t = [], []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        res = greedy_decode(target, target.start(enc), prompt, rules, sp.eot, 224)
        ours_t.append((time.perf_counter() - t0) / res.stats.tokens)
        t0 = time.perf_counter()
        out = fw.model.generate(enc_ct2, [prompt], beam_size=1, max_length=448, suppress_blank=True,
                                suppress_tokens=list(sp.suppress_tokens))
        ct2_t.append((time.perf_counter() - t0) / (len(out[0].sequences_ids[0]) + 1))
    return ours_t[1:], ct2_t[1:]


def _encoder_times(ours, fw, clip: Path, repeats: int) -> tuple[list[float], list[float]]:
    import ctranslate2

    audio = load_audio(clip)
    mel = window_features(audio, ours.target.dims.n_mels)
    feats = ctranslate2.StorageView.from_array(np.ascontiguousarray(mel.numpy()))
    ours_t, ct2_t = [], []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        ours.target.encode(mel)
        ours_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fw.model.encode(feats, to_cpu=True)
        ct2_t.append(time.perf_counter() - t0)
    return ours_t[1:], ct2_t[1:]


if __name__ == "__main__":
    main()
