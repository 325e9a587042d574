"""Whisper's hooks into the window loop (:class:`specli.models.speech.SpeechHooks`): its sot sequences with
previous text, logit rules over its special tokens, language detection, the no-speech probe and word timings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from specli.core.job import DecodeJob, Probe
from specli.errors import UsageError
from specli.io.audio import HOP_LENGTH, N_FRAMES, window_features
from specli.models.speech import DecodingOptions, WindowPrompt, WindowWords, suppress_ids
from specli.models.whisper.alignment import add_word_timestamps
from specli.models.whisper.language import check_model_support, detect_language
from specli.models.whisper.rules import WhisperLogitRules
from specli.models.whisper.target import DecoderState, WhisperTarget
from specli.models.whisper.tokenizer import WhisperSpecialTokens, WhisperTokenizer


def whisper_rules(special: WhisperSpecialTokens, timestamps: bool, suppress_tokens: tuple[int, ...]
                  ) -> WhisperLogitRules:
    """A Whisper window's logit rules: the model's, with ``suppress_tokens`` (-1: its non-speech set)."""
    sp = special
    rules = WhisperLogitRules.for_model(sp, timestamps=timestamps)
    always = (sp.transcribe, sp.translate, sp.sot, sp.sot_prev, sp.no_speech)
    ids = suppress_ids(DecodingOptions(suppress_tokens=suppress_tokens), sp.suppress_tokens, always)
    return replace(rules, suppress_tokens=ids)


def whisper_prompt(special: WhisperSpecialTokens, p: WindowPrompt) -> list[int]:
    """``<|startofprev|>`` + hotwords + previous text (initial prompt first), then the sot sequence."""
    sot_seq = special.prompt(p.language, p.task, p.timestamps)
    if not p.previous and not p.hotwords:
        return sot_seq
    room = 223 - len(sot_seq)
    hot = list(p.hotwords[: room // 2])
    prev = list(p.previous[-(room - len(hot)) :]) if room > len(hot) else []
    return [special.sot_prev, *hot, *prev, *sot_seq]


@dataclass(frozen=True)
class WhisperHooks:
    """Whisper's part of the window loop: sot sequences with previous text, timestamp tokens, language
    detection at ``<|startoftranscript|>``, the no-speech probe, cross-attention word timings."""

    target: WhisperTarget
    tokenizer: WhisperTokenizer
    word_timestamps: bool = True

    @property
    def special(self) -> WhisperSpecialTokens:
        return self.tokenizer.special

    @property
    def eot(self) -> int:
        return self.special.eot

    @property
    def timestamp_begin(self) -> int:
        return self.special.timestamp_begin

    def features(self, audio: np.ndarray) -> tuple[torch.Tensor, int]:
        return window_features(audio, self.target.dims.n_mels), min(N_FRAMES, len(audio) // HOP_LENGTH)

    def language(self, given: str | None) -> str | None:
        return given if self.special.multilingual else given or "en"

    def detect_language(self, state: DecoderState) -> dict[str, float] | None:
        sp = self.special
        return detect_language(self.target, state, sp) if sp.multilingual else None

    def check_support(self, model: str, task: str, language: str | None) -> None:
        check_model_support(self.special, model, task, language)

    def window_job(self, p: WindowPrompt) -> DecodeJob:
        if p.instruction is not None:
            raise UsageError("an instruction is for audio-LLM models; Whisper takes --initial-prompt / --hotwords")
        sp = self.special
        prompt = whisper_prompt(sp, p)
        max_new = min(p.max_new_tokens, self.target.dims.text_ctx - len(prompt))
        return DecodeJob(tuple(prompt), whisper_rules(sp, p.timestamps, p.suppress_tokens), sp.eot, max_new,
                         generator=p.generator, probe=Probe(prompt.index(sp.sot), sp.no_speech))

    def align_words(self, state: DecoderState, segments: Sequence, *, language: str | None, task: str,
                    time_offset: float, num_frames: int, last_speech: float, prepend_punctuations: str,
                    append_punctuations: str) -> WindowWords:
        return add_word_timestamps(
            self.target, self.tokenizer, state, segments, language=language, task=task, time_offset=time_offset,
            num_frames=num_frames, last_speech=last_speech, prepend_punctuations=prepend_punctuations,
            append_punctuations=append_punctuations)
