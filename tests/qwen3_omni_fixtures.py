"""A tiny random Qwen3-Omni (``Qwen3OmniMoeForConditionalGeneration``, ``enable_audio_output=False``: no talker)
saved as a local Hugging Face directory: AuT audio encoder, a vision tower of depth 1, the MoE thinker text model
(8 experts, top-2, one dense layer), a byte-level tokenizer carrying Omni's special tokens and a chat template,
Whisper's feature extractor (the Omni processor's), saved in transformers 5's processor_config.json."""

from __future__ import annotations

from pathlib import Path

import torch

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>",
           "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
VOCAB = 272  # 256 bytes + 10 special tokens, 6 unused rows
N_MELS = 16

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for c in message['content'] %}{% if c['type'] == 'audio' %}"
    "<|audio_start|><|audio_pad|><|audio_end|>{% elif c['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer():
    """A byte-level BPE tokenizer (no merges) with Omni's special tokens (ids 256..265, see :data:`IDS`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": SPECIAL})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config():
    from transformers import Qwen3OmniMoeConfig

    thinker = dict(
        audio_config=dict(d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
                          num_mel_bins=N_MELS, output_dim=64, downsample_hidden_size=8),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=4, spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[0]),
        text_config=dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                         num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1], vocab_size=VOCAB,
                         initializer_range=0.2, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "mrope_section": [2, 3, 3], "mrope_interleaved": True}),
        audio_token_id=IDS["<|audio_pad|>"], audio_start_token_id=IDS["<|audio_start|>"],
        image_token_id=IDS["<|image_pad|>"], video_token_id=IDS["<|video_pad|>"],
        vision_start_token_id=IDS["<|vision_start|>"])
    return Qwen3OmniMoeConfig(enable_audio_output=False, thinker_config=thinker,
                              im_start_token_id=IDS["<|im_start|>"], im_end_token_id=IDS["<|im_end|>"])


def write_tiny_qwen3_omni(path: Path, seed: int = 0) -> Path:
    """Write the tiny model to ``path``: the model and tokenizer with transformers' own ``save_pretrained``, the
processor's settings as transformers >= 5 writes them (:func:`write_processor_config`)."""
    from transformers import Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor

    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(tiny_config()).eval()
    model.generation_config.eos_token_id = IDS["<|im_end|>"]
    model.generation_config.pad_token_id = IDS["<|endoftext|>"]
    model.save_pretrained(path)
    tok.save_pretrained(path)  # tokenizer.json, tokenizer_config.json, chat_template.jinja (as the processor does)
    write_processor_config(path, WhisperFeatureExtractor(feature_size=N_MELS))
    return path


def write_processor_config(path: Path, feature_extractor) -> None:
    """``processor_config.json`` as ``Qwen3OmniMoeProcessor.save_pretrained`` writes it in transformers >= 5 (no
    ``preprocessor_config.json``): its parts' ``to_dict()`` nested under their names, ``processor_class``, in
    ``ProcessorMixin.to_json_string``'s format. The processor itself cannot be built here: its video processor
    needs torchvision, which a CPU torch does not have, so the vision entries (never read for speech) are left
    out."""
    import json

    cfg = {"feature_extractor": feature_extractor.to_dict(), "processor_class": "Qwen3OmniMoeProcessor"}
    (path / "processor_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


IDS = {t: tiny_tokenizer().convert_tokens_to_ids(t) for t in SPECIAL}  # the tokenizer's ids of SPECIAL
assert sorted(IDS.values()) == list(range(256, 266))
