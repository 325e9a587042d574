"""Word and character error rates with a simple text normaliser (written here, no dependencies)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

_PUNCT = re.compile(r"[^\w\s']|_")
_SPACES = re.compile(r"\s+")


def normalize(text: str) -> str:
    """Lower-case, strip punctuation (apostrophes inside words kept), collapse spaces."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = _PUNCT.sub(" ", text)
    text = re.sub(r"(?<!\w)'|'(?!\w)", " ", text)  # quotes, not contractions
    return _SPACES.sub(" ", text).strip()


def edit_distance(ref: Sequence, hyp: Sequence) -> int:
    """Levenshtein distance (substitutions, insertions, deletions all cost 1)."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


@dataclass(frozen=True)
class ErrorCounts:
    """Edits and reference length, summable over utterances."""

    word_edits: int  # word-level Levenshtein distance
    words: int  # reference words
    char_edits: int  # character-level distance (spaces included, normalised text)
    chars: int  # reference characters

    def __add__(self, other: ErrorCounts) -> ErrorCounts:
        return ErrorCounts(self.word_edits + other.word_edits, self.words + other.words,
                           self.char_edits + other.char_edits, self.chars + other.chars)

    @property
    def wer(self) -> float:
        return self.word_edits / self.words if self.words else 0.0

    @property
    def cer(self) -> float:
        return self.char_edits / self.chars if self.chars else 0.0


def error_counts(reference: str, hypothesis: str) -> ErrorCounts:
    """Word and character edits of ``hypothesis`` against ``reference``, both normalised."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    return ErrorCounts(edit_distance(ref.split(), hyp.split()), len(ref.split()),
                       edit_distance(ref, hyp), len(ref))


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate of one utterance."""
    return error_counts(reference, hypothesis).wer


def cer(reference: str, hypothesis: str) -> float:
    """Character error rate of one utterance."""
    return error_counts(reference, hypothesis).cer
