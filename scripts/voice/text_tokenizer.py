"""Train specli-en's text tokenizer: a byte-level BPE (every text encodes, as Qwen's does) on the training sentences.

Saved in the ``CosyVoice-BlankEN`` layout the CosyVoice loader reads (``vocab.json`` + ``merges.txt`` +
``tokenizer_config.json`` naming ``Qwen2Tokenizer``, Qwen's ``<|endoftext|>`` / ``<|im_start|>`` / ``<|im_end|>``);
specli's loader then appends CosyVoice3's special tokens (``<|endofprompt|>`` and the ~280 phoneme tokens) after
them, as upstream does. Pre-tokenisation during training is Qwen2's own split (the pattern Qwen2Tokenizer
applies), so the merges learnt are the merges used. Only training sentences are read (held-out ones never are).

    python -m scripts.voice text-tokenizer --work DIR --vocab 1024     # -> data/voice/blank (committed)
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from .common import clips, log

# transformers' Qwen2Tokenizer pre-tokenisation pattern
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                 r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def train_bpe(texts: list[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of ``vocab_size`` entries (256 bytes + merges), specials excluded."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, min_frequency=2)
    tok.train_from_iterator(texts, trainer)
    return tok


def save_blank(tok: Tokenizer, out: Path) -> int:
    """Write vocab.json, merges.txt and tokenizer_config.json; the vocabulary size with Qwen's three specials."""
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{m}\n" for m in merges), encoding="utf-8")
    decoder = {str(len(vocab) + i): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                     "normalized": False, "single_word": False} for i, t in enumerate(SPECIALS)}
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "Qwen2Tokenizer", "added_tokens_decoder": decoder, "eos_token": "<|endoftext|>",
         "pad_token": "<|endoftext|>", "unk_token": None, "model_max_length": 32768}, indent=1))
    return len(vocab) + len(SPECIALS)


def train(corpus: Path, out: Path, vocab: int) -> None:
    """The BPE of ``vocab`` entries on the training sentences of ``corpus``, saved to ``out``."""
    texts = [c.text for c in clips("train", corpus)]
    tok = train_bpe(texts, vocab)
    size = save_blank(tok, out)
    words = sum(len(t.split()) for t in texts)
    pieces = sum(len(tok.encode(t).ids) for t in texts)
    log(f"{out}: {size} tokens (with Qwen's specials) from {len(texts)} sentences; "
        f"{pieces / words:.2f} tokens per word")
