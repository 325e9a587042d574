"""Music without speech, with the default settings: no hallucinated sentence repeated over segments.

The clip is synthesised (no network, no shipped music file): 75 s of a four-chord progression with
harmonics, a sixteenth-note arpeggio, kick, snare (noise bursts) and hi-hats at 96 bpm.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
import soundfile as sf

SR = 16000
CHORDS = ((220.0, 277.18, 329.63), (196.0, 246.94, 293.66), (174.61, 220.0, 261.63), (164.81, 207.65, 246.94))

pytestmark = pytest.mark.usefixtures("one_torch_thread", "memo_loaders")


def _beat(out: np.ndarray, start: int, n: int, chord, beat_no: int, rng: np.random.Generator) -> None:
    """One beat in place: the chord with four harmonics, four arpeggio notes, a drum hit, two hi-hats."""
    t = np.arange(n) / SR
    env = np.exp(-3 * t)
    for f in chord:
        for h, a in ((1, 1.0), (2, 0.5), (3, 0.25), (4, 0.12)):
            out[start : start + n] += 0.08 * a * env * np.sin(2 * np.pi * f * h * t)
    q = n // 4
    for k in range(4):
        tq = np.arange(q) / SR
        vibrato = 1 + 0.3 * np.sin(2 * np.pi * 5 * tq)
        out[start + k * q : start + (k + 1) * q] += 0.1 * np.exp(-8 * tq) * np.sin(2 * np.pi * 2 * chord[k % 3] * tq) * vibrato
    hit = min(n, int(0.15 * SR))
    th = t[:hit]
    if beat_no % 2 == 0:  # kick: a falling sine
        out[start : start + hit] += 0.5 * np.exp(-25 * th) * np.sin(2 * np.pi * (60 + 80 * np.exp(-30 * th)) * th)
    else:  # snare: a noise burst
        out[start : start + hit] += 0.25 * np.exp(-20 * th) * rng.standard_normal(hit)
    hat = int(0.03 * SR)
    for k in range(2):
        s = start + k * (n // 2)
        out[s : s + hat] += 0.05 * rng.standard_normal(hat) * np.exp(-150 * np.arange(hat) / SR)


def music(seconds: float = 75.0, bpm: float = 96.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros(int(seconds * SR))
    n = int(60.0 / bpm * SR)
    for b in range(len(out) // n):
        _beat(out, b * n, n, CHORDS[(b // 4) % len(CHORDS)], b, rng)
    return (out / (1.25 * np.abs(out).max())).astype(np.float32)


@pytest.fixture(scope="module")
def music_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("music") / "music.wav"
    sf.write(path, music(), SR, subtype="PCM_16")
    return path


def _sentences(text: str) -> list[str]:
    return [s for s in (" ".join(re.findall(r"[\w']+", p.lower())) for p in re.split(r"[.!?]", text)) if s]


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["whisper-tiny.en-eagle-asr", "whisper-eagle-asr"])  # the second is the default
def test_music_gives_no_repeated_hallucination(music_file, preset):
    from specli.asr.pipeline import transcribe

    (outcome,) = list(transcribe([music_file], preset=preset))
    result = outcome.result
    assert outcome.error is None and result is not None
    texts = Counter(" ".join(re.findall(r"[\w']+", s.text.lower())) for s in result.segments)
    assert max(texts.values(), default=0) <= 2, result.text
    sentences = Counter(_sentences(result.text))
    assert max(sentences.values(), default=0) <= 2, result.text
    assert result.stats.windows <= 8  # the seek is not stuck in small steps
