"""Voices trained by specli: CosyVoice3-layout model directories loaded through the same loaders as official
weights, shipped inside the package (``specli/voices/<name>/``, package data of the wheel).

Such a directory carries ``SHA256SUMS`` (``<sha256>  <relative path>`` lines, as ``sha256sum`` writes them); a
voice is used only when every listed file is present and matches (checked when it loads), so a corrupted
or partial install is a clear :class:`~specli.errors.ModelLoadError`, never a garbled voice.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType

from specli.errors import ModelLoadError
from specli.io.digest import file_sha256

# name -> description of the voices inside the package (`specli models` lists them). specli-en is trained by
# `python -m scripts.voice` (scripts/voice/build.py), continuing from specli/voices/specli-en;
# tests/test_voice_roundtrip.py holds it to its stated bound.
SHIPPED_VOICES: MappingProxyType[str, str] = MappingProxyType({
    "specli-en": "English voice trained here (CosyVoice3 layout: 17M-parameter LM over 19,683 speech codes, 8M DiT "
                 "flow, HiFi-GAN V1 vocoder, 22.05 kHz; piper joe-us speaking fortunes and WordNet); synthesize's "
                 "default",
})
# name -> the preset a shipped voice runs with when no --preset is named: its fastest lossless one, chosen by
# docs/benchmarks/voice-speculative-tree (the same speech tokens as <name>-ar, which stays available)
VOICE_PRESETS: MappingProxyType[str, str] = MappingProxyType({"specli-en": "specli-en-dflash"})
SUMS = "SHA256SUMS"


def voices_root() -> Path:
    """``specli/voices`` of the installed package."""
    return Path(str(resources.files("specli") / "voices"))


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


def verify_voice(directory: Path) -> Path:
    """``directory`` once every file its ``SHA256SUMS`` lists is present and matches (ModelLoadError naming the
    first that is missing or corrupt)."""
    for rel, digest in read_sums(directory).items():
        path = directory / rel
        if not path.is_file():
            raise ModelLoadError(f"{directory}: {rel} is missing (listed in {SUMS})")
        if file_sha256(path) != digest:
            raise ModelLoadError(f"{directory}: {rel} does not match its sha256 in {SUMS} (corrupt copy)")
    return directory


@cache
def shipped_voice(name: str) -> Path:
    """The verified directory of shipped voice ``name`` (ModelLoadError naming what is missing or corrupt)."""
    if name not in SHIPPED_VOICES:
        raise ModelLoadError(f"no shipped voice {name!r} (shipped: {', '.join(SHIPPED_VOICES) or 'none yet'})")
    directory = voices_root() / name
    if not (directory / SUMS).is_file():
        raise ModelLoadError(f"shipped voice {name!r} is not installed ({directory / SUMS} is missing): "
                             "reinstall specli")
    return verify_voice(directory)


def shipped_part(name: str) -> Path | None:
    """``<voice>/<part>`` (e.g. ``specli-en/dflash``, the drafter shipped beside the voice) as the verified path
    inside shipped voice ``<voice>``; None when ``name`` does not start with a shipped voice's name. A part the
    voice's ``SHA256SUMS`` does not list, or that is missing, is a ModelLoadError."""
    voice, sep, part = name.partition("/")
    if not sep or voice not in SHIPPED_VOICES or not part:
        return None
    directory = shipped_voice(voice)
    if not any(rel == part or rel.startswith(part.rstrip("/") + "/") for rel in read_sums(directory)):
        raise ModelLoadError(f"shipped voice {voice!r} has no {part!r} (its {SUMS} lists no such file)")
    return directory / part
