"""The committed speech tokens of the voice corpus (``data/voice/tokens/tokens.npz``, written by
``python -m scripts.voice tokens`` through the shipped ONNX speech tokenizer): ids, split (0 train /
1 held-out), offsets into one uint16 token array, and each clip's audio length in seconds (``seconds``: the corpus
can then count a clip as spoken without its wav, ``corpus --spoken``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse

MAX_LENGTH_MISMATCH = 0.01  # share of shared clips whose token counts may differ (piper's float path, another CPU)
SPLIT_CODES = {"train": 0, "heldout": 1}  # a clip's split -> its code in the file's ``split`` array


def speech_tokens(split: str, path: Path) -> dict[str, np.ndarray]:
    """Clip id -> its speech tokens ``[n]`` (uint16) for ``split`` (``train`` or ``heldout``)."""
    want = SPLIT_CODES[split]
    with np.load(path) as z:
        ids, splits, offsets, tokens = z["ids"], z["split"], z["offsets"], z["tokens"]
    return {str(cid): tokens[offsets[i] : offsets[i + 1]] for i, cid in enumerate(ids) if int(splits[i]) == want}


def clip_records(path: Path) -> dict[str, tuple[str, float | None]]:
    """Clip id -> (split, seconds) for every clip of a tokens file; seconds is None in a file written before they
    were recorded. The one reader of a tokens file's clip list, for ``corpus --spoken`` and ``tokenize``."""
    with np.load(path) as z:
        ids, splits = z["ids"], z["split"]
        seconds = z["seconds"].tolist() if "seconds" in z.files else [None] * len(ids)
    names = {code: name for name, code in SPLIT_CODES.items()}
    return {str(cid): (names[int(s)], sec) for cid, s, sec in zip(ids, splits, seconds)}


def spoken_seconds(path: Path, split: str = "train") -> dict[str, float]:
    """Clip id -> its audio's length in seconds, for the ``split`` clips of a tokens file (its ``seconds`` array; a
    file written before it existed is an error that says so)."""
    if split not in SPLIT_CODES:
        raise ValueError(f"split {split!r}: train or heldout")
    records = clip_records(path)
    if any(sec is None for _, sec in records.values()):
        raise SystemExit(f"error: {path} records no clip lengths (made before `tokens` wrote them): "
                         "it cannot stand in for the clips' audio")
    return {cid: float(sec) for cid, (s, sec) in records.items() if s == split}


def cooccurrence(old_npz: Path, new_npz: Path, n_old: int, n_new: int) -> scipy.sparse.csr_matrix:
    """``[n_new, n_old]`` counts (sparse) of (new code, old code) at the same position of the same training clip.

    Two tokenizers of the same rate give every clip the same number of tokens, position i covering the same 4 mel
    frames. Piper on another CPU ends a few clips a token earlier or later (2 of 17,201 on a Zen 3 against the Zen 5
    the committed tokens came from): such clips are left out while they are at most ``MAX_LENGTH_MISMATCH`` of the
    shared ones; more is an error (the files were not made from the same corpus). Sparse: a 3^10
    codebook against 3^8 is 387M pairs, of which a corpus fills at most one a token."""
    old, new = speech_tokens("train", old_npz), speech_tokens("train", new_npz)
    shared = sorted(old.keys() & new.keys())
    if not shared:
        raise SystemExit(f"error: {old_npz} and {new_npz} share no training clip")
    bad = [cid for cid in shared if len(old[cid]) != len(new[cid])]
    if len(bad) > MAX_LENGTH_MISMATCH * len(shared):
        raise SystemExit(f"error: {len(bad)} of {len(shared)} clips have another token count in {new_npz} (e.g. "
                         f"{bad[0]}): not the same corpus at the same rate")
    shared = [cid for cid in shared if len(old[cid]) == len(new[cid])]
    a = np.concatenate([old[c] for c in shared]).astype(np.int64)
    b = np.concatenate([new[c] for c in shared]).astype(np.int64)
    if a.max() >= n_old or b.max() >= n_new:
        raise SystemExit(f"error: codes past the codebooks ({a.max()} of {n_old}, {b.max()} of {n_new})")
    return scipy.sparse.csr_matrix((np.ones(len(a)), (b, a)), shape=(n_new, n_old))  # duplicates are summed


def never_seen(counts: scipy.sparse.csr_matrix) -> np.ndarray:
    """``[n_new]`` bool: the new codes that co-occur with no old code (:func:`cooccurrence`)."""
    return np.asarray(counts.sum(axis=1)).ravel() == 0


def remap_rows(weight: np.ndarray, counts: scipy.sparse.csr_matrix) -> np.ndarray:
    """Rows for a new codebook from an old one's ``weight [n_old, D]``: each new code's row is the mean of the old
    rows it co-occurred with (``counts [n_new, n_old]``); a code never seen gets the mean of all old rows."""
    total = np.asarray(counts.sum(axis=1)).reshape(-1, 1)
    rows = np.asarray(counts @ weight.astype(np.float64)) / np.maximum(total, 1.0)
    rows[never_seen(counts)] = weight.mean(axis=0)
    return rows.astype(weight.dtype)
