"""The Qwen3-Omni thinker's text side: the tokenizer, the chat template (read from the model directory) and the
ASR / speech-translation instructions of Qwen's Omni cookbooks ("Transcribe the English audio into text.").

A window's prompt is the chat template over one user turn (the audio, then the instruction) with the generation
prompt; the one ``<|audio_pad|>`` is expanded to the window's audio positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


from specli.errors import ModelLoadError
from specli.models.audio_lm import load_tokenizer, read_chat_template
from specli.models.qwen3_asr.text import language_name

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
AUDIO_START, AUDIO_END = "<|audio_start|>", "<|audio_end|>"
SPECIAL = (IM_START, IM_END, END_OF_TEXT, AUDIO_START, AUDIO_END)


def default_instruction(task: str, language: str | None) -> str:
    """"Transcribe the <Language> audio into text." (ASR) or "Translate the <Language> audio into English
    text." (X -> English); the language is left out when unknown."""
    name = language_name(language)
    spoken = f"the {name} audio" if name else "the audio"
    if task == "translate":
        return f"Translate {spoken} into English text."
    return f"Transcribe {spoken} into text."


@dataclass(frozen=True)
class SpecialIds:
    """Ids of the thinker's control tokens."""

    audio: int  # <|audio_pad|>, expanded to one placeholder per audio embedding
    audio_start: int
    audio_end: int
    im_start: int
    im_end: int
    end_of_text: int


class Qwen3OmniText:
    """Text <-> ids and window prompts of one Qwen3-Omni directory."""

    def __init__(self, path: Path, audio_token: int) -> None:
        self._tok, ids = load_tokenizer(path, SPECIAL)
        self.special = SpecialIds(audio_token, ids[AUDIO_START], ids[AUDIO_END], ids[IM_START], ids[IM_END],
                                  ids[END_OF_TEXT])
        self.template = read_chat_template(path)
        if self.template is None:
            raise ModelLoadError(f"{path}: no chat template (chat_template.jinja / chat_template.json)")
        self.eot = self.special.im_end

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, tokens: list[int]) -> str:
        """Text of ``tokens`` (control tokens dropped)."""
        return self._tok.decode([t for t in tokens if t != self.eot], skip_special_tokens=True)

    def render(self, instruction: str) -> str:
        """The prompt text of one window: a user turn of the audio and the instruction, generation prompt on."""
        messages = [{"role": "user", "content": [{"type": "audio", "audio": "window"},
                                                 {"type": "text", "text": instruction}]}]
        return self._tok.apply_chat_template(messages, chat_template=self.template, tokenize=False,
                                             add_generation_prompt=True)

    def prompt(self, instruction: str, n_audio: int) -> list[int]:
        """Token ids of a window's prompt, its one ``<|audio_pad|>`` expanded to ``n_audio`` placeholders."""
        ids = self.encode(self.render(instruction))
        if ids.count(self.special.audio) != 1:
            raise ModelLoadError(f"the chat template gives {ids.count(self.special.audio)} audio placeholders, "
                                 "not 1")
        at = ids.index(self.special.audio)
        return ids[:at] + [self.special.audio] * n_audio + ids[at + 1 :]
