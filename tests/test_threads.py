"""``--threads`` and ``BenchOptions.threads`` hold for one call: the command (run in-process, as an embedding
program or Click's runner does) and the bench loops put torch's intra-op thread count back when they return,
whether they succeed or fail."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from conftest import EN_CLIPS
from specli.bench.runner import BenchOptions, run_passes
from specli.bench.throughput import run_archives
from specli.cli import main
from specli.core.threads import torch_threads


@pytest.fixture
def three_threads():
    """A count no command below asks for, so a leak shows."""
    with torch_threads(3):
        yield


@pytest.mark.parametrize("args", [
    ["transcribe", str(EN_CLIPS[0]), "--preset", "no-such-preset"],  # fails after --threads took effect
    ["synthesize", "--text", "hi", "--preset", "whisper-tiny.en-ar"],  # a transcription preset: a usage error
], ids=["transcribe", "synthesize"])
def test_a_command_puts_the_thread_count_back(three_threads, tmp_path, args):
    result = CliRunner().invoke(main, [*args, "--threads", "1", "-o", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert torch.get_num_threads() == 3


def test_a_synthesis_bench_puts_the_thread_count_back(three_threads, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    result = CliRunner().invoke(main, ["bench", str(empty), "--presets", "specli-en-ar", "--threads", "1",
                                       "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "no utterances to measure" in result.output, result.output
    assert torch.get_num_threads() == 3


def test_the_bench_loops_put_the_thread_count_back(three_threads):
    opts = BenchOptions(("whisper-tiny.en-ar",), repeat=1, warmup=False, threads=1)
    assert run_passes([], [], opts) == ([], [])
    assert torch.get_num_threads() == 3
    assert run_archives([], {}, "whisper-tiny.en-ar", [], opts) == ([], [])
    assert torch.get_num_threads() == 3


def test_torch_threads_sets_and_restores_even_on_error(three_threads):
    with pytest.raises(RuntimeError):
        with torch_threads(1):
            assert torch.get_num_threads() == 1
            raise RuntimeError
    assert torch.get_num_threads() == 3
    with torch_threads(None):
        assert torch.get_num_threads() == 3
