"""Spoken languages: the language table (Whisper's codes and names, which every family's options use), name/code
normalisation, and the check of an English-only model name (``*.en``) made before anything loads."""

from __future__ import annotations

from specli.errors import UsageError

# Whisper's language codes and names, in its language-token order (the multilingual models have the first
# 99; "yue" came with large-v3). A given model's own table is ``WhisperSpecialTokens.languages``.
LANGUAGES: dict[str, str] = {
    "en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ru": "russian", "ko": "korean",
    "fr": "french", "ja": "japanese", "pt": "portuguese", "tr": "turkish", "pl": "polish", "ca": "catalan",
    "nl": "dutch", "ar": "arabic", "sv": "swedish", "it": "italian", "id": "indonesian", "hi": "hindi",
    "fi": "finnish", "vi": "vietnamese", "he": "hebrew", "uk": "ukrainian", "el": "greek", "ms": "malay",
    "cs": "czech", "ro": "romanian", "da": "danish", "hu": "hungarian", "ta": "tamil", "no": "norwegian",
    "th": "thai", "ur": "urdu", "hr": "croatian", "bg": "bulgarian", "lt": "lithuanian", "la": "latin",
    "mi": "maori", "ml": "malayalam", "cy": "welsh", "sk": "slovak", "te": "telugu", "fa": "persian",
    "lv": "latvian", "bn": "bengali", "sr": "serbian", "az": "azerbaijani", "sl": "slovenian",
    "kn": "kannada", "et": "estonian", "mk": "macedonian", "br": "breton", "eu": "basque",
    "is": "icelandic", "hy": "armenian", "ne": "nepali", "mn": "mongolian", "bs": "bosnian",
    "kk": "kazakh", "sq": "albanian", "sw": "swahili", "gl": "galician", "mr": "marathi", "pa": "punjabi",
    "si": "sinhala", "km": "khmer", "sn": "shona", "yo": "yoruba", "so": "somali", "af": "afrikaans",
    "oc": "occitan", "ka": "georgian", "be": "belarusian", "tg": "tajik", "sd": "sindhi",
    "gu": "gujarati", "am": "amharic", "yi": "yiddish", "lo": "lao", "uz": "uzbek", "fo": "faroese",
    "ht": "haitian creole", "ps": "pashto", "tk": "turkmen", "nn": "nynorsk", "mt": "maltese",
    "sa": "sanskrit", "lb": "luxembourgish", "my": "myanmar", "bo": "tibetan", "tl": "tagalog",
    "mg": "malagasy", "as": "assamese", "tt": "tatar", "haw": "hawaiian", "ln": "lingala", "ha": "hausa",
    "ba": "bashkir", "jw": "javanese", "su": "sundanese", "yue": "cantonese",
}

# other names Whisper accepts for a language (besides the names above)
ALIASES: dict[str, str] = {
    "burmese": "my", "valencian": "ca", "flemish": "nl", "haitian": "ht", "letzeburgesch": "lb",
    "pushto": "ps", "panjabi": "pa", "moldavian": "ro", "moldovan": "ro", "sinhalese": "si",
    "castilian": "es", "mandarin": "zh",
}

TO_LANGUAGE_CODE: dict[str, str] = {**{name: code for code, name in LANGUAGES.items()}, **ALIASES}


def normalize_language(value: str | None) -> str | None:
    """The language code for a code or name (any case: "fr", "French", "castilian"); None stays None.

    Raises :class:`UsageError` (exit 2) for anything Whisper does not know.
    """
    if value is None:
        return None
    key = " ".join(value.strip().lower().replace("_", " ").split())
    if key in LANGUAGES:
        return key
    if key in TO_LANGUAGE_CODE:
        return TO_LANGUAGE_CODE[key]
    raise UsageError(
        f"unknown language {value!r}: give a Whisper language code or name "
        f"(e.g. en, fr, es, 'english', 'castilian'; {len(LANGUAGES)} languages)"
    )


def looks_english_only(model: str) -> bool:
    """Whether a model name/path names an English-only Whisper model (``*.en``), known before loading."""
    return model.rstrip("/\\").lower().endswith(".en")


def english_only_problem(model: str, task: str, language: str | None) -> str | None:
    if task == "translate":
        return f"model {model!r} is English-only and cannot translate: use a multilingual model"
    if language not in (None, "en"):
        return (f"model {model!r} is English-only and cannot transcribe language {language!r}: "
                "use a multilingual model or --language en")
    return None


def check_model_name(model: str, task: str, language: str | None) -> None:
    """Reject an English-only model (by its name) with a non-English language or translate, before loading."""
    problem = english_only_problem(model, task, language) if looks_english_only(model) else None
    if problem:
        raise UsageError(problem)
