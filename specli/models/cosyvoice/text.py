"""CosyVoice's text tokenizer: the Qwen tokenizer of ``CosyVoice-BlankEN/`` plus CosyVoice's special tokens.

Upstream (``cosyvoice/tokenizer/tokenizer.py``) loads ``AutoTokenizer`` from ``CosyVoice-BlankEN``
and adds special tokens in a fixed order, so their ids (``<|endofprompt|>`` = 151646 on the real
vocabulary) depend on that order: CosyVoice2 adds 19 (``QwenTokenizer``), CosyVoice3 adds those,
``<|endofsystem|>`` and about 260 phoneme tokens (``CosyVoice3Tokenizer``). Loaded offline only.
"""

from __future__ import annotations

from pathlib import Path

from specli.models.cosyvoice.layout import ModelKind

ENDOFPROMPT = "<|endofprompt|>"
# the CosyVoice3 text prefix used when a request has no prompt text (upstream example.py / SpeechSpec)
CV3_DEFAULT_PROMPT = "You are a helpful assistant." + ENDOFPROMPT

_CV2_SPECIALS = (
    "<|im_start|> <|im_end|> <|endofprompt|> [breath] <strong> </strong> [noise] [laughter] [cough] "
    "[clucking] [accent] [quick_breath] <laughter> </laughter> [hissing] [sigh] [vocalized-noise] "
    "[lipsmack] [mn]"
).split()
_CMU = (
    "AA AA0 AA1 AA2 AE AE0 AE1 AE2 AH AH0 AH1 AH2 AO AO0 AO1 AO2 AW AW0 AW1 AW2 AY AY0 AY1 AY2 B CH D DH "
    "EH EH0 EH1 EH2 ER ER0 ER1 ER2 EY EY0 EY1 EY2 F G HH IH IH0 IH1 IH2 IY IY0 IY1 IY2 JH K L M N NG OW OW0 "
    "OW1 OW2 OY OY0 OY1 OY2 P R S SH T TH UH UH0 UH1 UH2 UW UW0 UW1 UW2 V W Y Z ZH"
)
_PINYIN = (
    "a ai an ang ao b c ch d e ei en eng f g h i ian in ing iu ià iàn iàng iào iá ián iáng iáo iè ié iòng "
    "ióng iù iú iā iān iāng iāo iē iě iōng iū iǎ iǎn iǎng iǎo iǒng iǔ j k l m n o ong ou p q r s sh t u "
    "uang ue un uo uà uài uàn uàng uá uái uán uáng uè ué uì uí uò uó uā uāi uān uāng uē uě uī uō uǎ uǎi "
    "uǎn uǎng uǐ uǒ vè w x y z zh à ài àn àng ào á ái án áng áo è èi èn èng èr é éi én éng ér ì ìn ìng í "
    "ín íng ò òng òu ó óng óu ù ùn ú ún ā āi ān āng āo ē ēi ēn ēng ě ěi ěn ěng ěr ī īn īng ō ōng ōu ū ūn "
    "ǎ ǎi ǎn ǎng ǎo ǐ ǐn ǐng ǒ ǒng ǒu ǔ ǔn ǘ ǚ ǜ"
)
_CV3_SPECIALS = [*_CV2_SPECIALS, "<|endofsystem|>", *(f"[{p}]" for p in (*_CMU.split(), *_PINYIN.split()))]


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

    def __len__(self) -> int:
        """Text vocabulary with the special tokens (SpeechSpec's merged layout starts here)."""
        return len(self._tok)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; :class:`TextTokenizerError` when part of it cannot be encoded."""
        try:
            ids = list(self._tok(text)["input_ids"])
        except Exception as exc:  # noqa: BLE001 - tokenizers raise plain Exceptions on bad input
            raise TextTokenizerError(f"cannot tokenize: {exc}") from exc
        if self._unk is not None and self._unk in ids:
            raise TextTokenizerError("contains characters the tokenizer cannot encode")
        return ids
