"""Subcommands ``export`` (trained FSQ + int8 encoder -> speech_tokenizer_v3.onnx) and ``tokenize`` (every
clip through that very file with onnxruntime -> data/voice/tokens/), and the ONNX check of ``eval --onnx``."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from specli.io.digest import file_sha256

from ..paths import COMMITTED, ONNX_NAME
from . import data as D
from . import export as X
from . import graph as G
from . import probe as P
from . import store as S
from .tokens import SPLIT_CODES, clip_records

log = D.log
TOKENS_DIR = COMMITTED / "tokens"
CONFIG_JSON = COMMITTED / "tokenizer.json"


def add_parsers(sub) -> None:  # argparse._SubParsersAction
    e = sub.add_parser("export", help=f"write <work>/{ONNX_NAME} from a trained run")
    e.add_argument("--name", required=True, help="the run to ship")
    e.add_argument("--quant", default="weights", choices=X.QUANT_MODES)
    e.add_argument("--out", type=Path, default=None,
                   help=f"write {ONNX_NAME} and its tokenizer.json to this directory instead (a candidate: "
                        "the committed record is left alone)")
    t = sub.add_parser("tokenize", help=f"tokenize every clip with <work>/{ONNX_NAME}")
    t.add_argument("--onnx", type=Path, default=None, help=f"default <work>/{ONNX_NAME}")
    t.add_argument("--allow-partial", action="store_true", help="tokenize a data build still running")
    t.add_argument("--out", type=Path, default=TOKENS_DIR)
    t.add_argument("--shard-size", type=int, default=500)


def run(args: argparse.Namespace) -> int:
    if args.cmd == "export":
        return cmd_export(args)
    if args.cmd == "tokenize":
        return cmd_tokenize(args)
    raise SystemExit(f"unknown command {args.cmd}")


def load_run(work: Path, name: str) -> dict:
    path = work / "runs" / name / "final.pt"
    if not path.is_file():
        raise SystemExit(f"error: {path} missing: train run {name!r} to the end first")
    return torch.load(path, weights_only=False)


def build_graph(work: Path, run: dict) -> G.TokenizerGraph:
    cfg = run["config"]
    taps = G.tap_layers(cfg["layer"])
    fsq = G.FSQ(cfg["levels"], dim_in=G.feature_dim(taps))
    fsq.load_state_dict(run["fsq"])
    matrix = np.load(work / "mel128to80.npy")
    return G.TokenizerGraph(G.load_encoder(max(taps), taps), matrix, fsq).eval()


def cmd_export(args: argparse.Namespace) -> int:
    run = load_run(args.work, args.name)
    graph = build_graph(args.work, run)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    path = (args.out or args.work) / ONNX_NAME
    info = X.export(graph, path, ["tokens"], quant=args.quant)
    from specli.tts.acoustic.frontend import SpeechTokenizer

    SpeechTokenizer(path)  # the frontend's signature check
    res = json.loads((args.work / "runs" / args.name / "results.json").read_text())
    write_config(args, run, res, info, args.out / "tokenizer.json" if args.out is not None else CONFIG_JSON)
    log(f"export: {path} {info['bytes'] / 1e6:.2f} MB sha256 {info['sha256']}")
    return 0


def write_config(args: argparse.Namespace, run: dict, res: dict, info: dict, record: Path) -> None:
    cfg = run["config"]
    taps = G.tap_layers(cfg["layer"])
    matrix = np.load(args.work / "mel128to80.npy")
    doc = {
        "onnx": {"file": ONNX_NAME, "sha256": info["sha256"], "bytes": info["bytes"],
                 "int8": f"{info['quant']}: {info['int8_matmuls']} encoder tensors int8 per-channel "
                         "(DequantizeLinear, float32 activations)" if info["quant"] == "weights"
                 else info["quant"]},
        "contract": {"inputs": "feats float32 [1,128,T] Whisper log-mel of the 16 kHz clip "
                               "(specli.tts.acoustic.features.whisper_log_mel), feats_length int32 [1] = T",
                     "output": "tokens int32 [1,n], n = max(1, round(T*22050/(1024*100)))",
                     "token_rate_hz": G.RATE_22K / G.TOKEN_HOP_22K, "mel_frames_per_token": 4,
                     "training_audio": "22.05 kHz wav zero-padded to a multiple of 1024 samples, soxr HQ "
                                       "to 16 kHz"},
        "encoder": {"model": "whisper-base (bundled)", "layers": max(taps), "taps": list(taps),
                    "final_layer_norm": True,
                    "interpolation": "linear, token i at encoder frame (i+0.5)*1024/441"},
        "mel_conversion": {"shape": [80, 128], "method": "row-wise NNLS: M @ F128 ~ F80 (slaney 0-8 kHz, "
                           "n_fft 400, 16 kHz); 10^(4x-4) -> M -> log10 clamp 1e-10 -> max-8 -> (x+4)/4",
                           "sha256_float32": __import__("hashlib").sha256(matrix.tobytes()).hexdigest()},
        "fsq": {"levels": cfg["levels"], "codebook": int(np.prod(cfg["levels"])),
                "index": "sum_j (q_j + floor(L_j/2)) * prod_{k<j} L_k", "eps": 1e-3},
        "training": {"run": args.name, **{k: cfg[k] for k in cfg if k not in ("levels", "layer")},
                     "heldout_per": res["heldout_per"], "heldout_mel_l1": res["heldout_mel_l1"],
                     "usage_train": res["usage_train"], "train_clips": res["train_clips"]},
        "exported": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    update_config(doc, record)


def update_config(doc: dict, record: Path = CONFIG_JSON) -> None:
    """Merge top-level keys into ``record`` (data/voice/tokenizer.json by default; one level deep for dicts)."""
    old = json.loads(record.read_text()) if record.is_file() else {}
    for k, v in doc.items():
        old[k] = (old.get(k) or {}) | v if isinstance(v, dict) and isinstance(old.get(k), dict) else v
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(old, indent=1, ensure_ascii=False) + "\n")


# ------------------------------------------------------------------------- tokenize


def tokenize_clip(sess, data: Path, clip_id: str) -> np.ndarray:
    audio = D.load_padded(data, clip_id)
    tokens = X.run(sess, D.whisper_mel128(audio))[0].reshape(-1)
    n = len(audio) // G.TOKEN_HOP_22K
    if len(tokens) != n:
        raise SystemExit(f"error: {clip_id}: {len(tokens)} tokens for {n} token hops of padded audio")
    return tokens


def cmd_tokenize(args: argparse.Namespace) -> int:
    onnx_path = args.onnx or args.work / ONNX_NAME
    sha = file_sha256(onnx_path)
    clips, complete = D.load_corpus(args.data)
    if not complete and not args.allow_partial:
        raise SystemExit("error: the data build is not complete (train.tsv); pass --allow-partial to try")
    part = args.work / "tokens" / sha[:16]
    part.mkdir(parents=True, exist_ok=True)
    kept = committed_tokens(args.out / "tokens.npz", sha)
    clips += kept_clips(args.out / "tokens.npz", kept, clips)
    have = {**done_tokens(part), **kept}
    todo = [c for c in clips if c.id not in have]
    log(f"tokenize: {len(clips)} clips, {len(kept)} kept from {args.out / 'tokens.npz'}, {len(have) - len(kept)} "
        f"in shards, {len(todo)} to do with {onnx_path.name} {sha[:16]}")
    sess = X.session(onnx_path, threads=torch.get_num_threads())  # the build's --threads (default 1)
    rows: list[tuple[str, np.ndarray]] = []
    t0, audio_s = time.monotonic(), 0.0
    for i, clip in enumerate(todo):
        rows.append((clip.id, tokenize_clip(sess, args.data, clip.id)))
        audio_s += len(rows[-1][1]) * G.TOKEN_HOP_22K / G.RATE_22K
        if len(rows) == args.shard_size or i == len(todo) - 1:
            write_token_shard(part, rows)
            rows = []
            wall = time.monotonic() - t0
            log(f"tokenize: {i + 1}/{len(todo)}, {audio_s / 3600:.2f} h, RTF {wall / audio_s:.4f}")
    stats = {"rtf": (time.monotonic() - t0) / audio_s if audio_s else None, "threads": torch.get_num_threads()}
    write_tokens(args.out, clips, {**done_tokens(part), **kept}, sha, onnx_path, complete, stats)
    return 0


def committed_tokens(path: Path, sha: str) -> dict[str, np.ndarray]:
    """The codes of every clip already in ``path`` when the same ONNX file (``sha``) made it, else nothing.

    They are kept as they are: re-tokenizing on another CPU moves a few codes near an FSQ boundary (onnxruntime's
    float path), and the shipped weights were trained on the committed codes, so a rebuild only adds clips."""
    if not path.is_file():
        return {}
    with np.load(path) as z:
        if str(z["onnx_sha256"]) != sha:
            return {}
        offsets, tokens = z["offsets"], z["tokens"]
        return {str(cid): tokens[offsets[i]:offsets[i + 1]] for i, cid in enumerate(z["ids"])}


def kept_clips(path: Path, kept: dict[str, np.ndarray], clips: list[D.Clip]) -> list[D.Clip]:
    """The clips of the committed file that the corpus here does not list (a partial build, or one whose earlier
    clips were spoken on another machine): kept, so that tokenizing never shrinks the committed file."""
    listed = {c.id for c in clips}
    missing = [cid for cid in kept if cid not in listed]
    if not missing:
        return []
    records = clip_records(path)
    out = []
    for cid in missing:
        split, seconds = records[cid]
        if seconds is None:  # a file made before clip lengths were recorded: the padded audio its tokens cover
            seconds = len(kept[cid]) * G.TOKEN_HOP_22K / G.RATE_22K
        out.append(D.Clip(cid, "", split, seconds))
    return out


def done_tokens(part: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for p in sorted(part.glob("shard_*.npz")):
        with np.load(p) as z:
            ends = np.cumsum(z["n"])
            for cid, a, b in zip(z["ids"], ends - z["n"], ends):
                out[str(cid)] = z["tokens"][a:b]
    return out


def write_token_shard(part: Path, rows: list[tuple[str, np.ndarray]]) -> None:
    path = part / f"shard_{len(list(part.glob('shard_*.npz'))):05d}.npz"
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, ids=np.array([r[0] for r in rows]), n=np.array([len(r[1]) for r in rows], np.int64),
             tokens=np.concatenate([r[1] for r in rows]).astype(np.uint16))
    os.replace(tmp, path)


def write_tokens(out: Path, clips: list[D.Clip], tokens: dict[str, np.ndarray], sha: str, onnx_path: Path,
                 complete: bool, stats: dict) -> None:
    """``tokens.npz``: ids, split (0 train / 1 held-out), offsets, tokens (uint16), sha256; + README.md."""
    out.mkdir(parents=True, exist_ok=True)
    kept = [c for c in clips if c.id in tokens]
    n = np.array([len(tokens[c.id]) for c in kept], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
    tmp = out / "tokens.tmp.npz"
    np.savez_compressed(tmp, ids=np.array([c.id for c in kept]),
                        split=np.array([SPLIT_CODES[c.split] for c in kept], dtype=np.uint8),
                        offsets=offsets, tokens=np.concatenate([tokens[c.id] for c in kept]).astype(np.uint16),
                        seconds=np.array([c.seconds for c in kept], dtype=np.float64), onnx_sha256=np.array(sha))
    os.replace(tmp, out / "tokens.npz")
    hours = {s: float(sum(len(tokens[c.id]) for c in kept if c.split == s) * G.TOKEN_HOP_22K / G.RATE_22K
                      / 3600) for s in SPLIT_CODES}
    write_readme(out, kept, hours, sha, onnx_path, complete, stats)
    log(f"tokenize: wrote {out / 'tokens.npz'}: {len(kept)} clips, {int(n.sum())} tokens, hours {hours}")


def write_readme(out: Path, kept: list[D.Clip], hours: dict, sha: str, onnx_path: Path, complete: bool,
                 stats: dict) -> None:
    splits = {s: sum(c.split == s for c in kept) for s in ("train", "heldout")}
    threads = stats.get("threads", 1)
    rtf = (f"  Tokenisation RTF {stats['rtf']:.4f} on {threads} thread{'s' if threads > 1 else ''}."
           if stats.get("rtf") else "")
    text = f"""# Speech tokens of the voice corpus

`tokens.npz`: the speech tokens of every clip of the piper/joe corpus (fortunes, then WordNet's usage
examples and, with `corpus --glosses`, its definitions; scripts/voice/corpus/piper.py; \
{splits['train']} train clips = {hours['train']:.2f} h, {splits['heldout']}
held-out clips = {hours['heldout']:.2f} h{'' if complete else '; PARTIAL build'}), made by
`python -m scripts.voice tokens` running `{onnx_path.name}` (sha256 `{sha}`) with onnxruntime on
each clip's whole-clip Whisper 128-bin log-mel: the 22.05 kHz wav zero-padded to a multiple of 1024
samples, soxr HQ to 16 kHz, `specli.tts.acoustic.features.whisper_log_mel`.  21.533 Hz, exactly 4 mel
frames (hop 256 at 22.05 kHz) per token.{rtf}

Arrays: `ids` (clip id = first 12 hex digits of the sentence sha1), `split` (0 train, 1 held-out),
`offsets` (clip i is `tokens[offsets[i]:offsets[i+1]]`), `tokens` (uint16), `seconds` (each clip's length:
its wav's, or for a clip tokenized before lengths were recorded the padded audio its tokens cover), `onnx_sha256`.
See ../tokenizer.json for the tokenizer's levels, layers and measurements.
"""
    (out / "README.md").write_text(text)


# ---------------------------------------------------------------------------- check


def probe_from_run(run: dict) -> P.Probe:
    model = P.from_config(run["config"], len(run["symbols"]))
    model.load_state_dict(run["model"])
    return model.eval()


@torch.no_grad()
def check_onnx(args: argparse.Namespace) -> int:
    """Tokens of the held-out clips from the ONNX file vs the run's torch FSQ on cached features, and the
    run's probe heads reading the ONNX tokens (PER)."""
    run = load_run(args.work, args.name)
    model = probe_from_run(run)
    clips, _ = D.load_corpus(args.data)
    held = [c for c in clips if c.split == "heldout"]
    ipa = D.phonemize(held, args.work / "phonemes.tsv")
    fs = S.load_features(args.work / "features", G.tap_layers(run["config"]["layer"]), {c.id for c in held})
    table = {s: i + 1 for i, s in enumerate(run["symbols"])}
    sess = X.session(args.onnx, threads=1)
    same = total = errs = ref_len = 0
    t0, audio_s = time.monotonic(), 0.0
    for i, cid in enumerate(fs.ids):
        tok = tokenize_clip(sess, args.data, cid).astype(np.int64)
        audio_s += len(tok) * G.TOKEN_HOP_22K / G.RATE_22K
        feats, _ = fs.clip(i)
        ref = model.fsq.indices(torch.from_numpy(feats.astype(np.float32))).numpy()
        same, total = same + int((ref == tok).sum()), total + len(tok)
        codes = model.fsq.codes_from_indices(torch.from_numpy(tok))[None]
        logp, _ = model.heads(codes, torch.tensor([len(tok)]))
        target = [table[s] for s in D.phone_symbols(ipa[cid]) if s in table]
        errs += P.edit_distance(target, P.greedy(logp[0], len(tok)))
        ref_len += len(target)
    wall = time.monotonic() - t0
    res = {"onnx_sha256": file_sha256(args.onnx), "clips": len(fs.ids), "agreement": same / total,
           "per_from_onnx_tokens": errs / ref_len, "rtf_incl_mel": wall / audio_s}
    print(json.dumps(res, indent=1))
    return 0
