"""The committed speech tokens of the voice corpus (``data/voice/tokens/tokens.npz``, written by
``scripts/voice/tokenizer.py tokenize`` through the shipped ONNX speech tokenizer): ids, split (0 train /
1 held-out), offsets into one uint16 token array."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from common import REPO

TOKENS = REPO / "data" / "voice" / "tokens" / "tokens.npz"


def speech_tokens(split: str, path: Path = TOKENS) -> dict[str, np.ndarray]:
    """Clip id -> its speech tokens ``[n]`` (uint16) for ``split`` (``train`` or ``heldout``)."""
    want = {"train": 0, "heldout": 1}[split]
    with np.load(path) as z:
        ids, splits, offsets, tokens = z["ids"], z["split"], z["offsets"], z["tokens"]
    return {str(cid): tokens[offsets[i] : offsets[i + 1]] for i, cid in enumerate(ids) if int(splits[i]) == want}


def onnx_sha256(path: Path = TOKENS) -> str:
    """The sha256 of the ONNX speech tokenizer the tokens were made with."""
    with np.load(path) as z:
        return str(z["onnx_sha256"])
