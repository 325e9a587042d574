"""A loaded Whisper model's languages: what its tokens can express, and language detection at ``<|startoftranscript|>``."""

from __future__ import annotations

import torch

from specli.models.whisper.tokenizer import WhisperSpecialTokens
from specli.models.whisper.target import DecoderState
from specli.core.types import Target
from specli.errors import UsageError
from specli.models.languages import LANGUAGES, english_only_problem

def check_model_support(special: WhisperSpecialTokens, model: str, task: str, language: str | None) -> None:
    """After loading: reject a task or language the model's tokens cannot express (exit 2)."""
    if not special.multilingual:
        problem = english_only_problem(model, task, language)
        if problem:
            raise UsageError(problem)
    elif language is not None and language not in special.languages:
        raise UsageError(f"model {model!r} has no language token for {language!r} ({LANGUAGES.get(language)})")


def detect_language(target: Target, state: DecoderState, special: WhisperSpecialTokens) -> dict[str, float]:
    """Probabilities of each language after ``<|startoftranscript|>``, most likely first.

    Scores one token on ``state`` and rolls the cache back afterwards.
    """
    if not special.multilingual or not special.languages:
        raise ValueError("this model has no language tokens")
    start = state.cache.length
    device = state.cache.keys.device
    logits = target.score(state, torch.tensor([[special.sot]], device=device)).logits[0, -1]
    state.cache.crop(start)
    codes = list(special.languages)
    ids = torch.tensor([special.languages[c] for c in codes], device=logits.device)
    probs = logits[ids].softmax(-1)
    order = probs.argsort(descending=True).tolist()
    return {codes[i]: float(probs[i]) for i in order}
