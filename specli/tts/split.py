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


def split_to_fit(text: str, fits: Callable[[str], bool], level: int = 0) -> list[str]:
    """``text`` as pieces (stripped) that each ``fits``: itself when it fits, else cut at sentence, clause, then
    word boundaries, adjacent parts packed while they fit. :class:`Unsplittable` names a part that cannot be cut."""
    text = text.strip()
    if fits(text):
        return [text]
    if level == len(_LEVELS):
        raise Unsplittable(text)
    pieces: list[str] = []
    current = ""
    for part in _cut(text, _LEVELS[level][1]):
        if current and fits((current + part).strip()):
            current += part
            continue
        if current:
            pieces += split_to_fit(current, fits, level + 1)
        current = part
    pieces += split_to_fit(current, fits, level + 1)
    return pieces
