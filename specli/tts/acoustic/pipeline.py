"""Speech tokens -> mel -> audio for one CosyVoice model directory (the acoustic half of synthesis).

:class:`Vocalizer` holds the flow stage (``flow.pt``, :mod:`specli.tts.acoustic.flow`) and the HiFT vocoder
(``hift.pt``, :mod:`specli.tts.acoustic.hift`), both configured from the model's yaml, and opens the ONNX
frontend (:mod:`specli.tts.acoustic.frontend`) only when a voice prompt needs it. :meth:`Vocalizer.render`
does what upstream's ``token2wav`` does offline (``stream=False``): CosyVoice3 drops silent tokens after
5 in a row, the flow runs with full attention from the fixed noise, HiFT vocodes the whole mel (source
noise from the caller's generator: same seed, same samples), and the audio is resampled with soxr when
another rate is asked for. Stage times are measured for the real-time factors.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import soundfile as sf
import soxr
import torch

from specli.core.device import cpu_native_bf16
from specli.tts.acoustic.cfm import NOISE_FRAMES, drop_silent_runs
from specli.tts.acoustic.flow import flow_config, flow_path, load_flow
from specli.tts.acoustic.frontend import Frontend, PromptInputs, StoredSpeaker
from specli.tts.acoustic.hifigan import load_hifigan_entry
from specli.tts.acoustic.hift import HiFTConfig, load_hift
from specli.tts.acoustic.spec import SPEAKER_DIM, AcousticSpec, acoustic_spec
from specli.io.audio import RESAMPLE_QUALITY
from specli.models.cosyvoice.layout import ModelKind
from specli.models.cosyvoice.yaml import read_hyperpyyaml
from specli.errors import ModelLoadError, SpecliError
from specli.io.atomic import write_atomic_with

__all__ = ["AUDIO_DTYPES", "AudioDtype", "AudioFormat", "RenderError", "RenderedAudio", "VoicePrompt", "Vocalizer",
           "audio_dtype", "encode_audio", "stage_dtypes", "vocoder_dtype", "write_audio_atomic"]

AudioFormat = Literal["wav", "flac"]
AudioDtype = Literal["auto", "float32", "bfloat16"]
AUDIO_DTYPES: tuple[AudioDtype, ...] = ("auto", "float32", "bfloat16")
# The vocoder's dtype when neither --audio-dtype nor --vocoder-dtype is given: auto (vocoder_dtype decides).
VOCODER_DEFAULT_DTYPE: AudioDtype = "auto"
# Vocoders whose bf16 round trip was measured transparent and faster (docs/benchmarks/voice/vocoder-bf16/): the
# ones "auto" runs in bfloat16 on a native-bf16 CPU. HiFT's bf16 is not measured on round trips: float32.
BF16_VOCODERS = frozenset({"hifigan"})
NATIVE_RATE = 24000  # CosyVoice2/3 output rate (a model's vocoder says its own: Vocalizer.vocoder.sample_rate)


class RenderError(SpecliError):
    """One utterance cannot be rendered (no speech tokens, longer than the flow's 300 s); the batch goes on."""

    exit_code = 1


@dataclass(frozen=True)
class VoicePrompt:
    """What the flow stage takes from a voice prompt (batch of one, CPU tensors)."""

    speech_tokens: torch.Tensor  # [1, P] int64 prompt speech tokens (may be empty)
    prompt_mel: torch.Tensor  # [1, ratio P, n_mels] float32 prompt mel (empty when there are no tokens)
    embedding: torch.Tensor  # [1, 192] float32 x-vector (zeros: none)

    def frames_per_token(self) -> int | None:
        """Prompt mel frames per prompt token (None without a prompt)."""
        tokens = self.speech_tokens.shape[1]
        return None if tokens == 0 else self.prompt_mel.shape[1] // tokens

    @classmethod
    def none(cls, n_mels: int = 80) -> VoicePrompt:
        """No prompt: no prompt frames and a zero speaker embedding."""
        return cls(torch.zeros(1, 0, dtype=torch.int64), torch.zeros(1, 0, n_mels), torch.zeros(1, SPEAKER_DIM))

    @classmethod
    def from_prompt(cls, prompt: PromptInputs) -> VoicePrompt:
        return cls(prompt.speech_tokens, prompt.prompt_mel, prompt.speaker_embedding)

    @classmethod
    def from_speaker(cls, speaker: StoredSpeaker, ratio: int = 2) -> VoicePrompt:
        """A stored speaker: its saved prompt tokens and mel when it has both (``ratio`` frames a token), else the
        embedding alone."""
        tokens, mel = speaker.speech_tokens, speaker.prompt_mel
        if tokens is None or mel is None or mel.shape[-2] != ratio * tokens.shape[-1]:
            return cls(torch.zeros(1, 0, dtype=torch.int64), torch.zeros(1, 0, 80), speaker.embedding)
        return cls(tokens.reshape(1, -1), mel.reshape(1, -1, mel.shape[-1]), speaker.embedding)


@dataclass(frozen=True)
class RenderedAudio:
    """Audio of one utterance and how long each acoustic stage took."""

    audio: np.ndarray  # [samples] float32 mono in [-1, 1] at sample_rate
    sample_rate: int  # Hz
    flow_tokens: int  # speech tokens given to the flow (after the silent-token rule)
    mel_frames: int  # mel frames vocoded (token_mel_ratio per flow token)
    flow_seconds: float  # wall time of the flow stage
    vocoder_seconds: float  # wall time of the vocoder (+ resampling)

    @property
    def duration(self) -> float:
        """Seconds of audio."""
        return self.audio.shape[0] / self.sample_rate


def audio_dtype(name: AudioDtype, device: torch.device | str, native_bf16: bool | None = None) -> torch.dtype:
    """The compute dtype of the flow and vocoder stages. ``auto``: bfloat16 on a CPU that computes it natively
    (``native_bf16``; None = this machine's, :func:`~specli.core.device.cpu_native_bf16`: AMX or AVX-512 BF16),
    else float32 (CUDA included: padded batches of rows are checked byte for byte in float32 only). Not the flow's
    default: a one-step flow costs ~0.007 of real time and its bf16 round trip is unmeasured; the vocoder has its
    own (:func:`vocoder_dtype`). docs/benchmarks/synthesis-bf16/ measured flow + vocoder 2.6x faster at 1 thread
    and 0.94x at 2 before the vocoder's length buckets (docs/benchmarks/voice/vocoder-bf16/)."""
    if name not in AUDIO_DTYPES:
        raise ValueError(f"audio dtype must be one of {', '.join(AUDIO_DTYPES)}, not {name!r}")
    if name != "auto":
        return torch.bfloat16 if name == "bfloat16" else torch.float32
    native = cpu_native_bf16() if native_bf16 is None else native_bf16
    return torch.bfloat16 if torch.device(device).type == "cpu" and native else torch.float32


def vocoder_dtype(name: AudioDtype, vocoder: str, device: torch.device | str,
                  native_bf16: bool | None = None) -> torch.dtype:
    """The vocoder's compute dtype. ``auto``: bfloat16 for a vocoder of :data:`BF16_VOCODERS` (HiFi-GAN) on a CPU
    with native bf16 (``native_bf16``; None = this machine's), else float32. On a Sapphire Rapids Xeon HiFi-GAN in
    bf16 reads back as float32 does (round-trip WER within the paired noise, log-mel 0.06 from float32's audio) and,
    vocoding in length buckets (:attr:`~specli.tts.acoustic.hifigan.HifiGan.buckets`), runs 2.4x float32's speed
    at 1 thread and 1.6x at 2 on 20 sentences, ~3x once its few shapes are built
    (docs/benchmarks/voice/vocoder-bf16/). HiFT's bf16 is not measured on round trips. A named dtype is given as
    asked."""
    if name == "auto" and vocoder not in BF16_VOCODERS:
        return torch.float32
    return audio_dtype(name, device, native_bf16)


def stage_dtypes(audio: AudioDtype | None, vocoder: AudioDtype | None) -> tuple[AudioDtype, AudioDtype]:
    """The (flow, vocoder) dtype names of the options: ``audio`` (--audio-dtype) names both stages, ``vocoder``
    (--vocoder-dtype) overrides the vocoder's; unset, the flow is float32 and the vocoder
    :data:`VOCODER_DEFAULT_DTYPE` (resolved per vocoder kind by :func:`vocoder_dtype`)."""
    return audio or "float32", vocoder or audio or VOCODER_DEFAULT_DTYPE


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Vocoder(Protocol):
    """Mel ``[1, n_mels, T]`` -> audio ``[1, T * hop]`` at ``sample_rate`` (HiFT draws its source noise from
    ``generator``; HiFi-GAN draws none)."""

    sample_rate: int
    source: Path | None  # the weights file it was read from (HiFi-GAN's); None: the model directory's hift.pt

    def vocode(self, mel: torch.Tensor, generator: torch.Generator) -> torch.Tensor: ...


class Vocalizer:
    """Flow + vocoder (+ the prompt frontend on demand) of one CosyVoice model directory."""

    def __init__(self, kind: ModelKind, flow: torch.nn.Module, vocoder: Vocoder, model_dir: Path | None = None,
                 device: torch.device | str = "cpu", spec: AcousticSpec = AcousticSpec(),
                 dtype: torch.dtype = torch.float32, vocoder_dtype: torch.dtype | None = None) -> None:
        if dtype not in (torch.float32, torch.bfloat16) or vocoder_dtype not in (None, torch.float32, torch.bfloat16):
            raise ValueError(f"the flow and vocoder compute in float32 or bfloat16, not {dtype} / {vocoder_dtype}")
        self.kind, self.flow, self.vocoder = kind, flow, vocoder
        self.model_dir = model_dir
        self.device = torch.device(device)
        self.spec = spec  # mel, frames per token, silent tokens, vocoder kind (from the yaml)
        self.dtype = dtype  # flow compute dtype: bfloat16 = matmuls and convolutions under autocast, weights float32
        self.vocoder_dtype = dtype if vocoder_dtype is None else vocoder_dtype  # the vocoder's (the same way)
        self._frontend: Frontend | None = None

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike[str], kind: ModelKind, device: torch.device | str = "cpu",
                 flow_steps: int | None = None, dtype: torch.dtype = torch.float32,
                 vocoder: AudioDtype | None = None) -> Vocalizer:
        """Load ``flow.pt`` and the vocoder of ``model_dir``, configured by its ``cosyvoice{2,3}.yaml``;
        ``flow_steps``: Euler steps of the flow instead of the yaml's (10 upstream): fewer are faster and rougher;
        ``dtype``: the stages' compute dtype (:func:`audio_dtype`); ``vocoder``: the vocoder's by name instead
        (:func:`vocoder_dtype`, for this model's vocoder kind and torch's threads now)."""
        root = Path(model_dir)
        yaml_path = root / f"{kind}.yaml"
        cfg: dict = {}
        if yaml_path.is_file():
            try:
                cfg = read_hyperpyyaml(yaml_path)
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                raise ModelLoadError(f"{yaml_path}: unreadable model configuration ({exc})") from exc
        spec = acoustic_spec(cfg, kind, yaml_path)
        fcfg = flow_config(cfg.get("flow"), kind, yaml_path)
        if flow_steps is not None:
            fcfg = replace(fcfg, cfm=replace(fcfg.cfm, n_timesteps=flow_steps))
        if fcfg.token_mel_ratio != spec.token_mel_ratio or fcfg.output_size != spec.mel.n_mels:
            raise ModelLoadError(f"{yaml_path}: the flow makes {fcfg.output_size}-bin mel, {fcfg.token_mel_ratio} "
                                 f"frames a token; the model says {spec.mel.n_mels} bins, {spec.token_mel_ratio}")
        flow = load_flow(flow_path(root), fcfg, device)
        voc_dtype = None if vocoder is None else vocoder_dtype(vocoder, spec.vocoder, device)
        return cls(kind, flow, _load_vocoder(root, cfg, kind, spec, yaml_path, device), root, device, spec, dtype,
                   voc_dtype)

    @property
    def vocoder_file(self) -> Path | None:
        """The vocoder's weights file (``hift.pt``, or the HiFi-GAN file it was read from)."""
        if self.vocoder.source is not None:
            return Path(self.vocoder.source)
        return None if self.model_dir is None else self.model_dir / "hift.pt"

    @property
    def frontend(self) -> Frontend:
        """The prompt frontend (speech tokenizer + CAM++ ONNX models), opened on first use."""
        if self._frontend is None:
            if self.model_dir is None:
                raise ModelLoadError("no model directory to open the prompt frontend from")
            self._frontend = Frontend.from_dir(self.model_dir, self.kind, self.device)
        return self._frontend

    def flow_tokens(self, tokens: list[int]) -> list[int]:
        """The tokens the flow gets: silent tokens after 5 in a row are dropped (upstream ``llm_job``, CosyVoice3)."""
        if not self.spec.silent_tokens:
            return [int(t) for t in tokens]
        return drop_silent_runs(tokens, self.spec.silent_tokens)

    def compute(self, dtype: torch.dtype | None = None) -> contextlib.AbstractContextManager:
        """A stage's compute context (``dtype``; None: the flow's, :attr:`dtype`): bf16 autocast when bfloat16
        (the Euler state, norms, softmax and the outputs stay float32), else nothing."""
        dtype = self.dtype if dtype is None else dtype
        if dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def mel(self, tokens: list[int], prompt: VoicePrompt) -> torch.Tensor:
        """Mel ``[1, n_mels, ratio N]`` float32 of ``N`` flow tokens after the prompt (offline: full attention)."""
        self._check_prompt(prompt)
        ids = torch.tensor([tokens], dtype=torch.int64, device=self.device)
        with self.compute():
            return self.flow.inference(ids, *self._prompt_tensors(prompt)).float()

    def _check_prompt(self, prompt: VoicePrompt) -> None:
        ratio = prompt.frames_per_token()
        if ratio is not None and ratio != self.spec.token_mel_ratio:
            raise ValueError(f"the prompt has {ratio} mel frames a token; this model needs {self.spec.token_mel_ratio}")

    def _prompt_tensors(self, prompt: VoicePrompt) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The prompt's tokens, mel and x-vector on the flow's device."""
        return (prompt.speech_tokens.to(self.device), prompt.prompt_mel.to(self.device),
                prompt.embedding.to(self.device))

    def render(self, tokens: list[int], prompt: VoicePrompt, generator: torch.Generator,
               sample_rate: int | None = None) -> RenderedAudio:
        """Audio of the LLM's ``tokens`` in ``prompt``'s voice at ``sample_rate`` (None: the vocoder's own);
        :class:`RenderError` when it cannot be."""
        return self._render_kept(self._flow_input(tokens, prompt), prompt, generator, sample_rate)

    def _render_kept(self, kept: list[int], prompt: VoicePrompt, generator: torch.Generator,
                     sample_rate: int | None) -> RenderedAudio:
        """:meth:`render` of tokens already through :meth:`_flow_input`."""
        t0 = time.perf_counter()
        mel = self.mel(kept, prompt)
        _sync(self.device)
        return self._vocoded(mel, len(kept), time.perf_counter() - t0, generator, sample_rate)

    def render_rows(self, rows: Sequence[tuple[list[int], VoicePrompt, torch.Generator]],
                    sample_rate: int | None = None, flow_together: bool | None = None
                    ) -> Iterator[tuple[int, RenderedAudio | RenderError]]:
        """:meth:`render` of several utterances ``(tokens, prompt, generator)``, each the same samples as alone;
        ``(index, audio or why not)`` as each is vocoded. The flow runs the rows in one padded batch when
        ``flow_together`` (default: on CUDA; on CPU rows one after another, which measured faster:
        docs/benchmarks/synthesis-batch/; in bfloat16 always one after another: padded rows are checked byte for
        byte in float32 only); the vocoder takes them one at a time, and a row's flow seconds are its share of
        the batch by mel frames."""
        kept: dict[int, list[int]] = {}
        for i, (tokens, prompt, _) in enumerate(rows):
            try:
                kept[i] = self._flow_input(tokens, prompt)
            except RenderError as exc:
                yield i, exc
        together = flow_together
        if together is None:
            together = self.device.type == "cuda" and self.dtype == torch.float32
        if not together:
            for i in kept:
                yield i, self._render_kept(kept[i], rows[i][1], rows[i][2], sample_rate)
            return
        for i in kept:
            self._check_prompt(rows[i][1])
        t0 = time.perf_counter()
        with self.compute():
            mels = [m.float() for m in self.flow.inference_rows(
                [(torch.tensor([kept[i]], dtype=torch.int64, device=self.device), *self._prompt_tensors(rows[i][1]))
                 for i in kept])]
        _sync(self.device)
        flow_seconds = time.perf_counter() - t0
        frames = sum(m.shape[2] for m in mels)
        for i, mel in zip(kept, mels):
            share = flow_seconds * mel.shape[2] / frames
            yield i, self._vocoded(mel, len(kept[i]), share, rows[i][2], sample_rate)

    def _flow_input(self, tokens: list[int], prompt: VoicePrompt) -> list[int]:
        """The flow tokens of ``tokens`` (:meth:`flow_tokens`); RenderError when none are left or too long."""
        kept = self.flow_tokens(tokens)
        if not kept:
            raise RenderError("no speech tokens to render (the LLM generated none)")
        frames = self.flow.token_mel_ratio * (prompt.speech_tokens.shape[1] + len(kept))
        if frames > NOISE_FRAMES:
            raise RenderError(f"too long for the flow stage: {frames} mel frames with the prompt (at most "
                              f"{NOISE_FRAMES}, {NOISE_FRAMES / self.spec.mel.frame_rate:.0f} s)")
        return kept

    def _vocoded(self, mel: torch.Tensor, flow_tokens: int, flow_seconds: float, generator: torch.Generator,
                 sample_rate: int | None) -> RenderedAudio:
        """Vocode ``mel [1, n_mels, T]`` (+ resample to ``sample_rate``) into a :class:`RenderedAudio`."""
        t1 = time.perf_counter()
        with self.compute(self.vocoder_dtype):
            audio = self.vocoder.vocode(mel, generator)[0].float().cpu().numpy()
        rate = sample_rate or self.vocoder.sample_rate
        if rate != self.vocoder.sample_rate:
            audio = soxr.resample(audio, self.vocoder.sample_rate, rate, quality=RESAMPLE_QUALITY)
        t2 = time.perf_counter()
        return RenderedAudio(np.ascontiguousarray(audio, dtype=np.float32), rate, flow_tokens, mel.shape[2],
                             flow_seconds, t2 - t1)


def _load_vocoder(root: Path, cfg: dict, kind: ModelKind, spec: AcousticSpec, yaml_path: Path,
                  device: torch.device | str) -> Vocoder:
    """HiFT (``hift.pt``) or HiFi-GAN V1, configured by the yaml entry that :func:`~specli.tts.acoustic.spec.
    vocoder_entry` chose (none: the published HiFT of ``kind``), checked against the model's mel."""
    mel = spec.mel
    node = None if spec.vocoder_entry is None else cfg[spec.vocoder_entry]
    if spec.vocoder == "hifigan":
        vocoder = load_hifigan_entry(node, root, device, yaml_path, buckets=True)  # a few shapes: HifiGan.buckets
        if (vocoder.cfg.sampling_rate, vocoder.cfg.hop_size, vocoder.cfg.num_mels) != (mel.sample_rate, mel.hop,
                                                                                        mel.n_mels):
            raise ModelLoadError(f"{yaml_path}: the hifigan vocoder does not fit the model's mel ({mel})")
        return vocoder
    hift_file = root / "hift.pt"
    if not hift_file.is_file():
        raise ModelLoadError(f"{hift_file}: vocoder checkpoint not found (audio output needs flow.pt and hift.pt)")
    try:
        hcfg = HiFTConfig.for_kind(kind) if node is None else HiFTConfig.from_yaml_node(node)
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{yaml_path}: unusable hift settings: {exc}") from exc
    if hcfg.causal != (kind == "cosyvoice3") or (hcfg.samples_per_frame, hcfg.sampling_rate) != (mel.hop,
                                                                                                 mel.sample_rate):
        raise ModelLoadError(f"{yaml_path}: the hift entry does not fit a {kind} model at {mel.frame_rate:g} mel "
                             "frames/s")
    return load_hift(hift_file, hcfg, device)


def encode_audio(audio: np.ndarray, sample_rate: int, fmt: AudioFormat) -> bytes:
    """16-bit PCM ``wav`` or ``flac`` bytes of mono float audio (deterministic for the same samples)."""
    buf = io.BytesIO()
    sf.write(buf, np.clip(audio, -1.0, 1.0), sample_rate, format=fmt.upper(), subtype="PCM_16")
    return buf.getvalue()


def write_audio_atomic(path: Path, data: bytes) -> None:
    """``data`` to ``path`` through a hidden temporary file and a rename (never a half-written file)."""
    write_atomic_with(path, lambda fh: fh.write(data))
