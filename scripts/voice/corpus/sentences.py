"""The corpus's sentences: Debian's fortunes, then WordNet 3.0's usage examples and, on request, its definitions
(corpus/wordnet.py), cleaned,
checked and put in a fixed order; piper speaks them (corpus/piper.py), texts.py gives them without audio.

Selection (deterministic): entries are cleaned (attributions ``-- Author``
dropped; entries that look like code, lists, tables or speaker-labelled
dialogue dropped), split into sentences, normalised (whitespace, curly to
straight quotes) and kept only if they have 3-25 words made of plain English
letters and ``. , ? ! ' " ; : -``.  Any sentence with a digit or another symbol
is DROPPED (numbers are never spelled out: the voice never sees digits), as
is any sentence with a run of two or more capitals (ALL-CAPS shouting and
acronyms), and any sentence of which 40% or more of the words are not in
Debian's wamerican word list (Latin, German, Italian, gibberish, which pass
the character checks).  Sentences are deduplicated case-insensitively and
ordered by the sha1 of their text.  Sentences whose sha1 starts with
``HELDOUT_PREFIXES`` form the held-out pool (first ``--heldout`` of it in sha1
order); the rest is taken in sha1 order, then WordNet's examples outside the
held-out range and not among the fortunes (sha1 order), then (``--glosses``)
WordNet's definitions not among either (sha1 order), until ``--hours`` of
training audio are reached.  The held-out set is the fortunes' alone.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

FORTUNE_DIR = Path("/usr/share/games/fortunes")
# ascii-art is pictures; translate-me is Latin.
EXCLUDED_FORTUNE_FILES = frozenset({"ascii-art", "translate-me"})
# Debian wamerican (SCOWL word list, permissive licence): filters out the Latin,
# German, Italian and gibberish sentences that pass the character checks.
WORDLIST = Path("/usr/share/dict/american-english")
# Debian wordnet-base: WordNet 3.0's usage examples, the second text source (corpus/wordnet.py).
WORDNET_DIR = Path("/usr/share/wordnet")
MAX_UNKNOWN_WORDS = 0.4  # drop a sentence if this share of its words is not in WORDLIST
# sha1 hex prefixes of the held-out range (fixed: 5/256 of the sha1 space).
HELDOUT_PREFIXES = ("fb", "fc", "fd", "fe", "ff")
MIN_WORDS, MAX_WORDS = 3, 25

QUOTE_MAP = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
    "`": "'", "\u00a0": " ",
})
ALLOWED = re.compile(r"[A-Za-z .,?!'\";:-]+")
CAPS_RUN = re.compile(r"[A-Z]{2}")
ATTRIBUTION = re.compile(r"^\s*(--|\u2014)\s*\S")
SPEAKER_LABEL = re.compile(r"^\s*(<[^>]+>|[A-Z][A-Za-z.' ]{0,24}:)\s")
LIST_ITEM = re.compile(r"^\s*([-*+o#>|]|\(?[0-9a-zA-Z]{1,3}[.)])\s+\S")
CODE_CHARS = re.compile(r"[{}\[\]<>=$#@\\|_~^&*/+\x08%]")
TABLE_GAP = re.compile(r"\S(\t| {4,})\S")
ABBREVIATIONS = frozenset(
    "mr mrs ms dr st jr sr vs etc prof rev gen col capt lt sgt mt ft "
    "e.g i.e a.m p.m u.s inc ltd".split()
)
WORD_END = re.compile(r"[.!?]+[\"')]*$")


def read_entries(path: Path) -> list[str]:
    """Split one strfile-format fortune file into its entries."""
    raw = path.read_bytes().decode("utf-8", errors="replace")
    entries, cur = [], []
    for line in raw.splitlines():
        if line.strip() == "%":
            entries.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    entries.append("\n".join(cur))
    return [e for e in entries if e.strip()]


def clean_entry(entry: str) -> str | None:
    """Drop attributions; return the prose of an entry, or None if it is not prose."""
    lines = entry.translate(QUOTE_MAP).splitlines()
    for i, line in enumerate(lines):
        if ATTRIBUTION.match(line):
            lines = lines[:i]
            break
    lines = [ln.rstrip() for ln in lines if ln.strip()]
    if not lines:
        return None
    body = "\n".join(lines)
    if CODE_CHARS.search(body):
        return None  # code, markup, e-mail headers, IRC logs, ascii art
    if any(SPEAKER_LABEL.match(ln) for ln in lines):
        return None  # "Q: ...", "Kirk: ...", "<nick> ..." dialogue
    if sum(bool(LIST_ITEM.match(ln)) for ln in lines) >= 2:
        return None
    if any(TABLE_GAP.search(ln.strip()) for ln in lines):
        return None  # columns / definitions laid out with tab gaps
    return " ".join(ln.strip() for ln in lines)


def split_sentences(text: str) -> list[str]:
    """Split prose at . ! ? word ends, not after common abbreviations or initials."""
    text = re.sub(r"''", '"', text)
    words = text.split()
    out, cur = [], []
    for i, word in enumerate(words):
        cur.append(word)
        if not WORD_END.search(word):
            continue
        core = word.strip("\"'()").rstrip(".!?").lower()
        if word.endswith(".") and (core in ABBREVIATIONS or re.fullmatch(r"[a-z]", core)):
            continue
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if nxt and not re.match(r"[\"'(]*[A-Z]", nxt):
            continue  # "... said he. and" / "...!" followed by lower case: no split
        out.append(" ".join(cur))
        cur = []
    if cur:
        out.append(" ".join(cur))
    return out


def fix_quotes(s: str) -> str | None:
    """Balance double quotes by trimming a dangling one at either end."""
    if s.count('"') % 2 == 0:
        return s
    if s.startswith('"'):
        s = s[1:].lstrip()
    elif s.endswith('"'):
        s = s[:-1].rstrip()
    return s if s.count('"') % 2 == 0 else None


def normalise(s: str) -> str | None:
    """Return the normalised sentence, or None if it must be dropped."""
    s = re.sub(r"([!?])[!?]+", r"\1", " ".join(s.split()))  # "!!" / "?!" -> "!" / "?"
    s = fix_quotes(s) if s else None
    if not s or not ALLOWED.fullmatch(s) or CAPS_RUN.search(s):
        return None
    if any(bad in s for bad in ("--", " -", "- ", "..", "''", ".:")):
        return None  # dashes as pauses, ellipses, "word, n.:" definitions
    if re.search(r"\S*-\S*-\S*-", s):
        return None  # on-your-own-take-care-of-yourself compounds
    if not re.match(r"^\"?[A-Z]", s) or not re.search(r"[.!?]['\"]?$", s):
        return None  # fragments: must look like a whole sentence
    words = [w for w in s.split() if re.search(r"[A-Za-z]", w)]
    if not MIN_WORDS <= len(words) <= MAX_WORDS or len(words) != len(s.split()):
        return None
    return s


def fortune_files(fortune_dir: Path) -> list[Path]:
    """The strfile text files (not .dat indexes or .u8 links), minus the excluded ones."""
    files = sorted(p for p in fortune_dir.glob("*") if p.is_file() and not p.is_symlink()
                   and "." not in p.name and p.name not in EXCLUDED_FORTUNE_FILES)
    if not files:
        raise SystemExit(f"error: no fortune files in {fortune_dir}; "
                         "run: apt-get install -y fortunes fortunes-min")
    return files


def load_wordlist(path: Path) -> frozenset[str]:
    if not path.is_file():
        raise SystemExit(f"error: word list {path} missing; run: apt-get install -y wamerican")
    return frozenset(w.strip().lower() for w in path.read_text(encoding="utf-8").splitlines())


def mostly_english(s: str, words: frozenset[str]) -> bool:
    """True unless MAX_UNKNOWN_WORDS or more of the words are not in the word list."""
    tokens = [w.lower() for w in re.findall(r"[A-Za-z]+(?:'[A-Za-z]+)*", s)]
    unknown = [w for w in tokens if w not in words and w.split("'")[0] not in words]
    return len(unknown) < MAX_UNKNOWN_WORDS * len(tokens)


def fortune_candidates(fortune_dir: Path) -> Iterator[str]:
    """Every sentence of every cleaned entry of the fortune files, unchecked."""
    for path in fortune_files(fortune_dir):
        for entry in read_entries(path):
            prose = clean_entry(entry)
            if prose:
                yield from split_sentences(prose)


def usable(candidates: Iterable[str], words: frozenset[str]) -> dict[str, str]:
    """The candidates that :func:`normalise` keeps and :func:`mostly_english` accepts, keyed by sha1;
    case-insensitive duplicates merged (the smallest variant kept, whatever the order)."""
    by_key: dict[str, str] = {}
    for raw in candidates:
        s = normalise(raw)
        if s is None or not mostly_english(s, words):
            continue
        key = s.lower()
        if key not in by_key or s < by_key[key]:
            by_key[key] = s
    return {sha1(s): s for s in by_key.values()}


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Selection:
    """The sentence pools in sha1 order."""

    heldout: list[tuple[str, str]]  # (sha1, text)
    train_pool: list[tuple[str, str]]  # the fortunes', then each extra source's in turn
    candidates: int  # fortune sentences
    heldout_pool: int  # fortune sentences in the held-out range
    extra: int = 0  # sentences of the extra sources at the end of train_pool


def select(sentences: dict[str, str], heldout_size: int, *extras: dict[str, str]) -> Selection:
    """Split sha1-ordered sentences into the fixed held-out range and the rest; then each ``extras`` source's
    sentences (sha1 order, one source after the other) join the training pool after them, except those in the
    held-out range (so the held-out set never changes) and those already in the pool (case-insensitively)."""
    ordered = sorted(sentences.items())
    in_range = [kv for kv in ordered if kv[0].startswith(HELDOUT_PREFIXES)]
    train_pool = [kv for kv in ordered if not kv[0].startswith(HELDOUT_PREFIXES)]
    seen = {text.lower() for text in sentences.values()}
    more: list[tuple[str, str]] = []
    for extra in extras:
        added = sorted(kv for kv in extra.items() if not kv[0].startswith(HELDOUT_PREFIXES)
                       and kv[1].lower() not in seen)
        seen |= {text.lower() for _sha, text in added}
        more += added
    # Range members beyond heldout_size are used for neither split.
    return Selection(in_range[:heldout_size], train_pool + more, len(ordered), len(in_range), len(more))


def pool(fortunes: Path, wordlist: Path, heldout_size: int, wordnet: Path | None, glosses: bool = False) -> Selection:
    """The corpus's sentences: the fortunes' (held-out range and training pool), then, with ``wordnet`` (its data
    directory; None: fortunes only), WordNet's usage examples, then with ``glosses`` its definitions
    (corpus/wordnet.py)."""
    from .wordnet import collect  # it builds on this module's checks

    if glosses and wordnet is None:
        raise ValueError("WordNet's glosses need its data directory")
    words = load_wordlist(wordlist)
    extras = [] if wordnet is None else collect(wordnet, words, glosses)
    return select(usable(fortune_candidates(fortunes), words), heldout_size, *extras)
