"""Tiny random CosyVoice2 / CosyVoice3 checkpoints in the official directory layout (offline).

``write_checkpoint(dir, kind)`` writes ``llm.pt`` (official key names), ``cosyvoice{2,3}.yaml`` and
``CosyVoice-BlankEN/`` (a Qwen2 ``config.json`` and a tiny byte-level BPE tokenizer with Qwen's
``<|endoftext|>`` / ``<|im_start|>`` / ``<|im_end|>``; CosyVoice's own special tokens such as
``<|endofprompt|>`` are added at load time, as upstream does). ``boost`` makes one speech id
dominate every step (to exercise stop rules).

The yaml has every top-level entry of upstream's ``cosyvoice{2,3}.yaml`` (HyperPyYAML tags as published,
``!apply`` seeds, ``!ref`` arithmetic): the llm, the tiny flow and HiFT of :mod:`flow_fixtures` (whose weights
:func:`flow_fixtures.write_audio_checkpoint` adds), the GAN training wrapper ``hifigan`` around ``!ref <hift>``
with its discriminators and mel transform, the data-pipeline functions and pipelines, and both train confs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from flow_fixtures import TINY_CV2_FLOW_YAML, TINY_FLOW_YAML, hift_yaml
from transformers import Qwen2Config, Qwen2ForCausalLM

HIDDEN = 32
TEXT_VOCAB = 576  # rows of embed_tokens (>= the tokenizer with CosyVoice3's ~280 special tokens)

# The yaml of a released CosyVoice2/3 directory, entry for entry (the top-level keys and tag classes of upstream's
# examples/libritts/cosyvoice{2,3}/conf/cosyvoice{2,3}.yaml, FunAudioLLM/CosyVoice@ace7c47), with tiny model sizes.
# Besides what inference reads (llm, flow, hift, feat_extractor) it holds what training reads: the GAN wrapper around
# the vocoder with its discriminators and mel transform, the data-pipeline functions and both train confs.
_HEAD = """\
# seeds upstream's loader would set while building the file (a safe reader only records them)
__set_seed1: !apply:random.seed [1986]
__set_seed2: !apply:numpy.random.seed [1986]
__set_seed3: !apply:torch.manual_seed [1986]
__set_seed4: !apply:torch.cuda.manual_seed_all [1986]

sample_rate: 24000
llm_input_size: {hidden}
llm_output_size: {hidden}
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2
chunk_size: {chunk}  # tokens per streaming chunk (tiny: the tiny flows' chunks)
num_decoding_left_chunks: -1

llm: !new:cosyvoice.llm.llm.{llm}
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

"""

_MEL = """\
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: {fmax}
    center: False
"""

# training only: the vocoder inside its GAN wrapper, the discriminators, the mel the GAN loss compares
_GAN = """\
mel_spec_transform1: !name:matcha.utils.audio.mel_spectrogram
{mel}hifigan: !new:cosyvoice.hifigan.hifigan.HiFiGan
    generator: !ref <hift>
    discriminator: !new:cosyvoice.hifigan.discriminator.MultipleDiscriminator
        mpd: !new:matcha.hifigan.models.MultiPeriodDiscriminator
        mrd: !new:cosyvoice.hifigan.discriminator.MultiResSpecDiscriminator
    mel_spec_transform: [!ref <mel_spec_transform1>]

""".format(mel=_MEL.format(fmax="null"))

# the data pipeline's functions (bound, never called at inference), then the two pipelines and the train confs
_DATA = """\
parquet_opener: !name:cosyvoice.dataset.processor.parquet_opener
get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
    token_path: !ref <qwen_pretrain_path>
    skip_special_tokens: True
{tokenizer_version}allowed_special: 'all'
tokenize: !name:cosyvoice.dataset.processor.tokenize
    get_tokenizer: !ref <get_tokenizer>
    allowed_special: !ref <allowed_special>
filter: !name:cosyvoice.dataset.processor.filter
    max_length: 6000
    min_length: 100
    token_max_length: 200
    token_min_length: 1
resample: !name:cosyvoice.dataset.processor.resample
    resample_rate: !ref <sample_rate>
truncate: !name:cosyvoice.dataset.processor.truncate
    truncate_length: {truncate}  # a whole number of mel hops (and of tokens)
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
{mel}compute_fbank: !name:cosyvoice.dataset.processor.compute_fbank
    feat_extractor: !ref <feat_extractor>
    num_frames: 960
compute_whisper_fbank: !name:cosyvoice.dataset.processor.compute_whisper_fbank
    num_frames: 960
compute_f0: !name:cosyvoice.dataset.processor.compute_f0
    sample_rate: !ref <sample_rate>
    hop_size: 480
parse_embedding: !name:cosyvoice.dataset.processor.parse_embedding
    normalize: True
shuffle: !name:cosyvoice.dataset.processor.shuffle
    shuffle_size: 1000
sort: !name:cosyvoice.dataset.processor.sort
    sort_size: 500
batch: !name:cosyvoice.dataset.processor.batch
    batch_type: 'dynamic'
    max_frames_in_batch: 2000
padding: !name:cosyvoice.dataset.processor.padding
    use_spk_embedding: False

data_pipeline: [!ref <parquet_opener>, !ref <tokenize>, !ref <filter>, !ref <resample>, !ref <compute_fbank>,
                !ref <parse_embedding>, !ref <compute_whisper_fbank>, !ref <shuffle>, !ref <sort>, !ref <batch>,
                !ref <padding>]
data_pipeline_gan: [!ref <parquet_opener>, !ref <tokenize>, !ref <filter>, !ref <resample>, !ref <truncate>,
                    !ref <compute_fbank>, !ref <compute_f0>, !ref <parse_embedding>, !ref <shuffle>, !ref <sort>,
                    !ref <batch>, !ref <padding>]

train_conf:  # LLM and flow
    optim: adam
    optim_conf:
        lr: 1e-5
    scheduler: constantlr
    scheduler_conf:
        warmup_steps: 2500
    max_epoch: 200
    grad_clip: 5
    accum_grad: 2
    log_interval: 100
    save_per_step: -1
train_conf_gan:  # the vocoder (generator and discriminator)
    optim: adam
    optim_conf:
        lr: 0.0002
    scheduler: constantlr
    optim_d: adam
    optim_conf_d:
        lr: 0.0002
    scheduler_d: constantlr
    max_epoch: 200
    grad_clip: 5
    accum_grad: 1
    log_interval: 100
    save_per_step: -1
"""

CHUNK_SIZE = 4  # top-level chunk_size: the tiny flows' 4-token (8-frame) chunks, referenced as upstream does


def _flow_yaml(kind: str) -> str:
    """The tiny ``flow:`` entry of ``kind`` (:mod:`flow_fixtures`) with its chunk sizes as upstream's ``!ref``."""
    cv3 = kind == "cosyvoice3"
    text = TINY_FLOW_YAML if cv3 else TINY_CV2_FLOW_YAML
    subs = [("            static_chunk_size: 8\n", "            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>\n"),
            ("            num_decoding_left_chunks: -1\n", "            num_decoding_left_chunks: !ref <num_decoding_left_chunks>\n")]
    if not cv3:
        subs.append(("        static_chunk_size: 4\n", "        static_chunk_size: !ref <chunk_size>\n"))
    for old, new in subs:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def checkpoint_yaml(kind: str) -> str:
    """The ``cosyvoice{2,3}.yaml`` text of a tiny ``kind`` directory in the official structure."""
    cv3 = kind == "cosyvoice3"
    head = _HEAD.format(hidden=HIDDEN, chunk=CHUNK_SIZE, llm="CosyVoice3LM" if cv3 else "Qwen2LM")
    data = _DATA.format(tokenizer_version="    version: cosyvoice3\n" if cv3 else "", truncate=24960 if cv3 else 24480,
                        mel=_MEL.format(fmax="null" if cv3 else 8000))
    return head + _flow_yaml(kind) + "\n" + hift_yaml(kind, 16, 8) + "\n" + _GAN + data


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
    name = "cosyvoice3.yaml" if kind == "cosyvoice3" else "cosyvoice2.yaml"
    (path / name).write_text(checkpoint_yaml(kind))
    blank = path / "CosyVoice-BlankEN"
    _tokenizer_dir(blank)
    cfg = qwen_config().to_dict()
    cfg["architectures"] = ["Qwen2ForCausalLM"]
    (blank / "config.json").write_text(json.dumps(cfg))
    torch.save(_weights(kind, seed, boost), path / "llm.pt")
    return path
