"""The corpus's sentences without its audio: the training pool (sha1 order, the sentences the voice was trained on
first, then WordNet's examples) or the held-out range, exactly as the piper corpus selects them (``sentences.py``).

``python -m scripts.voice corpus --work DIR --text-only`` writes the text-only corpus for LM work (no audio
synthesised): ``<work>/text/{train,heldout}.jsonl``, one ``{"id", "text", "tokens"}`` a line (``tokens``: the
sentence's text ids through the voice's text tokenizer, as the LM reads them), and ``meta.json``, whose fingerprint
(sentences and tokenizer) lets a rerun leave an up-to-date corpus alone. The drafters are distilled on the training
pool and benchmarked on held-out sentences (``{"id", "text"}`` lines of :func:`write_jsonl`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from specli.io.atomic import write_atomic_with

from ..common import log
from . import sentences as selection

SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class Source:
    """Where the sentences come from (the piper corpus's selection)."""

    fortunes: Path = selection.FORTUNE_DIR  # the Debian fortune files
    wordlist: Path = selection.WORDLIST  # the word list that drops non-English sentences
    heldout: int = 300  # sentences of the held-out range (the piper corpus's --heldout)
    wordnet: Path | None = selection.WORDNET_DIR  # WordNet's data files (its examples follow the fortunes); None: none
    glosses: bool = False  # WordNet's definitions follow its examples (needs ``wordnet``)


def sentences(split: str, source: Source = Source()) -> list[tuple[str, str]]:
    """``(sha1[:12], text)`` of ``split`` ("train": the training pool, "heldout": the held-out range)."""
    sel = selection.pool(source.fortunes, source.wordlist, source.heldout, source.wordnet, source.glosses)
    rows = sel.train_pool if split == "train" else sel.heldout
    return [(sha[:12], text) for sha, text in rows]


def write_jsonl(rows: list[dict], out: Path) -> None:
    """One JSON object a line, written atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
    write_atomic_with(out, lambda fh: fh.write(data))


def _digest(parts: list[str]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def build_text_corpus(out: Path, blank: Path, source: Source = Source()) -> bool:
    """The text-only corpus in ``out`` with text ids of the tokenizer ``blank``; False when it was already there
    (the same sentences and tokenizer), True when it was (re)written."""
    split_rows = {split: sentences(split, source) for split in SPLITS}
    tok_files = sorted(p for p in blank.iterdir() if p.is_file())
    fingerprint = {"sentences": _digest([f"{i}\t{t}" for s in SPLITS for i, t in split_rows[s]]),
                   "tokenizer": _digest([f"{p.name}\t{hashlib.sha256(p.read_bytes()).hexdigest()}" for p in tok_files]),
                   "counts": {s: len(split_rows[s]) for s in SPLITS}}
    meta = out / "meta.json"
    if meta.is_file() and json.loads(meta.read_text(encoding="utf-8")) == fingerprint and all(
            (out / f"{s}.jsonl").is_file() for s in SPLITS):
        log(f"text corpus: {out} is up to date ({fingerprint['counts']})")
        return False
    from specli.models.cosyvoice.text import CosyVoiceTokenizer

    tok = CosyVoiceTokenizer(blank, "cosyvoice3")
    for split in SPLITS:
        rows = [{"id": i, "text": t, "tokens": tok.encode(t)} for i, t in split_rows[split]]
        write_jsonl(rows, out / f"{split}.jsonl")
    write_jsonl([fingerprint], meta)  # last: a corpus interrupted before it is rebuilt
    log(f"text corpus: {out}: {fingerprint['counts']} sentences with text tokens of {blank}")
    return True
