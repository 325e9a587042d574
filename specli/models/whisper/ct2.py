"""Reader for CTranslate2's binary ``model.bin`` format, written from scratch.

Layout (little-endian): uint32 binary version, spec name, uint32 revision,
uint32 variable count, then per variable: name, uint8 rank, rank x uint32 dims,
uint8 dtype id, uint32 byte count, raw bytes; then uint32 alias count and
(alias, target) name pairs. A string is a uint16 length (counting a trailing
NUL) followed by that many bytes. Binary versions below 4 store an item size
instead of a dtype id and an element count instead of a byte count.

A model may be split into ordered parts that concatenate into one model.bin;
the reader streams across them. Arrays come from ``numpy.frombuffer``; nothing
is unpickled.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import BinaryIO

import numpy as np

from specli.errors import ModelLoadError

PathLike = str | os.PathLike[str]
PartsLike = PathLike | Sequence[PathLike]

MIN_BINARY_VERSION = 2
MAX_BINARY_VERSION = 6

#: CTranslate2 ``DataType`` enum: id -> (name, numpy dtype of the stored bytes).
DTYPES: Mapping[int, tuple[str, np.dtype]] = MappingProxyType(
    {
        0: ("float32", np.dtype("<f4")),
        1: ("int8", np.dtype("i1")),
        2: ("int16", np.dtype("<i2")),
        3: ("int32", np.dtype("<i4")),
        4: ("float16", np.dtype("<f2")),
        5: ("bfloat16", np.dtype("<u2")),
    }
)
DTYPE_IDS: Mapping[str, int] = MappingProxyType({name: i for i, (name, _) in DTYPES.items()})
_LEGACY_ITEM_SIZES = {4: 0, 2: 2, 1: 1}  # binary version < 4: item size -> dtype id
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Ct2Variable:
    """One stored variable. ``dtype`` is the CT2 dtype name; bfloat16 data is kept as raw uint16."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    data: np.ndarray

    @property
    def is_scalar(self) -> bool:
        """True for rank-0 variables (flags, head counts, ...)."""
        return len(self.shape) == 0


@dataclass(frozen=True, eq=False)
class Ct2Model:
    """A parsed model.bin: header fields, variables by name and aliases."""

    parts: tuple[Path, ...]
    binary_version: int
    spec_name: str
    revision: int
    variables: Mapping[str, Ct2Variable]
    aliases: Mapping[str, str]

    def resolve_name(self, name: str) -> str:
        """Follow aliases (also ``<alias>_scale``) to a stored variable name."""
        seen: set[str] = set()
        while name not in self.variables and name not in seen:
            seen.add(name)
            if name in self.aliases:
                name = self.aliases[name]
            elif name.endswith("_scale") and name[: -len("_scale")] in self.aliases:
                name = self.aliases[name[: -len("_scale")]] + "_scale"
            else:
                break
        return name

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.resolve_name(name) in self.variables

    def get(self, name: str) -> Ct2Variable:
        """Return a variable by name or alias; KeyError when absent."""
        return self.variables[self.resolve_name(name)]

    def scalar(self, name: str) -> int | float:
        """Return a rank-0 (or single element) variable as a Python number."""
        var = self.get(name)
        if var.data.size != 1:
            raise ValueError(f"{name} is not a scalar (shape {var.shape})")
        return float_array(var).item() if var.dtype in ("float16", "bfloat16") else var.data.item()

    def float32(self, name: str) -> np.ndarray:
        """Return a variable as float32, dequantizing int8/int16 with its ``_scale``."""
        var = self.get(name)
        if var.dtype in ("int8", "int16"):
            scale_name = self._scale_name(name)
            if scale_name is not None:
                return dequantize(var.data, float_array(self.get(scale_name)))
        return float_array(var)

    def _scale_name(self, name: str) -> str | None:
        for candidate in (name + "_scale", name.rsplit("/", 1)[0] + "/weight_scale"):
            if candidate in self:
                return candidate
        return None


def float_array(var: Ct2Variable) -> np.ndarray:
    """Convert a variable's data to float32 without dequantizing."""
    if var.dtype == "bfloat16":
        widened = var.data.astype(np.uint32) << np.uint32(16)
        return widened.view(np.float32).reshape(var.shape)
    return var.data.astype(np.float32)


def dequantize(data: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """CT2 dequantization: ``w_fp = w_int / scale`` with a per-row (or global) scale."""
    scale = np.asarray(scale, dtype=np.float32)
    if scale.ndim > 0 and scale.size > 1:
        scale = scale.reshape((-1,) + (1,) * (data.ndim - 1))
    return data.astype(np.float32) / scale


def normalize_parts(source: PartsLike) -> tuple[Path, ...]:
    """Turn a path or an ordered list of part paths into a tuple of Paths."""
    if isinstance(source, (str, os.PathLike)):
        return (Path(source),)
    parts = tuple(Path(p) for p in source)
    if not parts:
        raise ModelLoadError("no model.bin parts were given")
    return parts


def describe_parts(parts: Sequence[Path]) -> str:
    """Human-readable name of a (possibly split) model file."""
    if len(parts) == 1:
        return str(parts[0])
    return " + ".join(str(p) for p in parts)


def check_parts_exist(parts: Sequence[Path]) -> None:
    """Raise ModelLoadError naming the first missing part file."""
    for number, part in enumerate(parts, start=1):
        if not part.is_file():
            what = "model file" if len(parts) == 1 else f"model part {number}/{len(parts)}"
            raise ModelLoadError(f"{what} is missing: {part}")


def sha256_of_parts(source: PartsLike) -> str:
    """Streaming sha256 hex digest of the concatenated parts."""
    parts = normalize_parts(source)
    check_parts_exist(parts)
    digest = hashlib.sha256()
    for part in parts:
        with part.open("rb") as fh:
            for chunk in iter(lambda: fh.read(_CHUNK), b""):
                digest.update(chunk)
    return digest.hexdigest()


def verify_sha256(source: PartsLike, expected_hex: str) -> None:
    """Raise ModelLoadError naming the file when the joined parts' sha256 differs."""
    parts = normalize_parts(source)
    actual = sha256_of_parts(parts)
    if actual != expected_hex.lower():
        raise ModelLoadError(
            f"checksum mismatch for {describe_parts(parts)}: expected sha256 {expected_hex}, "
            f"got {actual}; the file is corrupt or was modified (reinstall the model package)"
        )


class _PartStream:
    """Sequential reader over ordered part files, as if they were one file."""

    def __init__(self, parts: Sequence[Path]) -> None:
        self._parts = list(parts)
        self._index = 0
        self._fh: BinaryIO | None = None
        self.offset = 0

    def __enter__(self) -> _PartStream:
        check_parts_exist(self._parts)
        self._fh = self._parts[0].open("rb")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    @property
    def current(self) -> Path:
        """The part file currently being read."""
        return self._parts[self._index]

    def read(self, size: int, what: str) -> bytearray:
        """Read exactly ``size`` bytes, crossing part boundaries; ModelLoadError on EOF."""
        buf = bytearray(size)
        view = memoryview(buf)
        filled = 0
        while filled < size:
            assert self._fh is not None
            got = self._fh.readinto(view[filled:])
            if got:
                filled += got
                continue
            if self._index + 1 >= len(self._parts):
                raise ModelLoadError(
                    f"{self.current} is truncated: unexpected end of file at byte "
                    f"{self.offset + filled} while reading {what} ({size - filled} bytes missing)"
                )
            self._fh.close()
            self._index += 1
            self._fh = self._parts[self._index].open("rb")
        self.offset += size
        return buf

    def unpack(self, fmt: str, what: str) -> tuple:
        """Read and unpack one little-endian struct."""
        return struct.unpack("<" + fmt, self.read(struct.calcsize("<" + fmt), what))

    def string(self, what: str) -> str:
        """Read a uint16-length-prefixed, NUL-terminated string."""
        (length,) = self.unpack("H", f"length of {what}")
        raw = bytes(self.read(length, what))
        return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")


def _read_variable(stream: _PartStream, version: int) -> Ct2Variable:
    name = stream.string("variable name")
    (rank,) = stream.unpack("B", f"rank of {name}")
    shape = tuple(int(d) for d in stream.unpack(f"{rank}I", f"shape of {name}"))
    count = math.prod(shape)
    if version >= 4:
        dtype_id, num_bytes = stream.unpack("BI", f"dtype of {name}")
    else:
        item_size, num_items = stream.unpack("BI", f"item size of {name}")
        dtype_id = _LEGACY_ITEM_SIZES.get(item_size, -1)
        num_bytes = num_items * item_size
    if dtype_id not in DTYPES:
        raise ModelLoadError(f"{stream.current}: variable {name} has unknown dtype id {dtype_id}")
    dtype_name, np_dtype = DTYPES[dtype_id]
    if num_bytes != count * np_dtype.itemsize:
        raise ModelLoadError(
            f"{stream.current}: variable {name} declares {num_bytes} bytes but shape "
            f"{shape} of {dtype_name} needs {count * np_dtype.itemsize}"
        )
    raw = stream.read(num_bytes, f"data of {name}")
    data = np.frombuffer(raw, dtype=np_dtype).reshape(shape)
    return Ct2Variable(name=name, shape=shape, dtype=dtype_name, data=data)


def _read_header(stream: _PartStream, label: str) -> tuple[int, str, int]:
    (version,) = stream.unpack("I", "binary version")
    if not MIN_BINARY_VERSION <= version <= MAX_BINARY_VERSION:
        raise ModelLoadError(
            f"{label} is not a supported CTranslate2 model.bin: binary version {version} "
            f"(expected {MIN_BINARY_VERSION}..{MAX_BINARY_VERSION})"
        )
    spec_name = stream.string("spec name")
    (revision,) = stream.unpack("I", "spec revision")
    return version, spec_name, revision


def read_model_bin(source: PartsLike) -> Ct2Model:
    """Parse a model.bin (or its ordered parts) into a Ct2Model."""
    parts = normalize_parts(source)
    label = describe_parts(parts)
    with _PartStream(parts) as stream:
        version, spec_name, revision = _read_header(stream, label)
        (num_vars,) = stream.unpack("I", "variable count")
        variables: dict[str, Ct2Variable] = {}
        for _ in range(num_vars):
            var = _read_variable(stream, version)
            variables[var.name] = var
        aliases: dict[str, str] = {}
        if version >= 3:
            (num_aliases,) = stream.unpack("I", "alias count")
            for _ in range(num_aliases):
                alias = stream.string("alias name")
                aliases[alias] = stream.string(f"target of alias {alias}")
    return Ct2Model(
        parts=parts,
        binary_version=version,
        spec_name=spec_name,
        revision=revision,
        variables=MappingProxyType(variables),
        aliases=MappingProxyType(aliases),
    )

