"""The corpus's second and third text sources: the usage examples of WordNet 3.0 (Debian ``wordnet-base``), then,
on request (``corpus --glosses``), its definitions.

Each synset line of ``data.noun`` / ``data.verb`` / ``data.adj`` / ``data.adv`` ends with a gloss after ``" | "``:
definitions, then examples in double quotes (``"he ate his breakfast quickly"``). Every example becomes a sentence
candidate: trailing ``, ; :`` dropped, first letter capitalised, a full stop added where it has no ``. ! ?``, then the
fortunes' own checks (``sentences.normalise``: 3-25 words of plain letters, no digits, no capital runs;
``mostly_english`` against wamerican). ~40,600 examples pass (~258k words, ~27 h of piper audio), three times the
fortunes' pool; many are phrases rather than whole sentences ("A furtive manner."), which reads fine aloud.
The definitions are the gloss without its examples, split at ``;`` ("a scarf worn around the neck; ..." -> "A scarf
worn around the neck."), through the same checks: ~106,400 pass, 104,329 of them new to the pool (~889k words,
~80 h of piper audio: the first 26,421 made 20.8 h).

Licence: WordNet 3.0 (Princeton University), permission to use, copy, modify and distribute for any purpose without
fee, provided the copyright notice and disclaimer appear on all copies (Debian's copyright file carries them). As
for the fortunes, no text or audio is committed, only sentence hashes and speech tokens.

    apt-get install -y wordnet-base
"""

from __future__ import annotations

import re
from pathlib import Path

from . import sentences

FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
EXAMPLE = re.compile(r'"([^"]+)"')


def as_sentence(example: str) -> str | None:
    """A usage example as a candidate sentence (``"he ran home"`` -> ``"He ran home."``), None when it is empty."""
    s = example.strip().rstrip(",;: ").strip()
    if not s:
        return None
    s = s[0].upper() + s[1:]
    return s if re.search(r"[.!?]$", s) else s + "."


def glosses(wordnet_dir: Path) -> list[str]:
    """The gloss of every synset of the four data files (definitions, then quoted examples), in file order."""
    missing = [name for name in FILES if not (wordnet_dir / name).is_file()]
    if missing:
        raise SystemExit(f"error: {', '.join(missing)} missing in {wordnet_dir}; run: apt-get install -y wordnet-base")
    out = []
    for name in FILES:
        for line in (wordnet_dir / name).read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("  ") or " | " not in line:
                continue  # the licence header, or a synset without a gloss
            out.append(line.split(" | ", 1)[1])
    return out


def examples(gloss: str) -> list[str]:
    """A gloss's quoted usage examples."""
    return EXAMPLE.findall(gloss)


def definitions(gloss: str) -> list[str]:
    """A gloss's definitions: the gloss without its quoted examples, split at ``;``."""
    return EXAMPLE.sub("", gloss).split(";")


def collect(wordnet_dir: Path, words: frozenset[str], with_definitions: bool = False) -> list[dict[str, str]]:
    """The usable examples, then with ``with_definitions`` the usable definitions, each source keyed by sha1 (the
    fortunes' checks and merging against the word list ``words``: ``sentences.usable``); the files are read once."""
    all_glosses = glosses(wordnet_dir)
    parts = (examples, definitions) if with_definitions else (examples,)
    return [sentences.usable((s for s in map(as_sentence, (x for g in all_glosses for x in part(g))) if s), words)
            for part in parts]
