"""specli's AR decoding vs CTranslate2 (faster-whisper's engine) on the same weights, side by side.

Measures the encoder time per 30-s window, the greedy decode phase per token, and the end-to-end wall
time of a whole transcription (specli vs faster-whisper, beam 1, without timestamps, language given).
Needs `pip install 'specli[peers]'` (faster-whisper).

Modes (``--mode``):
- ``in-process``: both systems in this process, interleaved clip by clip (each library keeps its own
  OpenMP pool: torch's libgomp and the copy CTranslate2's wheel bundles).
- ``separate``: each system in its own subprocess that never imports the other library (specli's never
  imports ctranslate2, CTranslate2's never imports torch), plus a third subprocess running specli with
  CTranslate2 imported and its model loaded but idle: isolates what sharing a process costs.
- ``both`` (default): the two above, one after the other, in one table.

    python benchmarks/bench_vs_ctranslate2.py --model whisper-base --threads 2 --repeats 3 --dtype float32
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # specli from this checkout, also in the worker subprocesses
COMPUTE = {"float32": "float32", "bfloat16": "bfloat16", "int8": "int8"}  # --dtype -> CTranslate2 compute type


class SpecliSide:
    """specli's target: plain greedy transcription, encoder, and the greedy decode phase."""

    name = "specli"

    def __init__(self, args) -> None:
        import torch

        from specli.models.whisper.loader import load_whisper

        torch.set_num_threads(args.threads)
        self.model = load_whisper(args.model, "float32" if args.dtype == "int8" else args.dtype)
        self.lang = "en" if self.model.special.multilingual else None

    def transcribe(self, clip: Path) -> str:
        from specli.io.audio import iter_audio_chunks
        from specli.models.speech import DecodingOptions
        from specli.asr.windows import TranscribeOptions, transcribe_stream

        opts = TranscribeOptions(language=self.lang or "en", timestamps=False,
                                 decoding=DecodingOptions(temperatures=(0.0,), condition_on_previous_text=False))
        return transcribe_stream(self.model, iter_audio_chunks(clip), opts).text.strip()

    def encode(self, mel: np.ndarray) -> None:
        import torch

        self.model.target.encode(torch.from_numpy(mel))

    def decode_per_token(self, mel: np.ndarray) -> float:
        """Seconds per token of one greedy decode of this window (encoder output computed before)."""
        import torch

        from specli.core.greedy import greedy_decode
        from specli.core.job import DecodeJob
        from specli.models.whisper.rules import WhisperLogitRules

        sp, target = self.model.special, self.model.target
        enc = target.encode(torch.from_numpy(mel))
        rules = WhisperLogitRules.for_model(sp)
        t0 = time.perf_counter()
        res = greedy_decode(target, target.start(enc), DecodeJob(tuple(sp.prompt(self.lang)), rules, sp.eot, 224))
        return (time.perf_counter() - t0) / res.stats.tokens


class Ct2Side:
    """faster-whisper / CTranslate2 on the bundled CTranslate2 weights."""

    name = "ctranslate2"

    def __init__(self, args) -> None:
        from faster_whisper import WhisperModel as FWModel

        from specli.bench.peers import ct2_dir

        self.fw = FWModel(str(ct2_dir(args.model)), device="cpu", compute_type=COMPUTE[args.dtype],
                          cpu_threads=args.threads, num_workers=1)
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        self.multilingual = self.fw.model.is_multilingual

        tok = Tokenizer(self.fw.hf_tokenizer, self.multilingual, task="transcribe",
                        language="en" if self.multilingual else None)
        self.prompt = self.fw.get_prompt(tok, [], without_timestamps=True)
        self.suppress = list(get_suppressed_tokens(tok, [-1]))

    def transcribe(self, clip: Path) -> str:
        segs, _info = self.fw.transcribe(str(clip), language="en" if self.multilingual else None, beam_size=1,
                                         temperature=0.0, without_timestamps=True,
                                         condition_on_previous_text=False, vad_filter=False)
        return "".join(s.text for s in segs).strip()

    def _features(self, mel: np.ndarray):
        import ctranslate2

        return ctranslate2.StorageView.from_array(np.ascontiguousarray(mel))

    def encode(self, mel: np.ndarray) -> None:
        self.fw.model.encode(self._features(mel), to_cpu=True)

    def decode_per_token(self, mel: np.ndarray) -> float:
        enc = self.fw.model.encode(self._features(mel), to_cpu=True)
        t0 = time.perf_counter()
        out = self.fw.model.generate(enc, [self.prompt], beam_size=1, max_length=448, suppress_blank=True,
                                     suppress_tokens=self.suppress)
        return (time.perf_counter() - t0) / (len(out[0].sequences_ids[0]) + 1)


def window_mel(clip: Path, n_mels: int) -> np.ndarray:
    """The log-mel of the clip's first 30-s window, [1, n_mels, 3000] float32 (specli's front end)."""
    from specli.io.audio import load_audio, window_features

    return window_features(load_audio(clip), n_mels).numpy()


def measure(sides: list, clips: list[Path], repeats: int, n_mels: int) -> dict:
    """Interleaved over ``sides``: end to end per clip set, encoder per window, decode per token (medians)."""
    mel = window_mel(clips[0], n_mels)
    rec = {s.name: {"e2e": [], "encoder": [], "step": [], "texts": {}} for s in sides}
    for rep in range(repeats + 1):  # the first round warms up and is dropped
        for s in sides:
            r = rec[s.name]
            t0 = time.perf_counter()
            for clip in clips:
                r["texts"][clip.name] = s.transcribe(clip)
            wall = time.perf_counter() - t0
            t0 = time.perf_counter()
            s.encode(mel)
            enc = time.perf_counter() - t0
            step = s.decode_per_token(mel)
            if rep:
                r["e2e"].append(wall)
                r["encoder"].append(enc)
                r["step"].append(step)
    return {name: {**{k: statistics.median(v) for k, v in r.items() if k != "texts"}, "texts": r["texts"]}
            for name, r in rec.items()}


def worker(args) -> dict:
    """One subprocess's measurement (``--worker``): one system, optionally beside an idle CTranslate2."""
    clips = args.clips
    if args.worker == "ctranslate2":
        return measure([Ct2Side(args)], clips, args.repeats, 80)
    idle = Ct2Side(args) if args.worker == "specli+idle-ct2" else None
    side = SpecliSide(args)
    if idle is not None:
        idle.transcribe(clips[0])  # CTranslate2 has run once: its OpenMP pool exists
    out = measure([side], clips, args.repeats, side.model.target.dims.n_mels)
    return {args.worker: out["specli"]}


def run_worker(args, kind: str) -> dict:
    cmd = [sys.executable, __file__, "--worker", kind, "--model", args.model, "--threads", str(args.threads),
           "--repeats", str(args.repeats), "--dtype", args.dtype, "--clips", *map(str, args.clips)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"worker {kind} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(columns: dict[str, dict], n: int, args) -> None:
    print(f"model {args.model}, dtype {args.dtype}, threads {args.threads}, {n} clips, {args.repeats} repeats "
          f"(medians; first round dropped)")
    print("| | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for key, label, scale, digits in (("encoder", "encoder, one window (ms)", 1e3, 0),
                                      ("step", "decode phase per token (ms)", 1e3, 1),
                                      ("e2e", "end to end, all clips (s)", 1, 2)):
        print(f"| {label} | " + " | ".join(f"{c[key] * scale:.{digits}f}" for c in columns.values()) + " |")
    names = list(columns)
    for a in names[1:]:
        same = sum(columns[names[0]]["texts"][k] == columns[a]["texts"][k] for k in columns[a]["texts"])
        print(f"identical text {names[0]} vs {a}: {same}/{n}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="whisper-base")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", choices=list(COMPUTE), default="float32",
                    help="specli dtype and CTranslate2 compute type (int8: CTranslate2 int8 vs specli float32)")
    ap.add_argument("--mode", choices=["in-process", "separate", "both"], default="both")
    ap.add_argument("--clips", type=Path, nargs="*", default=sorted((ROOT / "samples/en").glob("*.wav")))
    ap.add_argument("--worker", choices=["specli", "ctranslate2", "specli+idle-ct2"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    columns: dict[str, dict] = {}
    if args.mode in ("separate", "both"):
        for kind in ("specli", "ctranslate2", "specli+idle-ct2"):
            out = run_worker(args, kind)
            columns.update({f"{k} (own process)": v for k, v in out.items()})
    if args.mode in ("in-process", "both"):
        sides = [SpecliSide(args), Ct2Side(args)]
        out = measure(sides, args.clips, args.repeats, sides[0].model.target.dims.n_mels)
        columns.update({f"{k} (one process)": v for k, v in out.items()})
    report(columns, len(args.clips), args)


if __name__ == "__main__":
    main()
