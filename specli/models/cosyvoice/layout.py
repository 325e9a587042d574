"""CosyVoice2/3 speech-token LM layouts: special ids, lengths, stop rules, and vocabulary maps.

Everything here is a pure function of a :class:`SpeechLMSpec`, transcribed from the upstream
``cosyvoice/llm/llm.py`` (``Qwen2LM`` for CosyVoice2, ``CosyVoice3LM`` for CosyVoice3):

=================  =================================  ==================================
                   CosyVoice2 ``Qwen2LM``             CosyVoice3 ``CosyVoice3LM``
=================  =================================  ==================================
sos / task         rows 0 / 1 of ``llm_embedding``    speech ids S / S+2
eos / fill         S / S+2                            S+1 / S+3
speech rows, head  S+3 (head with bias)               S+200 (head without bias)
stop ids           S .. S+2                           S .. S+199
=================  =================================  ==================================

(S = ``speech_token_size`` = 6561.) Lengths: ``min = int(2 * text tokens)``, ``max = int(20 *
text tokens)``, prompt text not counted. While fewer than ``min`` tokens were generated, upstream
sets ``score[S] = -inf`` (``sampling_ids(ignore_eos=True)``): that is eos for CosyVoice2 but **sos
for CosyVoice3**, whose eos (S+1) and other stop ids stay allowed. specli reproduces this quirk
exactly for the native samplers (``ras``, ``greedy``); the ``vllm`` sampler follows upstream's vLLM
path instead (``min_tokens``: every stop id masked below ``min``). The rules themselves are
:func:`specli.core.sampling.build_sampler`'s, fed with :attr:`SpeechLMSpec.stop_ids`,
:attr:`SpeechLMSpec.min_length_mask_id` and :meth:`SpeechLMSpec.lengths`.

Vocabulary maps for drafters trained against the other two layouts of the same LLM:
- the official vLLM export (``export_cosyvoice2_vllm``): the vocabulary *is* the speech rows
  (``speech_embedding`` as input table, ``llm_decoder`` as biased head), optionally padded (older
  exports padded to a multiple of 64 with zero rows); prompts go in as embeddings;
- SpeechSpec's merged vocabulary (``pretrained_to_huggingface.py``): ``<|s_i|>`` and the stop ids
  appended after the text vocabulary (``len(tokenizer)`` with CosyVoice's special tokens), then
  CosyVoice2's ``<|sos|>`` / ``<|task_id|>`` rows, padded to a multiple of 128; text rows masked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from specli.core.drafters.llm.layout import VocabLayout

ModelKind = Literal["cosyvoice2", "cosyvoice3"]


@dataclass(frozen=True)
class RasSettings:
    """CosyVoice's repetition-aware sampling settings (yaml ``sampling: !name:...ras_sampling``)."""

    top_p: float = 0.8  # nucleus mass
    top_k: int = 25  # nucleus size cap
    win_size: int = 10  # window of generated tokens checked for repetition
    tau_r: float = 0.1  # repetition ratio: resample when count >= win_size * tau_r

    def __post_init__(self) -> None:
        if not 0.0 < self.top_p <= 1.0 or self.top_k < 1 or self.win_size < 1 or self.tau_r < 0:
            raise ValueError(f"invalid RAS settings {self}")


@dataclass(frozen=True)
class SpeechLMSpec:
    """Which CosyVoice LM this is and the numbers its decoding follows."""

    kind: ModelKind  # cosyvoice2 (Qwen2LM) or cosyvoice3 (CosyVoice3LM)
    speech_token_size: int = 6561  # S: speech codes 0..S-1 (3^8 FSQ)
    # generated tokens per text token, at least / at most: upstream's inference defaults; a voice's yaml may set its
    # own (specli's keys ``min_token_text_ratio`` / ``max_token_text_ratio``: a voice that reads phonemes has ~1.4)
    min_token_text_ratio: float = 2.0
    max_token_text_ratio: float = 20.0
    ras: RasSettings = RasSettings()  # the yaml's default sampler
    # a line longer than this many words is spoken in sentence / clause pieces of at most this many (never cut
    # between words; specli's key ``max_piece_words``, for a small LM that loses words in long sentences); 0:
    # upstream's rule, a line is cut only when it is too long for the model
    max_piece_words: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("cosyvoice2", "cosyvoice3"):
            raise ValueError(f"unknown CosyVoice LM kind {self.kind!r}")
        if self.speech_token_size < 1:
            raise ValueError("speech_token_size must be >= 1")
        if not 0 <= self.min_token_text_ratio <= self.max_token_text_ratio or self.max_token_text_ratio <= 0:
            raise ValueError(f"token/text ratios must satisfy 0 <= min <= max, max > 0: got "
                             f"{self.min_token_text_ratio}, {self.max_token_text_ratio}")
        if self.max_piece_words < 0:
            raise ValueError(f"max_piece_words must be >= 0, got {self.max_piece_words}")

    @property
    def speech_rows(self) -> int:
        """Rows of ``speech_embedding`` == outputs of ``llm_decoder``."""
        return self.speech_token_size + (3 if self.kind == "cosyvoice2" else 200)

    @property
    def head_bias(self) -> bool:
        return self.kind == "cosyvoice2"

    @property
    def eos(self) -> int:
        return self.speech_token_size + (0 if self.kind == "cosyvoice2" else 1)

    @property
    def fill(self) -> int:
        return self.speech_token_size + (2 if self.kind == "cosyvoice2" else 3)

    @property
    def stop_ids(self) -> range:
        """Generated ids that end the utterance (never emitted)."""
        return range(self.speech_token_size, self.speech_rows)

    @property
    def min_length_mask_id(self) -> int:
        """The id upstream masks while below the minimum length (eos for CV2, sos for CV3)."""
        return self.speech_token_size

    def lengths(self, text_tokens: int) -> tuple[int, int]:
        """``(min_len, max_len)`` of the generated tokens for ``text_tokens`` tokens of text to speak."""
        return int(text_tokens * self.min_token_text_ratio), int(text_tokens * self.max_token_text_ratio)


@dataclass(frozen=True)
class InputLayout:
    """The id space of the target's *inputs*: one integer for every row the LM may be fed.

    ``[0, speech_rows)`` are ``speech_embedding`` rows (generated tokens, prompt speech tokens and,
    for CosyVoice3, sos/task); CosyVoice2's two ``llm_embedding`` rows follow; text token ``t`` is
    ``text_base + t`` (the Qwen ``embed_tokens`` row ``t``). Outputs are always speech ids.
    """

    spec: SpeechLMSpec

    @property
    def extra_rows(self) -> int:
        return 2 if self.spec.kind == "cosyvoice2" else 0

    @property
    def sos(self) -> int:
        s = self.spec
        return s.speech_rows if s.kind == "cosyvoice2" else s.speech_token_size

    @property
    def task(self) -> int:
        s = self.spec
        return s.speech_rows + 1 if s.kind == "cosyvoice2" else s.speech_token_size + 2

    @property
    def text_base(self) -> int:
        return self.spec.speech_rows + self.extra_rows

    def prompt(self, text: Sequence[int], prompt_text: Sequence[int] = (), prompt_speech: Sequence[int] = ()
               ) -> list[int]:
        """``[sos] + (prompt text + text) + [task] + prompt speech tokens``, as input ids."""
        bad = [t for t in prompt_speech if not 0 <= t < self.spec.speech_token_size]
        if bad:
            raise ValueError(f"prompt speech tokens must be within 0..{self.spec.speech_token_size - 1}: {bad[:5]}")
        base = self.text_base
        return [self.sos, *(base + t for t in (*prompt_text, *text)), self.task, *prompt_speech]


def _padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def vllm_layout(spec: SpeechLMSpec, pad_to: int = 1) -> VocabLayout:
    """The official vLLM export: speech rows are the whole vocabulary (padded to ``pad_to``)."""
    return VocabLayout("vllm", 0, spec.speech_rows, _padded(spec.speech_rows, pad_to), **_native_inputs(spec))


def merged_layout(spec: SpeechLMSpec, text_vocab: int, pad_to: int = 128) -> VocabLayout:
    """SpeechSpec's merged vocabulary after ``text_vocab`` = ``len(tokenizer)`` text ids."""
    rows = spec.speech_rows
    extra = 2 if spec.kind == "cosyvoice2" else 0
    sos = text_vocab + rows if extra else text_vocab + spec.speech_token_size
    task = text_vocab + rows + 1 if extra else text_vocab + spec.speech_token_size + 2
    return VocabLayout("merged", text_vocab, rows, _padded(text_vocab + rows + extra, pad_to), sos, task,
                       **_native_inputs(spec))


def _native_inputs(spec: SpeechLMSpec) -> dict[str, int]:
    """Where the LM's own input layout keeps sos, task and text token 0 (what a layout maps drafter inputs to)."""
    lay = InputLayout(spec)
    return {"native_sos": lay.sos, "native_task": lay.task, "native_text_base": lay.text_base}
