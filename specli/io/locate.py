"""Find a model directory offline: the one place specli looks for models and reads where they are kept.

A name is looked up, in order, as

1. a directory path, as given (it must hold the required files; a name that reads as a path, ``/...``,
   ``./...``, ``~/...``, is looked for nowhere else);
2. a directory specli ships (a family's own, e.g. the EAGLE heads in ``specli/heads``);
3. ``$SPECLI_MODELS_DIR/<name>``, then ``$SPECLI_MODELS_DIR/<repo name>`` (the hub id's last part);
4. a snapshot of its hub id (``org/name``) in the local Hugging Face cache, in the layout ``huggingface_hub``
   writes: ``<cache>/models--<org>--<name>/snapshots/<revision>/``, the revision ``refs/main`` names first,
   then the other snapshots, newest first. The caches: ``$HF_HUB_CACHE``, ``$HF_HOME/hub`` and the one
   ``huggingface_hub`` resolved itself (its default, ``~/.cache/huggingface/hub``).

Candidates 2-4 lacking a required file are passed over and named in the error. Nothing is ever downloaded.
Every failure is a :class:`~specli.errors.ModelLoadError` naming where it looked.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants as hf_constants

from specli.errors import ModelLoadError

MODELS_ENV = "SPECLI_MODELS_DIR"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")

#: what a directory lacks of the files a model needs (empty: it is usable)
Required = Callable[[Path], list[str]]


def _nothing_required(path: Path) -> list[str]:
    return []


@dataclass(frozen=True)
class Lookup:
    """What to look for and how to tell a directory holds it."""

    label: str  # the model in errors: "drafter", "CosyVoice model", "EAGLE head"
    repo: str | None = None  # the hub id looked up in the HF cache; None: the name itself when it is an org/name
    required: Required = _nothing_required  # the files a directory lacks, as the error names them
    shipped: tuple[Path, ...] = ()  # directories shipped with specli, tried before $SPECLI_MODELS_DIR
    hint: str = ""  # a sentence on what the model needs or how to get it, for the not-found error


def models_dir() -> Path | None:
    """``$SPECLI_MODELS_DIR`` (None: not set)."""
    value = os.environ.get(MODELS_ENV)
    return Path(value).expanduser() if value else None


def under_models_dir(name: str, repo: str | None = None) -> tuple[Path, ...]:
    """``$SPECLI_MODELS_DIR/<name>`` and ``$SPECLI_MODELS_DIR/<repo name>`` (empty when it is not set)."""
    root = models_dir()
    if root is None:
        return ()
    names = (name, repo.rsplit("/", 1)[-1]) if repo else (name,)
    return tuple(root / n for n in dict.fromkeys(names))


def hub_cache_dirs() -> tuple[Path, ...]:
    """The Hugging Face hub caches searched, in order (read when called: a changed environment counts)."""
    home = os.environ.get("HF_HOME")
    roots = (os.environ.get("HF_HUB_CACHE"), os.path.join(home, "hub") if home else None, hf_constants.HF_HUB_CACHE)
    return tuple(Path(r).expanduser() for r in dict.fromkeys(r for r in roots if r))


def hub_snapshots(repo: str) -> list[Path]:
    """The snapshots of model ``repo`` in the local hub caches: per cache, the one ``refs/main`` names, then the
    others newest first."""
    found: list[Path] = []
    for root in hub_cache_dirs():
        entry = root / f"models--{repo.replace('/', '--')}"
        snaps = entry / "snapshots"
        if not snaps.is_dir():
            continue
        try:
            main = (entry / "refs" / "main").read_text().strip()
        except OSError:
            main = ""
        others = sorted((p for p in snaps.iterdir() if p.name != main), key=lambda p: p.stat().st_mtime, reverse=True)
        found += ([snaps / main] if main and (snaps / main).is_dir() else []) + others
    return found


def _hub_id(name: str, lookup: Lookup) -> str | None:
    repo = lookup.repo or name
    return repo if _HUB_ID.fullmatch(repo) else None


def _candidates(name: str, lookup: Lookup) -> Iterator[Path]:
    repo = _hub_id(name, lookup)
    yield from lookup.shipped
    yield from under_models_dir(name, repo)
    if repo is not None:
        yield from hub_snapshots(repo)


def _reads_as_path(name: str) -> bool:
    """A name only a path can be: absolute, or starting with ``.`` or ``~``."""
    return name.startswith((".", "~", "/")) or Path(name).is_absolute()


def locate(name: str, lookup: Lookup) -> Path:
    """The directory of model ``name``: a path, a shipped directory, under ``$SPECLI_MODELS_DIR`` or in the local
    Hugging Face cache; a ModelLoadError naming where it looked when none holds the required files."""
    path = Path(name).expanduser()
    if path.is_dir():
        missing = lookup.required(path)
        if missing:
            raise ModelLoadError(f"{path} is not a {lookup.label} directory: missing {', '.join(missing)}")
        return path
    if _reads_as_path(name):
        raise ModelLoadError(f"{lookup.label} directory not found: {path.absolute()} (specli never downloads)")
    passed_over: list[str] = []
    for candidate in _candidates(name, lookup):
        if candidate.is_dir():
            missing = lookup.required(candidate)
            if not missing:
                return candidate
            passed_over.append(f"{candidate} lacks {', '.join(missing)}")
    raise ModelLoadError(_not_found(name, lookup, passed_over))


def _not_found(name: str, lookup: Lookup, passed_over: list[str]) -> str:
    repo = _hub_id(name, lookup)
    under = under_models_dir(name, repo)
    places = ["not a directory"]
    places += [f"not shipped with specli ({d})" for d in lookup.shipped]
    places.append(f"not under {' or '.join(map(str, under))} ($SPECLI_MODELS_DIR)" if under
                  else f"not under $SPECLI_MODELS_DIR/{name} (SPECLI_MODELS_DIR is not set)")
    if repo is not None:
        caches = ", ".join(map(str, hub_cache_dirs()))
        places.append(f"and {repo!r} is not in the local Hugging Face cache ({caches})")
    found = f" ({'; '.join(passed_over)})" if passed_over else ""
    fetch = f"fetch it once with `hf download {repo}` on a connected machine, " if repo else ""
    hint = f" {lookup.hint}" if lookup.hint else ""
    return (f"{lookup.label} {name!r} not found offline: {', '.join(places)}{found}.{hint} Specli never downloads: "
            f"{fetch}put it under $SPECLI_MODELS_DIR, or pass its directory.")
