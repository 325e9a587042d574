"""Subcommands ``train`` and ``eval`` of the tokenizer (``export`` / ``tokenize`` live in ship.py)."""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from . import data as D
from . import graph as G
from . import probe as P
from . import ship
from . import store as S

log = D.log


def parse_levels(text: str) -> tuple[int, ...]:
    if text in G.LEVEL_PRESETS:
        return G.LEVEL_PRESETS[text]
    return tuple(int(x) for x in text.split(","))


def parse_layer(text: str) -> int | list[int]:
    """``--layer``: ``6`` (one tap, stored as an int as runs always were) or ``4,6`` (stored as a list)."""
    try:
        taps = G.tap_layers([int(t) for t in text.split(",")])
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return taps[0] if len(taps) == 1 else list(taps)


def add_parsers(sub) -> None:  # argparse._SubParsersAction
    t = sub.add_parser("train", help="train the FSQ projection with CTC + mel probe heads")
    t.add_argument("--name", required=True, help="run name: <work>/runs/<name>")
    t.add_argument("--layer", type=parse_layer, default=6,
                   help="encoder tap layer, or layers whose outputs are concatenated: 4,6 (default %(default)s)")
    t.add_argument("--levels", default="3^6", help=f"FSQ levels: {', '.join(G.LEVEL_PRESETS)} or 3,3,3,...")
    t.add_argument("--continuous", action="store_true", help="no rounding (the continuous reference)")
    t.add_argument("--train-hours", type=float, default=None, help="use the first H hours of training clips")
    t.add_argument("--epochs", type=int, default=8)
    t.add_argument("--max-tokens", type=int, default=800,
                   help="padded tokens per batch (small batches leave the CTC blank plateau sooner)")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--mel-weight", type=float, default=0.25)
    t.add_argument("--hidden", type=int, default=256)
    t.add_argument("--seed", type=int, default=1234)
    t.add_argument("--ckpt-every", type=int, default=200, help="steps between checkpoints")
    e = sub.add_parser("eval", help="table of run results; --onnx checks the exported tokenizer")
    e.add_argument("names", nargs="*", help="runs (default: all)")
    e.add_argument("--onnx", type=Path, default=None, help="tokenizer ONNX to check against run --name")
    e.add_argument("--name", default=None, help="run whose probe heads read the ONNX tokens")
    e.add_argument("--measure", type=int, default=0, metavar="N",
                   help="also measure the 128->80 conversion and int8 error on N held-out clips")
    e.add_argument("--json", action="store_true", help="store the table in data/voice/tokenizer.json")
    ship.add_parsers(sub)


def run(args: argparse.Namespace) -> int:
    if args.cmd == "train":
        return cmd_train(args)
    if args.cmd == "eval":
        return cmd_eval(args)
    return ship.run(args)


# ----------------------------------------------------------------------------- data


def symbol_table(run_dir: Path, train_ipa: list[str]) -> list[str]:
    """Phone inventory of the training clips, fixed in ``symbols.json`` on the first run."""
    path = run_dir / "symbols.json"
    if path.is_file():
        return json.loads(path.read_text())
    syms = sorted({s for ipa in train_ipa for s in D.phone_symbols(ipa)})
    path.write_text(json.dumps(syms, ensure_ascii=False) + "\n")
    return syms


def encode_targets(fs: S.FeatureSet, ipa: dict[str, str], syms: list[str]) -> list[list[int]]:
    table = {s: i + 1 for i, s in enumerate(syms)}  # 0 = CTC blank
    return [[table[s] for s in D.phone_symbols(ipa[i]) if s in table] for i in fs.ids]


def load_sets(args: argparse.Namespace, run_dir: Path, layer: int | list[int], hours: float | None):
    """(train FeatureSet, held-out FeatureSet, train targets, held-out targets, symbols)."""
    clips, _ = D.load_corpus(args.data)
    ipa = D.phonemize(clips, args.work / "phonemes.tsv")
    root, taps = args.work / "features", G.tap_layers(layer)
    S.check_taps(root, taps)
    have = S.done_ids(root)
    train = [c for c in clips if c.split == "train" and c.id in have]
    if hours is not None:
        cum = np.cumsum([c.seconds for c in train]) / 3600
        train = train[: int(np.searchsorted(cum, hours)) + 1]
    held = {c.id for c in clips if c.split == "heldout" and c.id in have}
    syms = symbol_table(run_dir, [ipa[c.id] for c in train])
    tr = S.load_features(root, taps, {c.id for c in train})
    ho = S.load_features(root, taps, held)
    log(f"train: {len(tr.ids)} clips, {tr.n.sum() / G.RATE_22K * G.TOKEN_HOP_22K / 3600:.2f} h, "
        f"{tr.n.sum()} tokens; held-out {len(ho.ids)} clips; {len(syms)} phone symbols")
    return tr, ho, encode_targets(tr, ipa, syms), encode_targets(ho, ipa, syms), syms


# ---------------------------------------------------------------------------- train


def run_config(args: argparse.Namespace) -> dict:
    return {"layer": args.layer, "levels": list(parse_levels(args.levels)), "quantise": not args.continuous,
            "train_hours": args.train_hours, "epochs": args.epochs, "max_tokens": args.max_tokens,
            "lr": args.lr, "mel_weight": args.mel_weight, "hidden": args.hidden, "seed": args.seed}


def save_atomic(obj: dict, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def make_model(cfg: dict, n_symbols: int) -> P.Probe:
    torch.manual_seed(cfg["seed"])
    return P.from_config(cfg, n_symbols)


def resume(run_dir: Path, cfg: dict, model: P.Probe, opt: torch.optim.Optimizer) -> dict:
    path = run_dir / "ckpt.pt"
    if not path.is_file():
        return {"epoch": 0, "batch": 0, "step": 0, "history": [], "seconds": 0.0}
    ck = torch.load(path, weights_only=False)
    if ck["config"] != cfg:
        raise SystemExit(f"error: {run_dir} was trained with {ck['config']}; use another --name")
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    log(f"resumed {run_dir.name} at epoch {ck['state']['epoch']} batch {ck['state']['batch']}")
    return ck["state"]


def cmd_train(args: argparse.Namespace) -> int:  # on the build's --threads (default 1)
    cfg = run_config(args)
    run_dir = args.work / "runs" / args.name
    run_dir.mkdir(parents=True, exist_ok=True)
    done = run_dir / "results.json"
    if done.is_file() and json.loads(done.read_text())["config"] == cfg:
        log(f"{args.name}: already trained ({done})")
        return 0
    tr, ho, ttr, tho, syms = load_sets(args, run_dir, cfg["layer"], cfg["train_hours"])
    model = make_model(cfg, len(syms))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.01)
    st = resume(run_dir, cfg, model, opt)
    per_epoch = len(P.batches(tr, cfg["max_tokens"], cfg["seed"]))
    total = per_epoch * cfg["epochs"]
    while st["epoch"] < cfg["epochs"]:
        train_epoch(model, opt, tr, ttr, cfg, st, total, run_dir, args.ckpt_every)
        ev = P.evaluate(model, ho, tho)
        st["history"].append({"epoch": st["epoch"] + 1, "step": st["step"], "per": ev["per"],
                              "mel_l1": ev["mel_l1"]})
        log(f"{args.name}: epoch {st['epoch'] + 1}/{cfg['epochs']} held-out PER {ev['per']:.4f} "
            f"mel L1 {ev['mel_l1']:.4f}")
        st["epoch"], st["batch"] = st["epoch"] + 1, 0
        save_atomic({"config": cfg, "model": model.state_dict(), "opt": opt.state_dict(), "state": st},
                    run_dir / "ckpt.pt")
    write_results(model, cfg, st, tr, ho, ttr, tho, syms, run_dir)
    return 0


def train_epoch(model: P.Probe, opt: torch.optim.Optimizer, tr: S.FeatureSet, ttr: list[list[int]],
                cfg: dict, st: dict, total: int, run_dir: Path, ckpt_every: int) -> None:
    order = P.batches(tr, cfg["max_tokens"], cfg["seed"] + st["epoch"])
    torch.manual_seed(cfg["seed"] * 1000 + st["step"])
    t0, ctc_acc, l1_acc, k0 = time.monotonic(), 0.0, 0.0, st["batch"]
    for k, rows in P.iterate(order, st["batch"]):
        for g in opt.param_groups:
            g["lr"] = P.lr_at(st["step"], total, cfg["lr"], warmup=min(500, total // 10))
        ctc, l1 = P.losses(model, P.Batch(tr, rows, ttr))
        loss = ctc + cfg["mel_weight"] * l1
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        st["step"], st["batch"] = st["step"] + 1, k + 1
        ctc_acc, l1_acc = ctc_acc + ctc.item(), l1_acc + l1.item()
        if st["step"] % 50 == 0:
            done = k + 1 - k0
            log(f"step {st['step']}/{total} ep {st['epoch'] + 1} ctc {ctc_acc / done:.3f} "
                f"mel {l1_acc / done:.3f} ({(time.monotonic() - t0) / done:.2f} s/step)")
        if st["step"] % ckpt_every == 0:
            st["seconds"] += time.monotonic() - t0
            t0, ctc_acc, l1_acc, k0 = time.monotonic(), 0.0, 0.0, k + 1
            save_atomic({"config": cfg, "model": model.state_dict(), "opt": opt.state_dict(), "state": st},
                        run_dir / "ckpt.pt")
    st["seconds"] += time.monotonic() - t0


def write_results(model: P.Probe, cfg: dict, st: dict, tr: S.FeatureSet, ho: S.FeatureSet,
                  ttr: list[list[int]], tho: list[list[int]], syms: list[str], run_dir: Path) -> dict:
    ev = P.evaluate(model, ho, tho)
    ev_tr = P.evaluate(model, subset(tr, 300), [ttr[i] for i in range(min(300, len(tr.ids)))])
    size = model.fsq.size
    train_idx = all_indices(model.fsq, tr)
    res = {"config": cfg, "heldout_per": ev["per"], "heldout_mel_l1": ev["mel_l1"],
           "train300_per": ev_tr["per"], "history": st["history"], "train_seconds": st["seconds"],
           "train_clips": len(tr.ids), "train_tokens": int(tr.n.sum()), "symbols": len(syms),
           "usage_train": P.usage(train_idx, size) if cfg["quantise"] else None,
           "usage_heldout": P.usage(ev["indices"], size) if cfg["quantise"] else None}
    (run_dir / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    torch.save({"config": cfg, "fsq": model.fsq.state_dict(), "model": model.state_dict(), "symbols": syms},
               run_dir / "final.pt")
    log(f"{run_dir.name}: held-out PER {ev['per']:.4f}, mel L1 {ev['mel_l1']:.4f}, usage "
        f"{res['usage_train']}")
    return res


@torch.no_grad()
def all_indices(fsq: G.FSQ, fs: S.FeatureSet, chunk: int = 50000) -> list[np.ndarray]:
    """FSQ indices of every token of ``fs`` (one array, fine for usage counts)."""
    out = [fsq.indices(torch.from_numpy(fs.feats[a:a + chunk].astype(np.float32))).numpy()
           for a in range(0, len(fs.feats), chunk)]
    return out


def subset(fs: S.FeatureSet, k: int) -> S.FeatureSet:
    k = min(k, len(fs.ids))
    end = int(fs.offsets[k - 1] + fs.n[k - 1])
    return S.FeatureSet(fs.ids[:k], fs.n[:k], fs.offsets[:k], fs.feats[:end], fs.mel[:4 * end])


# ----------------------------------------------------------------------------- eval


def cmd_eval(args: argparse.Namespace) -> int:
    if args.onnx is not None:
        return ship.check_onnx(args)
    runs = sorted((args.work / "runs").glob("*/results.json"))
    rows = [json.loads(p.read_text()) | {"name": p.parent.name} for p in runs
            if not args.names or p.parent.name in args.names]
    table = [table_row(r) for r in rows]
    keys = list(table[0]) if table else []
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in table:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    extra = {"probe_runs": table}
    if args.measure:
        extra["frontend"] = measure_frontend(args, args.measure)
        print(json.dumps(extra["frontend"], indent=1))
    if args.json:
        ship.update_config({"measurements": extra})
    return 0


def table_row(r: dict) -> dict:
    c, u = r["config"], r.get("usage_train") or {}
    hours = r["train_tokens"] * G.TOKEN_HOP_22K / G.RATE_22K / 3600
    return {"run": r["name"], "layer": c["layer"],
            "levels": "continuous" if not c["quantise"] else f"{c['levels'][0]}^{len(c['levels'])}",
            "dims": len(c["levels"]), "codes": int(np.prod(c["levels"])) if c["quantise"] else "-",
            "train_h": round(hours, 2), "epochs": c["epochs"],
            "heldout_PER_%": round(r["heldout_per"] * 100, 2), "train300_PER_%": round(r["train300_per"] * 100, 2),
            "mel_L1": round(r["heldout_mel_l1"], 3), "used": u.get("used", "-"), "dead": u.get("dead", "-"),
            "perplexity": round(u["perplexity"]) if u else "-", "train_min": round(r["train_seconds"] / 60)}


@torch.no_grad()
def measure_frontend(args: argparse.Namespace, n_clips: int) -> dict:
    """128->80 conversion error vs a direct 80-bin log-mel, and the int8 feature ONNX vs the fp32
    encoder (relative L2 per tap), on the first ``n_clips`` held-out clips."""
    from . import export as X

    meta = S.read_meta(args.work / "features")
    if meta is None:
        raise SystemExit(f"error: no features in {args.work / 'features'}: run `tokenizer features` first")
    taps = tuple(meta["taps"])
    sess = X.session(args.work / meta["onnx"])
    matrix = torch.from_numpy(np.load(args.work / "mel128to80.npy"))
    graph = G.FeatureGraph(G.load_encoder(max(taps), taps), matrix.numpy()).eval()
    clips, _ = D.load_corpus(args.data)
    errs, maxes, rel = [], [], {t: [] for t in taps}
    for c in [c for c in clips if c.split == "heldout"][:n_clips]:
        audio = D.load_padded(args.data, c.id)
        mel128, direct = D.whisper_mel128(audio), torch.from_numpy(D.whisper_mel128(audio, 80))
        err = (G.convert_log_mel(torch.from_numpy(mel128), matrix) - direct).abs()
        errs.append(float(err.mean()))
        maxes.append(float(err.max()))
        ref = graph(torch.from_numpy(mel128), torch.tensor([mel128.shape[2]], dtype=torch.int32))
        for t, o, r in zip(taps, X.run(sess, mel128), ref):
            rel[t].append(float(np.linalg.norm(o - r.numpy()) / np.linalg.norm(r.numpy())))
    return {"clips": len(errs), "mel_conversion_mean_abs_err": float(np.mean(errs)),
            "mel_conversion_max_abs_err": float(np.max(maxes)),
            "int8_feature_rel_l2": {f"L{t}": float(np.mean(v)) for t, v in rel.items()}}
