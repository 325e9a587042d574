"""Spoken-language detection from the model's language-token probabilities."""

from __future__ import annotations

import torch

from specli.engines.targets.tokenizer import WhisperSpecialTokens
from specli.engines.targets.whisper import DecoderState
from specli.engines.types import Target


def detect_language(target: Target, state: DecoderState, special: WhisperSpecialTokens) -> dict[str, float]:
    """Probabilities of each language after ``<|startoftranscript|>``, most likely first.

    Scores one token on ``state`` and rolls the cache back afterwards.
    """
    if not special.multilingual or not special.languages:
        raise ValueError("this model has no language tokens")
    start = state.cache.length
    logits = target.score(state, torch.tensor([[special.sot]])).logits[0, -1]
    state.cache.crop(start)
    codes = list(special.languages)
    ids = torch.tensor([special.languages[c] for c in codes])
    probs = logits[ids].softmax(-1)
    order = probs.argsort(descending=True).tolist()
    return {codes[i]: float(probs[i]) for i in order}
