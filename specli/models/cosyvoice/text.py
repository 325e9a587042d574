"""CosyVoice's text tokenizer: the Qwen tokenizer of ``CosyVoice-BlankEN/`` plus CosyVoice's special tokens.

Upstream (``cosyvoice/tokenizer/tokenizer.py``) loads ``AutoTokenizer`` from ``CosyVoice-BlankEN``
and adds special tokens in a fixed order, so their ids (``<|endofprompt|>`` = 151646 on the real
vocabulary) depend on that order: CosyVoice2 adds 19 (``QwenTokenizer``), CosyVoice3 adds those,
``<|endofsystem|>`` and about 260 phoneme tokens (``CosyVoice3Tokenizer``). Loaded offline only. A CosyVoice3
directory that also holds specli's ``lexicon.txt.gz`` (:mod:`.lexicon`) has its known words written as phoneme
tokens before they are tokenized.
"""

from __future__ import annotations

from pathlib import Path

from specli.models.cosyvoice.layout import ModelKind
from specli.models.cosyvoice.lexicon import CMU_PHONES, LEXICON, Lexicon

ENDOFPROMPT = "<|endofprompt|>"
# the CosyVoice3 text prefix used when a request has no prompt text (upstream example.py / SpeechSpec)
CV3_DEFAULT_PROMPT = "You are a helpful assistant." + ENDOFPROMPT

_CV2_SPECIALS = (
    "<|im_start|> <|im_end|> <|endofprompt|> [breath] <strong> </strong> [noise] [laughter] [cough] "
    "[clucking] [accent] [quick_breath] <laughter> </laughter> [hissing] [sigh] [vocalized-noise] "
    "[lipsmack] [mn]"
).split()
_PINYIN = (
    "a ai an ang ao b c ch d e ei en eng f g h i ian in ing iu ià iàn iàng iào iá ián iáng iáo iè ié iòng "
    "ióng iù iú iā iān iāng iāo iē iě iōng iū iǎ iǎn iǎng iǎo iǒng iǔ j k l m n o ong ou p q r s sh t u "
    "uang ue un uo uà uài uàn uàng uá uái uán uáng uè ué uì uí uò uó uā uāi uān uāng uē uě uī uō uǎ uǎi "
    "uǎn uǎng uǐ uǒ vè w x y z zh à ài àn àng ào á ái án áng áo è èi èn èng èr é éi én éng ér ì ìn ìng í "
    "ín íng ò òng òu ó óng óu ù ùn ú ún ā āi ān āng āo ē ēi ēn ēng ě ěi ěn ěng ěr ī īn īng ō ōng ōu ū ūn "
    "ǎ ǎi ǎn ǎng ǎo ǐ ǐn ǐng ǒ ǒng ǒu ǔ ǔn ǘ ǚ ǜ"
)
_CV3_SPECIALS = [*_CV2_SPECIALS, "<|endofsystem|>", *(f"[{p}]" for p in (*CMU_PHONES, *_PINYIN.split()))]


def special_tokens(kind: ModelKind) -> list[str]:
    """The additional special tokens upstream adds for ``kind``, in upstream's order."""
    return list(_CV2_SPECIALS if kind == "cosyvoice2" else _CV3_SPECIALS)


class TextTokenizerError(ValueError):
    """A text that cannot be encoded (characters outside the vocabulary)."""


class CosyVoiceTokenizer:
    """Text -> Qwen token ids, exactly as upstream's ``QwenTokenizer`` / ``CosyVoice3Tokenizer``."""

    def __init__(self, directory: str | Path, kind: ModelKind) -> None:
        from transformers import AutoTokenizer

        self.kind = kind
        tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        tok.add_special_tokens({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                                "additional_special_tokens": special_tokens(kind)})
        self._tok = tok
        self.endofprompt = tok.convert_tokens_to_ids(ENDOFPROMPT)  # id of <|endofprompt|>
        self._unk = tok.unk_token_id  # None for the real (byte-level) Qwen vocabulary
        lexicon = Path(directory) / LEXICON  # specli's own file: the voice speaks known words from their phonemes
        self.lexicon = Lexicon.load(lexicon) if kind == "cosyvoice3" and lexicon.is_file() else None

    def __len__(self) -> int:
        """Text vocabulary with the special tokens (SpeechSpec's merged layout starts here)."""
        return len(self._tok)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; :class:`TextTokenizerError` when part of it cannot be encoded."""
        if self.lexicon is not None:
            text = self.lexicon.spell(text)
        try:
            ids = list(self._tok(text)["input_ids"])
        except Exception as exc:  # noqa: BLE001 - tokenizers raise plain Exceptions on bad input
            raise TextTokenizerError(f"cannot tokenize: {exc}") from exc
        if self._unk is not None and self._unk in ids:
            raise TextTokenizerError("contains characters the tokenizer cannot encode")
        return ids
