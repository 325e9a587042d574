"""Corpus access for the speech tokenizer: clip list, audio at the token grid, targets (phonemes, mel).

Clip list: ``train.tsv`` / ``heldout.tsv`` of the corpus (corpus/piper.py) once its build is complete (its
manifest counts match the TSVs and it was not a ``--limit`` trial); while the build still runs, the
sentences already in its ``journal.tsv`` (one line per finished wav, in sha1 order), with texts from the
same selection code (``pool`` of corpus/sentences.py).
"""
from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specli.io.atomic import write_atomic

from ..common import log
from ..corpus import sentences
from .graph import MEL_FRAMES_PER_TOKEN, RATE_22K, TOKEN_HOP_22K

STRESS = re.compile(r"[ˈˌ\s]|\([a-z-]+\)")


@dataclass(frozen=True)
class Clip:
    id: str
    text: str
    split: str  # "train" | "heldout"
    seconds: float


def _read_tsv(path: Path, split: str) -> list[Clip]:
    rows = [ln.split("\t") for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    return [Clip(r[0], r[1], split, float(r[2])) for r in rows]


def build_complete(data: Path) -> bool:
    """True when the data script finished a full build (manifest matches the TSVs, no --limit)."""
    try:
        man = json.loads((data / "manifest.json").read_text())
        lines = {s: len((data / f"{s}.tsv").read_text(encoding="utf-8").splitlines())
                 for s in ("train", "heldout")}
    except (OSError, ValueError):
        return False
    sel, counts = man.get("selection", {}), man.get("counts", {})
    return (sel.get("limit") is None and not sel.get("heldout_only")
            and counts.get("train") == lines["train"] and counts.get("heldout") == lines["heldout"])


def _partial(data: Path, heldout_size: int = 300) -> list[Clip]:
    # with WordNet's definitions: the pool's order is the same with them, and a build that speaks them lists them
    sel = sentences.pool(sentences.FORTUNE_DIR, sentences.WORDLIST, heldout_size, sentences.WORDNET_DIR, glosses=True)
    journal: dict[str, int] = {}
    for ln in (data / "journal.tsv").read_text(encoding="utf-8").splitlines():
        parts = ln.split("\t")
        if len(parts) == 4:
            journal[parts[1]] = int(parts[2])
    out = []
    for split, pool in (("heldout", sel.heldout), ("train", sel.train_pool)):
        out += [Clip(k[:12], text, split, journal[k] / RATE_22K) for k, text in pool
                if k in journal and (data / "wavs" / f"{k[:12]}.wav").is_file()]
    return out


def load_corpus(data: Path) -> tuple[list[Clip], bool]:
    """(clips: held-out first, then train, each in sha1 order; whether the build is complete)."""
    if build_complete(data):
        return _read_tsv(data / "heldout.tsv", "heldout") + _read_tsv(data / "train.tsv", "train"), True
    return _partial(data), False


# ------------------------------------------------------------------ audio on the token grid


def pad_to_tokens(audio_22k: np.ndarray) -> np.ndarray:
    """Zero-pad at the end to a multiple of 1024 samples (one token each)."""
    return np.pad(audio_22k, (0, -len(audio_22k) % TOKEN_HOP_22K)).astype(np.float32)


def load_padded(data: Path, clip_id: str) -> np.ndarray:
    """The clip's 22.05 kHz audio, padded to the token grid."""
    from specli.io.audio import load_audio

    return pad_to_tokens(load_audio(data / "wavs" / f"{clip_id}.wav", sample_rate=RATE_22K))


def to_16k(audio_22k: np.ndarray) -> np.ndarray:
    """soxr HQ resampling to 16 kHz, as specli's frontend does for a prompt."""
    import soxr
    from specli.io.audio import RESAMPLE_QUALITY

    a16 = soxr.resample(audio_22k, RATE_22K, 16000, quality=RESAMPLE_QUALITY)
    return np.ascontiguousarray(a16, dtype=np.float32)


def whisper_mel128(audio_22k: np.ndarray, n_mels: int = 128) -> np.ndarray:
    """The tokenizer input ``[1, 128, T]``: 16 kHz (:func:`to_16k`), Whisper log-mel of the whole clip."""
    from specli.tts.acoustic.features import whisper_log_mel

    return whisper_log_mel(to_16k(audio_22k), n_mels).numpy()


def vocoder_mel(audio_22k: np.ndarray) -> np.ndarray:
    """jik876 80-bin log-mel ``[frames, 80]`` (frames = 4 per token for padded audio)."""
    from specli.tts.acoustic.features import prompt_mel

    mel = prompt_mel(audio_22k, 8000, n_fft=1024, hop=256, sample_rate=RATE_22K)[0].T.numpy()
    assert mel.shape[0] == MEL_FRAMES_PER_TOKEN * len(audio_22k) // TOKEN_HOP_22K, mel.shape
    return mel


# ------------------------------------------------------------------------------ phonemes


def espeak_ipa(text: str) -> str:
    """espeak-ng's en-us IPA for one sentence (clause lines joined by spaces)."""
    res = subprocess.run(["espeak-ng", "-q", "--ipa", "-v", "en-us", "--stdin"], input=text,
                         capture_output=True, text=True, check=True, timeout=60)
    return " ".join(res.stdout.split())


def phone_symbols(ipa: str) -> list[str]:
    """CTC targets: IPA characters without stress marks, spaces and language-switch markers."""
    return list(STRESS.sub("", ipa))


def read_phonemes(cache: Path) -> dict[str, str]:
    """``cache``'s id -> IPA (id<TAB>ipa lines); none when it is not there."""
    known: dict[str, str] = {}
    if cache.is_file():
        for ln in cache.read_text(encoding="utf-8").splitlines():
            k, sep, v = ln.partition("\t")
            if sep:
                known[k] = v
    return known


def phonemize(clips: list[Clip], cache: Path) -> dict[str, str]:
    """id -> IPA for every clip, cached in ``cache``: the sentences not there are phonemized, then the file is
    rewritten whole and atomically with what it holds by then (two runs filling it at once both leave whole lines)."""
    known = read_phonemes(cache)
    todo = [c for c in clips if c.id not in known]
    if todo:
        log(f"phonemize: {len(todo)} sentences with espeak-ng")
        new = {}
        for i, c in enumerate(todo):
            new[c.id] = espeak_ipa(c.text)
            if (i + 1) % 2000 == 0:
                log(f"phonemize: {i + 1}/{len(todo)}")
        merged = {**read_phonemes(cache), **new}
        write_atomic(cache, "".join(f"{k}\t{v}\n" for k, v in sorted(merged.items())))
        known.update(new)
    return known
