"""Speech tokenizer for the small English CosyVoice3-style voice: whisper-base encoder + FSQ, as one ONNX file.

Steps (each resumable; progress on stderr), run by ``python -m scripts.voice tokenizer|tokens --work DIR``, which
passes ``--data <work>/data --work <work>/tokenizer``; ``python -m scripts.voice tokenizer --work DIR STEP ...`` runs
one step with its own options::

    features    # feature ONNX (int8 encoder, taps 4,5,6) -> per-clip features + vocoder mels
    train --layer 6 --levels 3^6 --name L6_3^6   # FSQ projection + CTC/mel probe heads
    train --layer 4,6 --levels 3^8 --name L46    # layers 4 and 6 concatenated before the FSQ
    eval --name L6_3^6                           # held-out PER, codebook usage
    export --name L6_3^6                         # -> speech_tokenizer_v3.onnx
    tokenize                                     # every clip through that ONNX -> data/voice/tokens

The graph is described in graph.py; data/voice/tokenizer.json holds the measured choices and
docs/benchmarks/voice/tokenizer/README.md the grids that made them.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from specli.io.digest import file_sha256

from . import data as D
from . import export as X
from . import graph as G
from . import store as S
from . import train as T

log = D.log


def feature_onnx(work: Path, taps: tuple[int, ...], quant: str) -> Path:
    """The feature graph (int8 encoder as shipped, all tap layers), exported once."""
    path = work / f"features_L{''.join(map(str, taps))}_{quant}.onnx"
    if not path.is_file():
        import torch

        torch.manual_seed(0)
        matrix = G.conversion_matrix()
        np.save(work / "mel128to80.npy", matrix)
        graph = G.FeatureGraph(G.load_encoder(max(taps), taps), matrix)
        info = X.export(graph, path, [f"L{t}" for t in taps], quant=quant)
        log(f"features: exported {path} ({info['bytes'] / 1e6:.1f} MB, {info['int8_matmuls']} int8 tensors)")
    return path


def cmd_features(args: argparse.Namespace) -> int:
    import torch

    taps = tuple(int(t) for t in args.taps.split(","))
    onnx_path = feature_onnx(args.work, taps, args.quant)
    root = args.work / "features"
    S.check_meta(root, {"onnx": onnx_path.name, "onnx_sha256": file_sha256(onnx_path), "taps": list(taps)})
    clips, complete = D.load_corpus(args.data)
    have = S.done_ids(root)
    todo = [c for c in clips if c.id not in have]
    log(f"features: {len(clips)} clips ({'complete' if complete else 'partial'} build), "
        f"{len(have)} cached, {len(todo)} to do")
    sess = X.session(onnx_path, threads=torch.get_num_threads())  # the build's --threads (default 1)
    rows: list = []
    t0, audio_s, enc_s = time.monotonic(), 0.0, 0.0
    for i, clip in enumerate(todo):
        audio = D.load_padded(args.data, clip.id)
        mel128 = D.whisper_mel128(audio)
        t1 = time.monotonic()
        outs = X.run(sess, mel128)
        enc_s += time.monotonic() - t1
        n = len(audio) // G.TOKEN_HOP_22K
        assert all(o.shape[1] == n for o in outs), (clip.id, n, [o.shape for o in outs])
        rows.append((clip.id, {f"L{t}": o[0] for t, o in zip(taps, outs)}, D.vocoder_mel(audio)))
        audio_s += len(audio) / G.RATE_22K
        if len(rows) == args.shard_size or i == len(todo) - 1:
            S.write_shard(root, rows)
            rows = []
            wall = time.monotonic() - t0
            log(f"features: {i + 1}/{len(todo)} clips, {audio_s / 3600:.2f} h audio, wall {wall:.0f} s "
                f"(RTF {wall / audio_s:.4f}, encoder {enc_s / audio_s:.4f})")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="the corpus (<work>/data)")
    ap.add_argument("--work", type=Path, required=True, help="features, checkpoints, ONNX (<work>/tokenizer)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("features", help="extract encoder features with the int8 feature ONNX")
    f.add_argument("--taps", default="4,5,6", help="encoder layers to keep (default %(default)s)")
    f.add_argument("--quant", default="weights", choices=X.QUANT_MODES)
    f.add_argument("--shard-size", type=int, default=200)
    T.add_parsers(sub)  # the training / eval / export / tokenize subcommands
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.cmd == "features":
        return cmd_features(args)
    return T.run(args)

