"""``--device`` / preset ``device`` / ``dtype = "auto"``: resolution rules, validation, and the CLI on
this machine (through Click's CliRunner). The CUDA path itself is tests/test_cuda.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from conftest import EN_CLIPS
from specli.cli import main
from specli.core.device import (auto_dtype, cpu_flags, cpu_native_bf16, dtype_name, has_native_bf16,
                                   host_to_device, resolve_device, resolve_dtype)
from specli.errors import PresetError, UsageError
from specli.presets import load_preset, preset_from_dict
from specli.presets.synthesis import synthesis_preset_from_dict

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA messages")
CLIP = EN_CLIPS[2]  # 3 s


def test_device_resolution():
    auto = resolve_device("auto")
    assert auto.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    for bad in ("gpu", "cuda:", "cuda:x", "CPU", "mps", ""):
        with pytest.raises(UsageError, match="auto, cpu, cuda or cuda:N"):
            resolve_device(bad)


@NO_CUDA
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_cuda_device_is_a_usage_error(spec):
    with pytest.raises(UsageError, match="no CUDA device"):
        resolve_device(spec)


CPUINFO_BF16 = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni avx512_bf16

processor\t: 1
flags\t\t: fpu sse2
"""


def test_native_bf16_is_read_from_the_cpu_flags():
    flags = cpu_flags(CPUINFO_BF16)
    assert {"avx512f", "avx512_bf16"} <= flags and "fpu" in flags  # the first processor's line
    assert has_native_bf16(flags) and has_native_bf16({"amx_tile", "amx_bf16"})
    no_bf16 = cpu_flags(CPUINFO_BF16.replace(" avx512_bf16", ""))
    assert "avx512bw" in no_bf16 and not has_native_bf16(no_bf16)  # AVX-512 alone: bf16 only emulated
    assert cpu_flags("processor : 0\nmodel name : x\n") == frozenset() and not has_native_bf16(frozenset())


def test_dtype_auto_is_bf16_on_native_bf16_cpus_float32_on_others_float16_on_cuda():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert auto_dtype(cpu, native_bf16=True) == torch.bfloat16
    assert auto_dtype(cpu, native_bf16=False) == torch.float32
    assert auto_dtype(cuda, native_bf16=True) == auto_dtype(cuda, native_bf16=False) == torch.float16
    assert resolve_dtype("auto", cuda) == torch.float16
    assert resolve_dtype("bfloat16", cuda) == torch.bfloat16 and resolve_dtype("float32", cpu) == torch.float32
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("float64", cpu)


def test_dtype_auto_follows_this_machines_cpu():
    info = Path("/proc/cpuinfo")
    native = info.is_file() and has_native_bf16(cpu_flags(info.read_text())) and torch.backends.mkldnn.is_available()
    assert cpu_native_bf16() == native
    assert resolve_dtype("auto", torch.device("cpu")) == (torch.bfloat16 if native else torch.float32)


def test_resume_sidecar_records_the_resolved_dtype(tmp_path):
    """The sidecar holds the dtype the text was made in, never "auto": a run in another dtype redoes the file."""
    from specli.io.resume import read_sidecar, sidecar_path

    auto = dtype_name(auto_dtype(torch.device("cpu")))
    args = ["transcribe", CLIP, "--preset", "whisper-tiny.en-ar", "--device", "cpu", "-o", tmp_path, "--threads", 1]
    res = _invoke(*args)
    assert res.exit_code == 0, res.output
    side = read_sidecar(sidecar_path(tmp_path / CLIP.stem))
    assert side is not None and side.settings["dtype"] == auto
    res = _invoke(*args, "--dtype", auto)  # the same dtype asked by name: nothing to redo
    assert res.exit_code == 0 and "redoing" not in res.output, res.output
    other = "float32" if auto == "bfloat16" else "bfloat16"
    res = _invoke(*args, "--dtype", other, "--jsonl", "-")
    assert res.exit_code == 0, res.output
    assert f"dtype {auto} -> {other}" in res.stderr
    assert read_sidecar(sidecar_path(tmp_path / CLIP.stem)).settings["dtype"] == other
    assert json.loads(res.stdout.splitlines()[0])["source"] == str(CLIP)


def test_host_to_device_keeps_values_and_type():
    t = host_to_device([[1, 2], [3, 4]], torch.long, "cpu")
    assert t.dtype == torch.long and t.tolist() == [[1, 2], [3, 4]] and t.device.type == "cpu"


def test_presets_carry_a_validated_device():
    assert load_preset("whisper-eagle-asr").device == "auto"
    assert load_preset("whisper-base-ar").dtype == "auto"
    assert preset_from_dict("x", {"model": "whisper-base", "device": "cuda:1"}).device == "cuda:1"
    with pytest.raises(PresetError, match="device"):
        preset_from_dict("x", {"model": "whisper-base", "device": "tpu"})
    with pytest.raises(PresetError, match="device"):
        synthesis_preset_from_dict("s", {"model": "cosyvoice2", "device": "gpu0"})


def test_engine_reports_the_effective_device_and_dtype():
    from specli.asr.strategies import load_engine

    engine = load_engine(load_preset("whisper-tiny.en-ar"), device="cpu")
    assert engine.preset.device == "cpu" and engine.preset.dtype == dtype_name(auto_dtype(torch.device("cpu")))
    assert engine.model.target.dtype == auto_dtype(torch.device("cpu"))
    assert engine.model.target.device == torch.device("cpu")
    assert engine.model.target.embed.device.type == "cpu"


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_transcribe_on_cpu_through_the_cli(tmp_path):
    res = _invoke("transcribe", CLIP, "--preset", "whisper-tiny.en-ar", "--device", "cpu", "-o", tmp_path)
    assert res.exit_code == 0, res.output
    assert (tmp_path / f"{CLIP.stem}.txt").read_text().strip()


@NO_CUDA
@pytest.mark.parametrize("command", [
    ("transcribe", str(CLIP), "--preset", "whisper-tiny.en-ar"),
    ("translate", str(CLIP), "--preset", "whisper-base-ar"),
    ("bench", str(CLIP), "--presets", "whisper-tiny.en-ar", "--repeat", "1"),
    ("synthesize", "--text", "hello"),
])
def test_every_command_refuses_cuda_without_one(tmp_path, command):
    out = ["-o", str(tmp_path)] if command[0] != "bench" else ["--out", str(tmp_path)]
    res = _invoke(*command, "--device", "cuda", *out)
    assert res.exit_code == 2, res.output
    assert "no CUDA device" in res.output


@NO_CUDA
def test_bad_devices_are_usage_errors(tmp_path):
    res = _invoke("transcribe", CLIP, "--preset", "whisper-tiny.en-ar", "--device", "cuda:0", "-o", tmp_path)
    assert res.exit_code == 2
    assert "no CUDA device" in res.stderr
    res = _invoke("transcribe", CLIP, "--device", "tpu", "-o", tmp_path)
    assert res.exit_code == 2 and "auto, cpu, cuda or cuda:N" in res.stderr


def test_packed_linear_is_cpu_only_and_keeps_plain_weights_elsewhere():
    from specli.models.layers import Linear

    w = torch.randn(8, 16, device="cpu")
    assert Linear(w, None).fast or not torch.backends.mkldnn.is_available()
    other = Linear(w.to("meta"), None)  # any non-CPU device (meta here; CUDA on a GPU machine)
    assert not other.fast and other.weight.device.type == "meta"
    assert other(torch.randn(3, 16, device="meta")).shape == (3, 8)
