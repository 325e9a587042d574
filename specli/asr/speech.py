"""The family hooks of the window loop (:class:`specli.models.speech.SpeechHooks`): a loaded model's own
(``model.speech_hooks()``), or Whisper's, which read Whisper's special tokens and logit rules."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from specli.asr.fallback import DecodingOptions, suppress_ids
from specli.asr.language import check_model_support, detect_language
from specli.core.job import DecodeJob, Probe
from specli.errors import UsageError
from specli.io.audio import HOP_LENGTH, N_FRAMES, window_features
from specli.models.speech import SpeechHooks, WindowPrompt
from specli.models.whisper.loader import WhisperModel
from specli.models.whisper.rules import WhisperLogitRules
from specli.models.whisper.target import DecoderState


def speech_hooks(model: object) -> SpeechHooks:
    """``model``'s hooks into the window loop: its own ``speech_hooks()``, else Whisper's."""
    own = getattr(model, "speech_hooks", None)
    return own() if callable(own) else WhisperHooks(model)


def whisper_rules(model: WhisperModel, timestamps: bool, suppress_tokens: tuple[int, ...]) -> WhisperLogitRules:
    """A Whisper window's logit rules: the model's, with ``suppress_tokens`` (-1: its non-speech set)."""
    sp = model.special
    rules = WhisperLogitRules.for_model(sp, timestamps=timestamps)
    always = (sp.transcribe, sp.translate, sp.sot, sp.sot_prev, sp.no_speech)
    ids = suppress_ids(DecodingOptions(suppress_tokens=suppress_tokens), sp.suppress_tokens, always)
    return replace(rules, suppress_tokens=ids)


@dataclass(frozen=True)
class WhisperHooks:
    """Whisper's part of the window loop: sot sequences with previous text, timestamp tokens, language
    detection at ``<|startoftranscript|>``, the no-speech probe."""

    model: WhisperModel
    word_timestamps: bool = True

    @property
    def eot(self) -> int:
        return self.model.special.eot

    @property
    def timestamp_begin(self) -> int:
        return self.model.special.timestamp_begin

    def features(self, audio: np.ndarray) -> tuple[torch.Tensor, int]:
        return window_features(audio, self.model.target.dims.n_mels), min(N_FRAMES, len(audio) // HOP_LENGTH)

    def language(self, given: str | None) -> str | None:
        return given if self.model.special.multilingual else given or "en"

    def detect_language(self, state: DecoderState) -> dict[str, float] | None:
        sp = self.model.special
        return detect_language(self.model.target, state, sp) if sp.multilingual else None

    def check_support(self, model: str, task: str, language: str | None) -> None:
        check_model_support(self.model.special, model, task, language)

    def window_job(self, p: WindowPrompt) -> DecodeJob:
        if p.instruction is not None:
            raise UsageError("an instruction is for audio-LLM models; Whisper takes --initial-prompt / --hotwords")
        sp, target = self.model.special, self.model.target
        prompt = whisper_prompt(self.model, p)
        max_new = min(p.max_new_tokens, target.dims.text_ctx - len(prompt))
        return DecodeJob(tuple(prompt), whisper_rules(self.model, p.timestamps, p.suppress_tokens), sp.eot, max_new,
                         generator=p.generator, probe=Probe(prompt.index(sp.sot), sp.no_speech))


def whisper_prompt(model: WhisperModel, p: WindowPrompt) -> list[int]:
    """``<|startofprev|>`` + hotwords + previous text (initial prompt first), then the sot sequence."""
    sot_seq = model.special.prompt(p.language, p.task, p.timestamps)
    if not p.previous and not p.hotwords:
        return sot_seq
    room = 223 - len(sot_seq)
    hot = list(p.hotwords[: room // 2])
    prev = list(p.previous[-(room - len(hot)) :]) if room > len(hot) else []
    return [model.special.sot_prev, *hot, *prev, *sot_seq]
