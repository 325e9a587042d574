"""A tiny random Qwen2-Audio saved as a local Hugging Face directory (real transformers classes: audio tower,
projector, Qwen2 LM, a byte-level tokenizer carrying Qwen2-Audio's special tokens, its chat template)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]
VOCAB = 264  # 256 bytes + 6 special tokens, 2 unused rows (the real model's embedding is padded too)
N_MELS = 16

# Qwen2-Audio-7B-Instruct's chat template
CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% for message in messages %}{% if loop.first and "
    "message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}{% if 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}Audio {{ audio_count.value }}: "
    "<|audio_bos|><|AUDIO|><|audio_eos|>\n{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}"
    "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer():
    """A byte-level BPE tokenizer (no merges) with Qwen2-Audio's special tokens (ids 256..261)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(byte_chars))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": SPECIAL})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write_tiny_qwen2_audio(path: Path, seed: int = 0, chat: bool = True) -> Path:
    """Write the tiny model to ``path`` with transformers' own ``save_pretrained`` of the model and the processor
(30-s windows: the tower's max_source_positions is the real 1500)."""
    from transformers import (Qwen2AudioConfig, Qwen2AudioForConditionalGeneration, Qwen2AudioProcessor,
                              WhisperFeatureExtractor)

    tok = tiny_tokenizer()
    audio_id = tok.convert_tokens_to_ids("<|AUDIO|>")
    assert sorted(tok.convert_tokens_to_ids(t) for t in SPECIAL) == list(range(256, 262))
    cfg = Qwen2AudioConfig(
        audio_config=dict(d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
                          num_mel_bins=N_MELS, max_source_positions=1500),
        text_config=dict(model_type="qwen2", hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, vocab_size=VOCAB, tie_word_embeddings=False,
                         initializer_range=0.2, max_position_embeddings=4096),
        audio_token_index=audio_id)
    torch.manual_seed(seed)
    model = Qwen2AudioForConditionalGeneration(cfg).eval()
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.pad_token_id = tok.convert_tokens_to_ids("<|endoftext|>")
    model.save_pretrained(path)
    if not chat:
        tok.chat_template = None
    # as a user saves it: the processor writes the tokenizer, the chat template and (transformers >= 5)
    # processor_config.json with the feature extractor's settings nested, no preprocessor_config.json
    processor = Qwen2AudioProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=N_MELS), tokenizer=tok,
                                    chat_template=tok.chat_template)
    if not chat:
        processor.chat_template = None  # a base model's directory (Qwen2-Audio-7B): no template (the processor
        # would fill in its default one)
    processor.save_pretrained(path)
    return path


def long_clip(clips: list[Path], out: Path, seconds: float = 40.0) -> Path:
    """A 16 kHz clip of at least ``seconds``: the sample clips concatenated (repeated as needed)."""
    parts, total = [], 0
    while total < seconds * 16000:
        for clip in clips:
            audio, rate = sf.read(str(clip), dtype="float32")
            assert rate == 16000
            parts.append(audio if audio.ndim == 1 else audio.mean(1))
            total += len(parts[-1])
    sf.write(str(out), np.concatenate(parts), 16000)
    return out


def config_of(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())
