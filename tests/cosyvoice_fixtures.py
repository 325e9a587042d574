"""Tiny random CosyVoice2 / CosyVoice3 checkpoints in the official directory layout (offline).

``write_checkpoint(dir, kind)`` writes ``llm.pt`` (official key names), ``cosyvoice{2,3}.yaml``
(HyperPyYAML tags as published, including ``!apply`` seeds and ``!ref`` arithmetic) and
``CosyVoice-BlankEN/`` (a Qwen2 ``config.json`` and a tiny byte-level BPE tokenizer with Qwen's
``<|endoftext|>`` / ``<|im_start|>`` / ``<|im_end|>``; CosyVoice's own special tokens such as
``<|endofprompt|>`` are added at load time, as upstream does). ``boost`` makes one speech id
dominate every step (to exercise stop rules).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

HIDDEN = 32
TEXT_VOCAB = 576  # rows of embed_tokens (>= the tokenizer with CosyVoice3's ~280 special tokens)

_YAML = """\
# set random seed, so that you may reproduce your result.
__set_seed1: !apply:random.seed [1986]
__set_seed2: !apply:numpy.random.seed [1986]
__set_seed3: !apply:torch.manual_seed [1986]

# fixed params
sample_rate: 24000
llm_input_size: {hidden}
llm_output_size: {hidden}
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2

llm: !new:cosyvoice.llm.llm.{cls}
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: 6561
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1

flow: !new:cosyvoice.flow.flow.{flow}
    input_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    vocab_size: 6561
    input_frame_rate: !ref <token_frame_rate>
    token_mel_ratio: !ref <token_mel_ratio>
    static_chunk_size: !ref <token_frame_rate> * <token_mel_ratio>
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'

get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
    token_path: !ref <qwen_pretrain_path>
    skip_special_tokens: True
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    sampling_rate: !ref <sample_rate>
data_pipeline: [
    !ref <feat_extractor>,
    !ref <get_tokenizer>,
]
train_conf:
    optim: adam
    optim_conf:
        lr: 1e-5
"""


def _byte_chars() -> list[str]:
    """GPT-2 / Qwen byte-level alphabet: one printable character per byte value."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _tokenizer_dir(out: Path) -> None:
    """A byte-level BPE vocabulary (every text encodes, as with Qwen) with a few merges."""
    byte_chars = _byte_chars()
    merges = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he"), ("e", "r")]
    vocab = {c: i for i, c in enumerate(byte_chars)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
                                    encoding="utf-8")
    decoder = {str(len(vocab) + i): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                     "normalized": False, "single_word": False} for i, t in enumerate(specials)}
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "Qwen2Tokenizer", "added_tokens_decoder": decoder, "eos_token": "<|endoftext|>",
         "pad_token": "<|endoftext|>", "unk_token": None, "model_max_length": 32768}))


def qwen_config() -> Qwen2Config:
    return Qwen2Config(vocab_size=TEXT_VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=64, max_position_embeddings=4096,
                       rope_theta=10000.0, tie_word_embeddings=True, rms_norm_eps=1e-6)


def _weights(kind: str, seed: int, boost: int | None) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    qwen = Qwen2ForCausalLM(qwen_config())
    rows = 6561 + (3 if kind == "cosyvoice2" else 200)
    sd: dict[str, torch.Tensor] = {}
    for name, p in qwen.state_dict().items():
        p = p.clone()
        if p.dim() == 2:
            p.normal_(0, 0.3)
        elif name.endswith("bias"):
            p.normal_(0, 0.1)
        sd[f"llm.model.{name}"] = p  # llm.model.model.* (Qwen body), llm.model.lm_head.weight
    sd["speech_embedding.weight"] = torch.randn(rows, HIDDEN)
    sd["llm_decoder.weight"] = torch.randn(rows, HIDDEN) * 0.5
    if kind == "cosyvoice2":
        sd["llm_decoder.bias"] = torch.randn(rows) * 0.5
        sd["llm_embedding.weight"] = torch.randn(2, HIDDEN)
    if boost is not None:  # a constant direction in every input, read by one head row
        for key in ("speech_embedding.weight", "llm_embedding.weight", "llm.model.model.embed_tokens.weight"):
            if key in sd:
                sd[key][:, 0] = 30.0
        sd["llm_decoder.weight"][boost, 0] = 50.0
    sd["llm.model.lm_head.weight"] = sd["llm.model.model.embed_tokens.weight"].clone()  # tied, as in Qwen2.5-0.5B
    return sd


def write_checkpoint(path: Path, kind: str = "cosyvoice2", seed: int = 0, boost: int | None = None) -> Path:
    """Write a tiny random checkpoint directory for ``kind`` at ``path`` and return ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    cv3 = kind == "cosyvoice3"
    yaml = _YAML.format(hidden=HIDDEN, cls="CosyVoice3LM" if cv3 else "Qwen2LM",
                        flow="CausalMaskedDiffWithDiT" if cv3 else "CausalMaskedDiffWithXvec")
    (path / ("cosyvoice3.yaml" if cv3 else "cosyvoice2.yaml")).write_text(yaml)
    blank = path / "CosyVoice-BlankEN"
    _tokenizer_dir(blank)
    cfg = qwen_config().to_dict()
    cfg["architectures"] = ["Qwen2ForCausalLM"]
    (blank / "config.json").write_text(json.dumps(cfg))
    torch.save(_weights(kind, seed, boost), path / "llm.pt")
    return path
