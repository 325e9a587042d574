"""Whisper tokenizer and special tokens, read from the model's own files.

``tokenizer.json`` gives the text vocabulary and the added special tokens; ``generation_config.json``
(Hugging Face layout) gives the suppress lists and the language / task tables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from specli.errors import ModelLoadError


@dataclass(frozen=True)
class WhisperSpecialTokens:
    """Ids of Whisper's control tokens and the model's suppress lists."""

    eot: int  # <|endoftext|>
    sot: int  # <|startoftranscript|>
    sot_prev: int  # <|startofprev|>
    no_speech: int  # <|nospeech|> (or <|nocaptions|> in older vocabularies)
    no_timestamps: int  # <|notimestamps|>
    timestamp_begin: int  # <|0.00|>; every id from here on is a timestamp
    transcribe: int  # <|transcribe|>
    translate: int  # <|translate|>
    languages: dict[str, int]  # language code ("en") -> language token id
    multilingual: bool  # whether the model has language and task tokens
    suppress_tokens: tuple[int, ...]  # never emitted
    begin_suppress_tokens: tuple[int, ...]  # not emitted as the first sampled token
    max_initial_timestamp_index: int  # largest first timestamp (in 0.02 s steps)

    def prompt(self, language: str | None, task: str = "transcribe", timestamps: bool = False) -> list[int]:
        """The start-of-transcript sequence: sot [language task] [notimestamps]."""
        tokens = [self.sot]
        if self.multilingual:
            if language is None:
                raise ValueError("a multilingual prompt needs a language (detect it first)")
            if language not in self.languages:
                raise ValueError(f"unknown language {language!r} for this model")
            tokens += [self.languages[language], self.translate if task == "translate" else self.transcribe]
        elif task == "translate":
            raise ValueError("this model is English-only and cannot translate")
        if not timestamps:
            tokens.append(self.no_timestamps)
        return tokens


class WhisperTokenizer:
    """Text <-> token ids, plus :class:`WhisperSpecialTokens`."""

    def __init__(self, model_dir: str | Path) -> None:
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{path}: tokenizer.json not found")
        self._tok = Tokenizer.from_file(str(path))
        gen_path = model_dir / "generation_config.json"
        gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
        self.special = self._special_tokens(gen, path)

    def _id(self, token: str, path: Path) -> int:
        tid = self._tok.token_to_id(token)
        if tid is None:
            raise ModelLoadError(f"{path}: special token {token} missing")
        return tid

    def _special_tokens(self, gen: dict, path: Path) -> WhisperSpecialTokens:
        tid = self._tok.token_to_id
        no_timestamps = self._id("<|notimestamps|>", path)
        languages = {k.strip("<|>"): v for k, v in gen.get("lang_to_id", {}).items()}
        multilingual = bool(gen.get("is_multilingual", self._tok.get_vocab_size() >= 51865))
        no_speech = tid("<|nospeech|>")
        return WhisperSpecialTokens(
            eot=self._id("<|endoftext|>", path),
            sot=self._id("<|startoftranscript|>", path),
            sot_prev=self._id("<|startofprev|>", path),
            no_speech=no_speech if no_speech is not None else self._id("<|nocaptions|>", path),
            no_timestamps=no_timestamps,
            timestamp_begin=tid("<|0.00|>") or no_timestamps + 1,
            transcribe=self._id("<|transcribe|>", path),
            translate=self._id("<|translate|>", path),
            languages=languages,
            multilingual=multilingual,
            suppress_tokens=tuple(gen.get("suppress_tokens") or ()),
            begin_suppress_tokens=tuple(gen.get("begin_suppress_tokens") or ()),
            max_initial_timestamp_index=int(gen.get("max_initial_timestamp_index", 50)),
        )

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, tokens: list[int]) -> str:
        """Text of the tokens below ``eot`` (special and timestamp tokens are dropped)."""
        return self._tok.decode([t for t in tokens if t < self.special.eot], skip_special_tokens=False)
