"""A tiny random Qwen3-ASR saved as a local Hugging Face directory (real transformers classes: the AuT audio
encoder, projector, Qwen3 LM with q/k norms and explicit head_dim, a byte-level tokenizer carrying Qwen3-ASR's
special tokens, a chat template of the official layout, Qwen3-ASR's feature extractor)."""

from __future__ import annotations

from pathlib import Path

import torch

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>",
           "<asr_text>"]
PROCESSOR_TOKENS = {"audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>",
                    "audio_eos_token": "<|audio_end|>"}  # what Qwen3ASRProcessor reads from the tokenizer
VOCAB = 264  # 256 bytes + 7 special tokens, 1 unused row
N_MELS = 16

# the official layout: a system turn (the context, empty by default), the user's audio, the assistant turn
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\n<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for c in message['content'] %}{% if c['type'] == 'audio' %}"
    "<|audio_start|><|audio_pad|><|audio_end|>{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer():
    """A byte-level BPE tokenizer (no merges) with Qwen3-ASR's special tokens (ids 256..262)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   extra_special_tokens=PROCESSOR_TOKENS)
    fast.add_special_tokens({"additional_special_tokens": SPECIAL})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write_tiny_qwen3_asr(path: Path, seed: int = 0) -> Path:
    """Write the tiny model to ``path`` with transformers' own ``save_pretrained`` of the model and the processor
(the real chunking: 100-frame chunks, 13 audio positions each)."""
    from transformers import (Qwen3ASRConfig, Qwen3ASRFeatureExtractor, Qwen3ASRForConditionalGeneration,
                              Qwen3ASRProcessor)

    tok = tiny_tokenizer()
    assert sorted(tok.convert_tokens_to_ids(t) for t in SPECIAL) == list(range(256, 263))
    cfg = Qwen3ASRConfig(
        audio_config=dict(d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
                          num_mel_bins=N_MELS, output_dim=64, downsample_hidden_size=8),
        text_config=dict(model_type="qwen3", hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=24, intermediate_size=128, vocab_size=VOCAB,
                         tie_word_embeddings=True, initializer_range=0.2, max_position_embeddings=4096),
        audio_token_id=tok.convert_tokens_to_ids("<|audio_pad|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=[tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")])
    torch.manual_seed(seed)
    model = Qwen3ASRForConditionalGeneration(cfg).eval()
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")  # the decode's one eot
    model.generation_config.pad_token_id = cfg.pad_token_id
    model.save_pretrained(path)
    # as a user saves it: the processor writes the tokenizer, the chat template and (transformers >= 5)
    # processor_config.json with the feature extractor's settings nested, no preprocessor_config.json
    Qwen3ASRProcessor(feature_extractor=Qwen3ASRFeatureExtractor(feature_size=N_MELS), tokenizer=tok,
                      chat_template=tok.chat_template).save_pretrained(path)
    return path
