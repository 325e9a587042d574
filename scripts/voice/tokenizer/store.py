"""The features cache: shards of per-clip encoder features (fp16, at the token rate) and vocoder mels.

``<dir>/meta.json``: the feature ONNX's sha256, its tap layers; ``<dir>/shard_NNNNN.npz``: ``ids`` (clip
ids), ``n`` (tokens per clip), ``L<k>`` (``[sum n, 512]`` float16 per tap layer), ``mel``
(``[4 * sum n, 80]`` float16).  Shards are written atomically; a rerun adds shards for missing clips.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .graph import MEL_FRAMES_PER_TOKEN


def shard_paths(root: Path) -> list[Path]:
    return sorted(root.glob("shard_*.npz"))


def done_ids(root: Path) -> set[str]:
    out: set[str] = set()
    for p in shard_paths(root):
        with np.load(p) as z:
            out.update(str(x) for x in z["ids"])
    return out


def read_meta(root: Path) -> dict | None:
    """The features directory's ``meta.json`` (the feature graph and taps its shards were made by), or None."""
    path = root / "meta.json"
    return json.loads(path.read_text()) if path.is_file() else None


def check_meta(root: Path, meta: dict) -> None:
    """Create ``meta.json`` or refuse to mix shards made by a different feature graph."""
    root.mkdir(parents=True, exist_ok=True)
    old = read_meta(root)
    if old is not None:
        if old.get("onnx_sha256") != meta["onnx_sha256"] or old.get("taps") != meta["taps"]:
            raise SystemExit(f"error: {root} holds features of another graph ({old.get('onnx_sha256')}); "
                             "use another --features dir")
        return
    (root / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def check_taps(root: Path, taps: Sequence[int]) -> None:
    """Refuse, by name, tap layers the cached features do not hold (``features --taps`` chose them)."""
    have = (read_meta(root) or {"taps": []})["taps"]
    missing = [t for t in taps if t not in have]
    if missing:
        raise SystemExit(f"error: {root} holds encoder layers {have}, not {missing}: extract them first "
                         f"(tokenizer features --taps {','.join(map(str, sorted({*have, *taps})))}, a new "
                         "features directory)")


def write_shard(root: Path, rows: list[tuple[str, dict[str, np.ndarray], np.ndarray]]) -> Path:
    """rows: (clip id, {"L<k>": [n, d] float}, mel [4n, 80]) -> the next shard file."""
    index = len(shard_paths(root))
    path = root / f"shard_{index:05d}.npz"
    keys = sorted(rows[0][1])
    arrays = {k: np.concatenate([r[1][k] for r in rows]).astype(np.float16) for k in keys}
    arrays["mel"] = np.concatenate([r[2] for r in rows]).astype(np.float16)
    arrays["ids"] = np.array([r[0] for r in rows])
    arrays["n"] = np.array([len(r[2]) // MEL_FRAMES_PER_TOKEN for r in rows], dtype=np.int32)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    return path


@dataclass
class FeatureSet:
    """Features of a set of clips in memory: row ``offsets[i]:offsets[i] + n[i]`` is clip ``ids[i]``."""

    ids: list[str]
    n: np.ndarray  # [clips] int64
    offsets: np.ndarray  # [clips] int64, token rows
    feats: np.ndarray  # [tokens, 512 * taps] float16
    mel: np.ndarray  # [4 * tokens, 80] float16

    def clip(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, n = int(self.offsets[i]), int(self.n[i])
        return self.feats[a:a + n], self.mel[4 * a:4 * (a + n)]


def load_features(root: Path, layers: Sequence[int], want: set[str] | None = None) -> FeatureSet:
    """Load tap layers ``layers``, concatenated per token (``[tokens, 512 * len(layers)]``), and the mels of the
    clips in ``want`` (all when None)."""
    ids, ns, feats, mels = [], [], [], []
    for p in shard_paths(root):
        with np.load(p) as z:
            sid, sn = [str(x) for x in z["ids"]], z["n"].astype(np.int64)
            keep = np.array([want is None or i in want for i in sid])
            if not keep.any():
                continue
            f, m = np.concatenate([z[f"L{k}"] for k in layers], axis=1), z["mel"]
            starts = np.concatenate([[0], np.cumsum(sn)[:-1]])
            for i in np.flatnonzero(keep):
                a, n = starts[i], sn[i]
                ids.append(sid[i])
                ns.append(n)
                feats.append(f[a:a + n])
                mels.append(m[4 * a:4 * (a + n)])
    n = np.array(ns, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
    return FeatureSet(ids, n, offsets, np.concatenate(feats), np.concatenate(mels))
