"""Acceptance of each speech drafter (DSpark / DFlash / EAGLE-3) before and after on-policy training.

Target: the tiny CosyVoice3 checkpoint of the tests made learnable (``markov_checkpoint`` in
``tests/test_speech_distill.py``: a peaked first-order Markov chain over 41 speech ids), 16 texts
labelled on-policy with the preset's sampler (RAS), 12 for training and 4 held out.
Each drafter is validated by real speculative decoding on the held-out prompts, untrained and after
``--epochs`` of training; prints acceptance length (tokens per target forward) and per-position
acceptance. Not a test: a measurement for reports.

    python benchmarks/speech_drafter_acceptance.py --epochs 12 --threads 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_speech_distill import FAST, TEXTS, markov_checkpoint  # noqa: E402

from specli.distill.data import load_windows  # noqa: E402
from specli.distill.speech_data import SpeechDataOptions, generate_speech, read_speech_manifest  # noqa: E402
from specli.distill.speech_train import SpeechTrainOptions, new_module, train_speech, validate  # noqa: E402
from specli.core.drafters.llm.base import load_speech_drafter  # noqa: E402
from specli.core.sampling import SamplerOptions  # noqa: E402
from specli.tts.synthesis import SynthesisRequest  # noqa: E402
from specli.models.cosyvoice.lm import load_cosyvoice  # noqa: E402


def _row(name: str, stats) -> str:
    rates = [a / n if n else 0.0 for a, n in zip(stats.position_accepts, stats.position_attempts)]
    return f"{name:<10} tau {stats.acceptance_length:5.2f}  per position " + " ".join(f"{r:.2f}" for r in rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafters", default="dspark,dflash,eagle3")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="specli-drafter-acc-"))
    model = load_cosyvoice(str(markov_checkpoint(root / "ckpt")))
    reqs = [SynthesisRequest(f"u{i:02d}", t) for i, t in enumerate(TEXTS)]
    generate_speech(reqs[:12], model, root / "train", SpeechDataOptions(per_shard=6))
    generate_speech(reqs[12:], model, root / "val", SpeechDataOptions(per_shard=6))
    records, val = load_windows(root / "train"), load_windows(root / "val")
    man = read_speech_manifest(root / "train")
    sampler = SamplerOptions(**man["sampler"])
    print(f"target: tiny CV3 Markov chain; sampler {man['sampler']}; {len(records)} train / {len(val)} held out")
    for kind in args.drafters.split(","):
        extra = {} if kind == "dspark" else {"layers": 2}
        opts = SpeechTrainOptions(kind, epochs=args.epochs, lr=1e-2, val_every=args.epochs, **extra, **FAST)
        print(_row(f"{kind} -", validate(new_module(kind, model, records, opts), model, val, sampler)))
        t0 = time.perf_counter()
        train_speech(records, model, root / kind, opts, val, man)
        trained = load_speech_drafter(root / kind, model.lm)
        print(_row(f"{kind} +", validate(trained, model, val, sampler)),
              f"(trained {args.epochs} epochs in {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
