"""Words spoken from their phonemes: a pronouncing lexicon beside a CosyVoice3 text tokenizer (specli's own file).

CosyVoice3's text vocabulary has one token per CMU phoneme (``[AA0]`` ... ``[ZH]``, :mod:`.text`), so a word can be
written as its phonemes (``hello`` -> ``[HH][AH0][L][OW1]``). A voice whose ``CosyVoice-BlankEN/`` directory holds
``lexicon.txt.gz`` (``word PH PH ...`` a line: lower-case words, one pronunciation each) was trained on text written
that way: every word the lexicon has is replaced by its phonemes before tokenizing; other words, punctuation,
spacing and inline tokens (``<|endofprompt|>``, ``[AA1]``, ``[breath]``) stay as written. Without the file, text is
tokenized as written (the official voices).
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

# CosyVoice3's English phoneme tokens, in upstream's order (``[AA]`` ... ``[ZH]``; vowels with and without stress)
CMU_PHONES = tuple(
    "AA AA0 AA1 AA2 AE AE0 AE1 AE2 AH AH0 AH1 AH2 AO AO0 AO1 AO2 AW AW0 AW1 AW2 AY AY0 AY1 AY2 B CH D DH "
    "EH EH0 EH1 EH2 ER ER0 ER1 ER2 EY EY0 EY1 EY2 F G HH IH IH0 IH1 IH2 IY IY0 IY1 IY2 JH K L M N NG OW OW0 "
    "OW1 OW2 OY OY0 OY1 OY2 P R S SH T TH UH UH0 UH1 UH2 UW UW0 UW1 UW2 V W Y Z ZH".split()
)
_KNOWN = frozenset(CMU_PHONES)
LEXICON = "lexicon.txt.gz"  # the file name inside a tokenizer directory
WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")  # a word: letters, inner apostrophes ("don't", "o'clock")
INLINE = re.compile(r"<\|[^|]*\|>|\[[^\]\s]*\]")  # special tokens written inline, never respelled


class LexiconError(ValueError):
    """A lexicon file that cannot be read (its path and line say where)."""


class Lexicon:
    """Word -> CMU phonemes; :meth:`spell` writes a text's known words as phoneme tokens."""

    def __init__(self, entries: Mapping[str, tuple[str, ...]]) -> None:
        bad = next(((w, p) for w, phones in entries.items() for p in phones if p not in _KNOWN), None)
        if bad is not None:
            raise LexiconError(f"{bad[0]!r}: {bad[1]!r} is not a CMU phoneme")
        self.entries = {w.lower(): tuple(p) for w, p in entries.items() if p}

    @classmethod
    def load(cls, path: Path) -> Lexicon:
        entries: dict[str, tuple[str, ...]] = {}
        try:
            with gzip.open(path, "rt", encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    fields = line.split()
                    if len(fields) < 2:
                        raise LexiconError(f"{path}:{n}: a word without phonemes")
                    entries[fields[0]] = tuple(fields[1:])
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise LexiconError(f"{path}: cannot read the lexicon: {exc}") from exc
        try:
            return cls(entries)
        except LexiconError as exc:
            raise LexiconError(f"{path}: {exc}") from exc

    def spell(self, text: str) -> str:
        """``text`` with every word the lexicon has written as its phoneme tokens; the rest as written."""
        out, pos = [], 0
        for m in INLINE.finditer(text):
            out += [WORD.sub(self._word, text[pos:m.start()]), m.group()]
            pos = m.end()
        out.append(WORD.sub(self._word, text[pos:]))
        return "".join(out)

    def _word(self, m: re.Match[str]) -> str:
        phones = self.entries.get(m.group().lower())
        return "".join(f"[{p}]" for p in phones) if phones else m.group()


def write_lexicon(entries: Iterable[tuple[str, tuple[str, ...]]], path: Path) -> None:
    """``entries`` (word, phonemes) as a lexicon file, sorted, byte-identical for the same entries."""
    entries = list(entries)
    Lexicon(dict(entries))  # checks the phonemes
    lines = sorted(f"{w.lower()} {' '.join(p)}\n" for w, p in entries)
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        f.write("".join(lines).encode("utf-8"))
