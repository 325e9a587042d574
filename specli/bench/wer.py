"""Word and character error rates as published Whisper figures compute them.

Text is normalised with Whisper's own normalisers (PyPI ``whisper-normalizer``, a copy of
``openai/whisper``'s): ``EnglishTextNormalizer`` for English (spelling variants, numbers, contractions,
fillers) and ``BasicTextNormalizer`` for every other language, as in Whisper's evaluations. Edits are
counted by ``jiwer`` on the normalised text; counts add up over utterances (corpus WER = summed edits /
summed reference words). Both packages come with ``pip install 'specli[bench]'``.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

INSTALL_HINT = "pip install 'specli[bench]'"
_PACKAGES = {"jiwer": "jiwer", "whisper_normalizer": "whisper-normalizer"}
_SPACES = re.compile(r"\s+")


class WerPackagesMissing(ImportError):
    """jiwer or whisper-normalizer is not installed."""


def missing_packages() -> list[str]:
    """PyPI names of the scoring packages that are not installed."""
    return [dist for module, dist in _PACKAGES.items() if importlib.util.find_spec(module) is None]


def require() -> None:
    """Raise :class:`WerPackagesMissing` (naming the install command) unless both packages import."""
    missing = missing_packages()
    if missing:
        raise WerPackagesMissing(f"WER scoring needs {', '.join(missing)}: {INSTALL_HINT}")


@functools.cache
def _normalizer(english: bool) -> Callable[[str], str]:
    require()
    if english:
        from whisper_normalizer.english import EnglishTextNormalizer

        return EnglishTextNormalizer()
    from whisper_normalizer.basic import BasicTextNormalizer

    return BasicTextNormalizer()


def is_english(language: str | None) -> bool:
    """English normaliser for ``en`` (and for an unknown language, as for English-only models)."""
    return language is None or language.lower().split("-")[0] in ("en", "english")


def normalize(text: str, language: str | None = None) -> str:
    """Whisper's normaliser for ``language`` (English one for ``en`` / ``None``), spaces collapsed."""
    return _SPACES.sub(" ", _normalizer(is_english(language))(text)).strip()


@dataclass(frozen=True)
class ErrorCounts:
    """Edits and reference length, summable over utterances."""

    word_edits: int  # word substitutions + deletions + insertions
    words: int  # reference words
    char_edits: int  # character-level edits (spaces included, normalised text)
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


def _edits(out) -> tuple[int, int]:  # noqa: ANN001 - jiwer's WordOutput / CharacterOutput
    """(substitutions + deletions + insertions, reference length) of a jiwer alignment."""
    return (out.substitutions + out.deletions + out.insertions,
            out.hits + out.substitutions + out.deletions)


def error_counts(reference: str, hypothesis: str, language: str | None = None) -> ErrorCounts:
    """Word and character edits of ``hypothesis`` against ``reference``, both normalised first."""
    require()
    import jiwer

    ref, hyp = normalize(reference, language), normalize(hypothesis, language)
    if not ref:  # nothing to align against (older jiwer refuses an empty reference): all insertions
        return ErrorCounts(len(hyp.split()), 0, len(hyp), 0)
    word_edits, words = _edits(jiwer.process_words([ref], [hyp]))
    char_edits, chars = _edits(jiwer.process_characters([ref], [hyp]))
    return ErrorCounts(word_edits, words, char_edits, chars)


def wer(reference: str, hypothesis: str, language: str | None = None) -> float:
    """Word error rate of one utterance."""
    return error_counts(reference, hypothesis, language).wer


def cer(reference: str, hypothesis: str, language: str | None = None) -> float:
    """Character error rate of one utterance."""
    return error_counts(reference, hypothesis, language).cer


def paired_wer_diff(a: Sequence[ErrorCounts], b: Sequence[ErrorCounts], draws: int = 2000,
                    seed: int = 0) -> dict:
    """WER(b) - WER(a) of two systems on the same utterances (``a[i]`` and ``b[i]`` one utterance) and its 95%
    interval by a paired bootstrap: utterances resampled with replacement, both systems' edits summed over the same
    draw. ``better`` / ``worse``: utterances with fewer / more word edits in ``b``."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired_wer_diff needs two equal, non-empty lists (got {len(a)} and {len(b)})")
    import numpy as np

    ea, eb = (np.array([[c.word_edits, c.words] for c in x], dtype=np.float64) for x in (a, b))
    if not ea[:, 1].sum():
        raise ValueError("paired_wer_diff: the references have no words")
    idx = np.random.default_rng(seed).integers(0, len(a), size=(draws, len(a)))  # [draws, utterances]
    words = np.maximum(ea[idx, 1].sum(1), 1.0)  # a draw of only empty references counts 0 edits / 1 word
    diff = (eb[idx, 0].sum(1) - ea[idx, 0].sum(1)) / words
    point = (eb[:, 0].sum() - ea[:, 0].sum()) / ea[:, 1].sum()
    return {"wer_diff": round(float(point), 4),
            "ci95": [round(float(np.percentile(diff, q)), 4) for q in (2.5, 97.5)],
            "better": int((eb[:, 0] < ea[:, 0]).sum()), "worse": int((eb[:, 0] > ea[:, 0]).sum()), "draws": draws}
