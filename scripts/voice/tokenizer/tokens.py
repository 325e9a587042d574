"""The committed speech tokens of the voice corpus (``data/voice/tokens/tokens.npz``, written by
``python -m scripts.voice tokens`` through the shipped ONNX speech tokenizer): ids, split (0 train /
1 held-out), offsets into one uint16 token array."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def speech_tokens(split: str, path: Path) -> dict[str, np.ndarray]:
    """Clip id -> its speech tokens ``[n]`` (uint16) for ``split`` (``train`` or ``heldout``)."""
    want = {"train": 0, "heldout": 1}[split]
    with np.load(path) as z:
        ids, splits, offsets, tokens = z["ids"], z["split"], z["offsets"], z["tokens"]
    return {str(cid): tokens[offsets[i] : offsets[i + 1]] for i, cid in enumerate(ids) if int(splits[i]) == want}
