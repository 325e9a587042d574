"""Long lines in pieces that fit the model, as CosyVoice's frontend splits a paragraph (``text_normalize(...,
split=True)``: cut after sentence punctuation, then, for a sentence still too long, after clause punctuation and
commas; here words come last). Adjacent parts are packed into the longest pieces that still fit, so a line is cut
only where it must be; the pieces are spoken one by one and their audio joined (upstream concatenates the speech of
its pieces the same way, without a gap)."""

from __future__ import annotations

import re
from collections.abc import Callable

# where a cut may go, coarsest first; each cut keeps the punctuation and the spaces after it with the part before
_LEVELS = (
    ("sentence", re.compile(r"[.!?;:…]+[\"'”’)\]]*\s+|[。！？；：]+[”’」』）]*\s*")),
    ("clause", re.compile(r"[,—–]+\s+|[，、]\s*|—")),
    ("word", re.compile(r"\s+")),
)


class Unsplittable(ValueError):
    """A part of the text that does not fit and has no sentence, clause or word boundary left to cut at."""

    def __init__(self, part: str) -> None:
        super().__init__(part)
        self.part = part  # the part that cannot be cut further


def _cut(text: str, pattern: re.Pattern[str]) -> list[str]:
    """``text`` cut after each match of ``pattern`` (the parts join back to ``text``; none is blank)."""
    parts, start = [], 0
    for m in pattern.finditer(text):
        if m.end() > start and text[start:m.end()].strip() and text[m.end():].strip():
            parts.append(text[start:m.end()])
            start = m.end()
    parts.append(text[start:])
    return parts


def split_to_fit(text: str, fits: Callable[[str], bool], level: int = 0, words: bool = True) -> list[str]:
    """``text`` as pieces (stripped) that each ``fits``: itself when it fits, else cut at sentence, clause, then
    word boundaries, adjacent parts packed while they fit. :class:`Unsplittable` names a part that cannot be cut.
    ``words=False`` never cuts between words: a clause that does not fit is a piece of its own, whole."""
    text = text.strip()
    if fits(text):
        return [text]
    if level == len(_LEVELS) - (0 if words else 1):
        if words:
            raise Unsplittable(text)
        return [text]
    pieces: list[str] = []
    current = ""
    for part in _cut(text, _LEVELS[level][1]):
        if current and fits((current + part).strip()):
            current += part
            continue
        if current:
            pieces += split_to_fit(current, fits, level + 1, words)
        current = part
    pieces += split_to_fit(current, fits, level + 1, words)
    return pieces


def short_pieces(text: str, max_words: int) -> list[str]:
    """``text`` cut after sentence, then clause punctuation into pieces of at most ``max_words`` words where it can
    be (adjacent parts packed; a longer clause stays whole, never cut between words): a voice's own piece length
    (``max_piece_words``: a small LM loses words in long sentences). ``max_words`` 0: ``[text]``."""
    if max_words < 0:
        raise ValueError("max_words must be >= 0")
    if not max_words:
        return [text.strip()]
    pieces: list[str] = []
    for piece in split_to_fit(text, lambda t: len(t.split()) <= max_words, words=False):
        if pieces and not re.search(r"\w", piece):
            pieces[-1] += " " + piece  # nothing to speak on its own (a quote mark, a dash)
        else:
            pieces.append(piece)
    return pieces
