"""Qwen2-Audio's text side: the tokenizer, the chat template (read from the model directory) and the
documented ASR / translation instructions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment

from specli.errors import ModelLoadError
from specli.models.audio_lm import load_tokenizer, read_chat_template

AUDIO, AUDIO_BOS, AUDIO_EOS = "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"
IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL = (AUDIO, AUDIO_BOS, AUDIO_EOS, IM_START, IM_END, END_OF_TEXT)


def default_instruction(task: str, language: str | None) -> str:
    """Qwen2-Audio's documented instructions: "Detect the language and recognize the speech: <|en|>" (ASR),
    "... translate the speech into English: <|fr|>" (X -> English); the tag names the spoken language."""
    tag = f" <|{language}|>" if language else ""
    if task == "translate":
        return f"Detect the language and translate the speech into English:{tag}"
    return f"Detect the language and recognize the speech:{tag}"


@dataclass(frozen=True)
class SpecialIds:
    """Ids of Qwen2-Audio's control tokens."""

    audio: int  # <|AUDIO|>, expanded to one placeholder per audio embedding
    audio_bos: int
    audio_eos: int
    im_start: int
    im_end: int
    end_of_text: int


class Qwen2AudioText:
    """Text <-> ids and window prompts of one Qwen2-Audio directory."""

    def __init__(self, path: Path) -> None:
        self._tok, ids = load_tokenizer(path, SPECIAL)
        self.special = SpecialIds(ids[AUDIO], ids[AUDIO_BOS], ids[AUDIO_EOS], ids[IM_START], ids[IM_END],
                                  ids[END_OF_TEXT])
        self.template = read_chat_template(path)
        self.eot = self.special.im_end if self.template is not None else self.special.end_of_text

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, tokens: list[int]) -> str:
        """Text of ``tokens`` (control and language tokens dropped)."""
        return self._tok.decode([t for t in tokens if t != self.eot], skip_special_tokens=True)

    def render(self, instruction: str) -> str:
        """The prompt text of one window: the chat template over a user turn of one audio and the
        instruction, with the generation prompt (a base model: the audio markers, then the instruction)."""
        if self.template is None:
            return f"{AUDIO_BOS}{AUDIO}{AUDIO_EOS}{instruction}"
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        messages = [{"role": "user", "content": [{"type": "audio", "audio_url": "window"},
                                                 {"type": "text", "text": instruction}]}]
        return env.from_string(self.template).render(messages=messages, add_generation_prompt=True)

    def prompt(self, instruction: str, n_audio: int) -> list[int]:
        """Token ids of a window's prompt, its one ``<|AUDIO|>`` expanded to ``n_audio`` placeholders."""
        ids = self.encode(self.render(instruction))
        if ids.count(self.special.audio) != 1:
            raise ModelLoadError(f"the chat template gives {ids.count(self.special.audio)} {AUDIO} tokens, not 1")
        at = ids.index(self.special.audio)
        return ids[:at] + [self.special.audio] * n_audio + ids[at + 1 :]
