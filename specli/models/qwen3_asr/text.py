"""Qwen3-ASR's text side: the tokenizer, the chat template (read from the model directory) and the prompt
conventions of transformers' ``Qwen3ASRProcessor.apply_transcription_request``.

A window's prompt is the chat template over a system turn holding the context (only when one is given: the
instruction, e.g. hotwords or domain words), a user turn of one audio, and an assistant turn continued from its
prefill: ``language <Name><asr_text>`` when the language is known (the model then writes the text alone), else
empty (the model writes ``language <Name><asr_text>`` itself, then the text). The one ``<|audio_pad|>`` is
expanded to the window's audio positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers.models.qwen3_asr.processing_qwen3_asr import LANGUAGE_CODE_TO_NAME

from specli.errors import ModelLoadError, UsageError
from specli.models.audio_lm import load_tokenizer, read_chat_template

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
AUDIO_START, AUDIO_END, ASR_TEXT = "<|audio_start|>", "<|audio_end|>", "<asr_text>"
SPECIAL = (IM_START, IM_END, END_OF_TEXT, AUDIO_START, AUDIO_END, ASR_TEXT)


def language_name(language: str | None) -> str | None:
    """The name Qwen3-ASR was trained with for ``language`` (a code such as ``en`` or a name such as
    ``English``); None stays None (the model detects the language). UsageError for one it does not know."""
    if language is None:
        return None
    names = {name.lower(): name for name in LANGUAGE_CODE_TO_NAME.values()}
    found = LANGUAGE_CODE_TO_NAME.get(language.lower()) or names.get(language.lower())
    if found is None:
        raise UsageError(f"Qwen3-ASR does not know language {language!r}; it knows "
                         f"{', '.join(sorted(LANGUAGE_CODE_TO_NAME))}")
    return found


@dataclass(frozen=True)
class SpecialIds:
    """Ids of Qwen3-ASR's control tokens."""

    audio: int  # <|audio_pad|>, expanded to one placeholder per audio embedding
    audio_start: int
    audio_end: int
    im_start: int
    im_end: int
    end_of_text: int
    asr_text: int  # <asr_text>: the transcript follows it


class Qwen3ASRText:
    """Text <-> ids and window prompts of one Qwen3-ASR directory."""

    def __init__(self, path: Path, audio_token: int) -> None:
        self._tok, ids = load_tokenizer(path, SPECIAL)
        self.special = SpecialIds(audio_token, ids[AUDIO_START], ids[AUDIO_END], ids[IM_START], ids[IM_END],
                                  ids[END_OF_TEXT], ids[ASR_TEXT])
        self.template = read_chat_template(path)
        if self.template is None:
            raise ModelLoadError(f"{path}: no chat template (chat_template.jinja / chat_template.json)")
        self.eot = self.special.im_end

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, tokens: list[int]) -> str:
        """The transcript in ``tokens``: what follows the last ``<asr_text>`` (the model's own
        ``language <Name>`` prefix dropped), control tokens dropped."""
        sp = self.special
        if sp.asr_text in tokens:
            tokens = tokens[len(tokens) - tokens[::-1].index(sp.asr_text):]
        return self._tok.decode([t for t in tokens if t != self.eot], skip_special_tokens=True)

    def render(self, context: str | None, language: str | None) -> str:
        """The prompt text of one window, as ``Qwen3ASRProcessor.apply_transcription_request`` renders it:
        the chat template with ``continue_final_message`` over the assistant's prefill."""
        messages = [] if context is None else [{"role": "system", "content": [{"type": "text", "text": context}]}]
        name = language_name(language)
        prefill = f"language {name}{ASR_TEXT}" if name is not None else ""
        messages += [{"role": "user", "content": [{"type": "audio", "audio": "window"}]},
                     {"role": "assistant", "content": [{"type": "text", "text": prefill}]}]
        return self._tok.apply_chat_template(messages, chat_template=self.template, tokenize=False,
                                             continue_final_message=True)

    def prompt(self, context: str | None, language: str | None, n_audio: int) -> list[int]:
        """Token ids of a window's prompt, its one ``<|audio_pad|>`` expanded to ``n_audio`` placeholders."""
        ids = self.encode(self.render(context, language))
        if ids.count(self.special.audio) != 1:
            raise ModelLoadError(f"the chat template gives {ids.count(self.special.audio)} audio placeholders, "
                                 "not 1")
        at = ids.index(self.special.audio)
        return ids[:at] + [self.special.audio] * n_audio + ids[at + 1 :]
