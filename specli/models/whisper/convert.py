"""Map a CTranslate2 ``WhisperSpec`` onto a Hugging Face Whisper model directory.

CT2 fuses self-attention q/k/v into ``self_attention/linear_0`` and cross-attention
k/v into ``attention/linear_1`` (q in ``linear_0``, output in ``linear_2``); layer
norms are ``gamma``/``beta``. Hugging Face's ``k_proj`` has no bias: CT2 stores
zeros there, and a key bias would cancel in the softmax anyway, so dropping it is
exact. ``proj_out.weight`` is tied to ``model.decoder.embed_tokens.weight`` and
is therefore not written.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from specli.models.whisper.ct2 import Ct2Model
from specli.errors import ModelLoadError

MULTILINGUAL_MIN_VOCAB = 51865
MAX_INITIAL_TIMESTAMP_INDEX = 50
#: CT2 ``ops::ActivationType`` -> Hugging Face ``activation_function``.
_ACTIVATIONS = MappingProxyType({0: "relu", 1: "gelu_new", 2: "silu", 3: "gelu"})
_LAYER_RE = re.compile(r"^(encoder|decoder)/layer_(\d+)/")


@dataclass(frozen=True)
class WhisperDims:
    """Architecture numbers derived from tensor shapes and stored head counts."""

    vocab_size: int
    num_mel_bins: int
    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_attention_heads: int
    decoder_attention_heads: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int
    max_source_positions: int
    max_target_positions: int
    activation_function: str
    scale_embedding: bool

    @property
    def is_multilingual(self) -> bool:
        """Multilingual checkpoints have a vocabulary of at least 51865 tokens."""
        return self.vocab_size >= MULTILINGUAL_MIN_VOCAB


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of Whisper's special tokens, read from tokenizer.json's added tokens."""

    endoftext: int
    startoftranscript: int
    translate: int
    transcribe: int
    startofprev: int
    nospeech: int
    notimestamps: int
    languages: Mapping[str, int]


def _count_layers(model: Ct2Model, stack: str) -> int:
    indices = {int(m.group(2)) for n in model.variables if (m := _LAYER_RE.match(n)) and m.group(1) == stack}
    if not indices or indices != set(range(len(indices))):
        raise ModelLoadError(f"{model.parts[0]}: {stack} layers are missing or not numbered 0..N-1")
    return len(indices)


def infer_dims(model: Ct2Model) -> WhisperDims:
    """Derive the Whisper architecture from a WhisperSpec model."""
    if model.spec_name != "WhisperSpec":
        raise ModelLoadError(f"{model.parts[0]} holds a {model.spec_name}, not a CTranslate2 WhisperSpec")
    try:
        _check_flags(model)
        embed = model.get("decoder/embeddings/weight").shape
        conv1 = model.get("encoder/conv1/weight").shape
        return WhisperDims(
            vocab_size=embed[0],
            num_mel_bins=conv1[1],
            d_model=embed[1],
            encoder_layers=_count_layers(model, "encoder"),
            decoder_layers=_count_layers(model, "decoder"),
            encoder_attention_heads=int(model.scalar("encoder/num_heads")),
            decoder_attention_heads=int(model.scalar("decoder/num_heads")),
            encoder_ffn_dim=model.get("encoder/layer_0/ffn/linear_0/weight").shape[0],
            decoder_ffn_dim=model.get("decoder/layer_0/ffn/linear_0/weight").shape[0],
            max_source_positions=model.get("encoder/position_encodings/encodings").shape[0],
            max_target_positions=model.get("decoder/position_encodings/encodings").shape[0],
            activation_function=_ACTIVATIONS[int(model.scalar("decoder/activation"))],
            scale_embedding=bool(model.scalar("decoder/scale_embeddings")),
        )
    except KeyError as exc:
        raise ModelLoadError(f"{model.parts[0]}: WhisperSpec variable {exc} is missing or unknown") from exc


def _check_flags(model: Ct2Model) -> None:
    unsupported = {"decoder/pre_norm": 1, "decoder/alibi": 0}
    for name, wanted in unsupported.items():
        if name in model and int(model.scalar(name)) != wanted:
            raise ModelLoadError(f"{model.parts[0]}: unsupported Whisper variant ({name}={model.scalar(name)})")


def _linear(model: Ct2Model, src: str, dst: str, out: dict[str, np.ndarray]) -> None:
    out[f"{dst}.weight"] = model.float32(f"{src}/weight")
    if f"{src}/bias" in model:
        out[f"{dst}.bias"] = model.float32(f"{src}/bias")


def _norm(model: Ct2Model, src: str, dst: str, out: dict[str, np.ndarray]) -> None:
    out[f"{dst}.weight"] = model.float32(f"{src}/gamma")
    out[f"{dst}.bias"] = model.float32(f"{src}/beta")


def _fused(model: Ct2Model, src: str, dsts: tuple[str, ...], out: dict[str, np.ndarray]) -> None:
    """Split a fused linear along its output rows; k_proj gets no bias."""
    weights = np.split(model.float32(f"{src}/weight"), len(dsts), axis=0)
    biases = np.split(model.float32(f"{src}/bias"), len(dsts), axis=0)
    for dst, weight, bias in zip(dsts, weights, biases):
        out[f"{dst}.weight"] = np.ascontiguousarray(weight).copy()
        if not dst.endswith("k_proj"):
            out[f"{dst}.bias"] = np.ascontiguousarray(bias).copy()


def _ffn(model: Ct2Model, src: str, dst: str, out: dict[str, np.ndarray]) -> None:
    _norm(model, f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm", out)
    _linear(model, f"{src}/ffn/linear_0", f"{dst}.fc1", out)
    _linear(model, f"{src}/ffn/linear_1", f"{dst}.fc2", out)


def _self_attention(model: Ct2Model, src: str, dst: str, out: dict[str, np.ndarray]) -> None:
    qkv = tuple(f"{dst}.self_attn.{p}_proj" for p in "qkv")
    _fused(model, f"{src}/self_attention/linear_0", qkv, out)
    _linear(model, f"{src}/self_attention/linear_1", f"{dst}.self_attn.out_proj", out)
    _norm(model, f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm", out)


def _cross_attention(model: Ct2Model, src: str, dst: str, out: dict[str, np.ndarray]) -> None:
    _linear(model, f"{src}/attention/linear_0", f"{dst}.encoder_attn.q_proj", out)
    kv = (f"{dst}.encoder_attn.k_proj", f"{dst}.encoder_attn.v_proj")
    _fused(model, f"{src}/attention/linear_1", kv, out)
    _linear(model, f"{src}/attention/linear_2", f"{dst}.encoder_attn.out_proj", out)
    _norm(model, f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm", out)


def hf_state_dict(model: Ct2Model, dims: WhisperDims) -> dict[str, np.ndarray]:
    """Float32 arrays under ``WhisperForConditionalGeneration`` key names (proj_out is tied)."""
    out: dict[str, np.ndarray] = {}
    try:
        for conv in ("conv1", "conv2"):
            _linear(model, f"encoder/{conv}", f"model.encoder.{conv}", out)
        out["model.encoder.embed_positions.weight"] = model.float32("encoder/position_encodings/encodings")
        for i in range(dims.encoder_layers):
            _self_attention(model, f"encoder/layer_{i}", f"model.encoder.layers.{i}", out)
            _ffn(model, f"encoder/layer_{i}", f"model.encoder.layers.{i}", out)
        _norm(model, "encoder/layer_norm", "model.encoder.layer_norm", out)
        out["model.decoder.embed_tokens.weight"] = model.float32("decoder/embeddings/weight")
        out["model.decoder.embed_positions.weight"] = model.float32("decoder/position_encodings/encodings")
        for i in range(dims.decoder_layers):
            _self_attention(model, f"decoder/layer_{i}", f"model.decoder.layers.{i}", out)
            _cross_attention(model, f"decoder/layer_{i}", f"model.decoder.layers.{i}", out)
            _ffn(model, f"decoder/layer_{i}", f"model.decoder.layers.{i}", out)
        _norm(model, "decoder/layer_norm", "model.decoder.layer_norm", out)
    except KeyError as exc:
        raise ModelLoadError(f"{model.parts[0]}: WhisperSpec variable {exc} is missing") from exc
    return out


def read_special_tokens(tokenizer_json: Path) -> SpecialTokens:
    """Read special token ids from a tokenizer.json's ``added_tokens``."""
    try:
        added = json.loads(tokenizer_json.read_text(encoding="utf-8"))["added_tokens"]
        ids = {tok["content"]: int(tok["id"]) for tok in added}
        sot, translate = ids["<|startoftranscript|>"], ids["<|translate|>"]
        nospeech = ids.get("<|nospeech|>", ids.get("<|nocaptions|>"))
        if nospeech is None:
            raise KeyError("<|nocaptions|>")
        languages = {t: i for t, i in sorted(ids.items(), key=lambda kv: kv[1]) if sot < i < translate}
        return SpecialTokens(
            endoftext=ids["<|endoftext|>"],
            startoftranscript=sot,
            translate=translate,
            transcribe=ids["<|transcribe|>"],
            startofprev=ids["<|startofprev|>"],
            nospeech=nospeech,
            notimestamps=ids["<|notimestamps|>"],
            languages=MappingProxyType(languages),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{tokenizer_json}: cannot read Whisper special tokens ({exc!r})") from exc


def hf_config(dims: WhisperDims, tokens: SpecialTokens) -> dict[str, Any]:
    """The ``config.json`` of a ``WhisperForConditionalGeneration`` directory."""
    return {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "vocab_size": dims.vocab_size,
        "num_mel_bins": dims.num_mel_bins,
        "d_model": dims.d_model,
        "encoder_layers": dims.encoder_layers,
        "decoder_layers": dims.decoder_layers,
        "num_hidden_layers": dims.encoder_layers,
        "encoder_attention_heads": dims.encoder_attention_heads,
        "decoder_attention_heads": dims.decoder_attention_heads,
        "encoder_ffn_dim": dims.encoder_ffn_dim,
        "decoder_ffn_dim": dims.decoder_ffn_dim,
        "max_source_positions": dims.max_source_positions,
        "max_target_positions": dims.max_target_positions,
        "activation_function": dims.activation_function,
        "scale_embedding": dims.scale_embedding,
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "init_std": 0.02,
        "use_cache": True,
        "is_encoder_decoder": True,
        "tie_word_embeddings": True,
        "bos_token_id": tokens.endoftext,
        "eos_token_id": tokens.endoftext,
        "pad_token_id": tokens.endoftext,
        "decoder_start_token_id": tokens.startoftranscript,
        "median_filter_width": 7,
        "dtype": "float32",
    }


def _default_alignment_heads(dims: WhisperDims) -> list[list[int]]:
    """CTranslate2's fallback: every head of the second half of the decoder layers."""
    first = dims.decoder_layers // 2
    heads = range(dims.decoder_attention_heads)
    return [[layer, head] for layer in range(first, dims.decoder_layers) for head in heads]


def generation_config(dims: WhisperDims, tokens: SpecialTokens, ct2_config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``generation_config.json`` of the official openai/whisper-* repositories."""
    config: dict[str, Any] = {
        "alignment_heads": [list(map(int, pair)) for pair in ct2_config.get("alignment_heads") or []]
        or _default_alignment_heads(dims),
        "begin_suppress_tokens": list(ct2_config.get("suppress_ids_begin", [220, tokens.endoftext])),
        "bos_token_id": tokens.endoftext,
        "decoder_start_token_id": tokens.startoftranscript,
        "eos_token_id": tokens.endoftext,
        "pad_token_id": tokens.endoftext,
        "is_multilingual": dims.is_multilingual,
        "max_initial_timestamp_index": MAX_INITIAL_TIMESTAMP_INDEX,
        "max_length": dims.max_target_positions,
        "no_timestamps_token_id": tokens.notimestamps,
        "prev_sot_token_id": tokens.startofprev,
        "return_timestamps": False,
        "suppress_tokens": list(ct2_config.get("suppress_ids", [])),
    }
    if dims.is_multilingual:
        config["lang_to_id"] = dict(tokens.languages)
        config["task_to_id"] = {"transcribe": tokens.transcribe, "translate": tokens.translate}
    return config


def preprocessor_config(dims: WhisperDims) -> dict[str, Any]:
    """The ``preprocessor_config.json`` for ``WhisperFeatureExtractor``."""
    return {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "processor_class": "WhisperProcessor",
        "feature_size": dims.num_mel_bins,
        "sampling_rate": 16000,
        "hop_length": 160,
        "n_fft": 400,
        "chunk_length": 30,
        "n_samples": 480000,
        "nb_max_frames": 3000,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": False,
    }


def tokenizer_config() -> dict[str, Any]:
    """A minimal ``tokenizer_config.json`` so ``AutoTokenizer`` picks the Whisper tokenizer."""
    eot = "<|endoftext|>"
    return {
        "tokenizer_class": "WhisperTokenizer",
        "bos_token": eot,
        "eos_token": eot,
        "unk_token": eot,
        "pad_token": eot,
        "add_prefix_space": False,
        "model_max_length": 1024,
        "errors": "replace",
    }


def _read_ct2_config(meta_dir: Path) -> dict[str, Any]:
    path = meta_dir / "config.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot read CTranslate2 config ({exc})") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return data


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_hf_dir(model: Ct2Model, meta_dir: Path, out_dir: Path) -> WhisperDims:
    """Write config, generation config, tokenizer and fp32 ``model.safetensors`` into ``out_dir``.

    ``meta_dir`` is the CTranslate2 directory holding ``config.json`` and ``tokenizer.json``.
    """
    import torch
    from safetensors.torch import save_file

    tokenizer = meta_dir / "tokenizer.json"
    if not tokenizer.is_file():
        raise ModelLoadError(
            f"{tokenizer} is missing: a CTranslate2 Whisper directory needs tokenizer.json to be converted"
        )
    dims = infer_dims(model)
    tokens = read_special_tokens(tokenizer)
    arrays = hf_state_dict(model, dims)
    tensors = {name: torch.from_numpy(array) for name, array in arrays.items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del tensors, arrays
    shutil.copyfile(tokenizer, out_dir / "tokenizer.json")
    _write_json(out_dir / "config.json", hf_config(dims, tokens))
    _write_json(out_dir / "generation_config.json", generation_config(dims, tokens, _read_ct2_config(meta_dir)))
    _write_json(out_dir / "preprocessor_config.json", preprocessor_config(dims))
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config())
    return dims


def read_shard_index(index: Path) -> dict[str, Path]:
    """Tensor name -> shard file of a ``*.index.json`` (Hugging Face sharded checkpoint).

    Every shard must be a plain file name inside the index's directory (no path, no ``..``) and exist.
    """
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{index}: cannot read the shard index ({exc!r})") from exc
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"{index}: 'weight_map' must map tensor names to shard files")
    shards: dict[str, Path] = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise ModelLoadError(f"{index}: shard {shard!r} of {name!r} is not a file name in {index.parent}")
        path = index.parent / shard
        if not path.is_file():
            raise ModelLoadError(f"{index}: shard file {path} (holding {name!r}) is missing")
        shards[str(name)] = path
    return shards


def merge_shards(index: Path, out_file: Path) -> int:
    """Read every shard a safetensors index names and save them as one ``model.safetensors`` (dtypes kept).

    Each shard must hold exactly the tensors the index assigns to it. Returns the tensor count.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    shards = read_shard_index(index)
    expected: dict[Path, set[str]] = {}
    for name, path in shards.items():
        expected.setdefault(path, set()).add(name)
    tensors = {}
    for path, names in expected.items():
        try:
            state = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelLoadError(f"{path}: not a readable safetensors shard ({exc})") from exc
        if set(state) != names:
            missing, extra = sorted(names - set(state)), sorted(set(state) - names)
            raise ModelLoadError(f"{path}: shard does not match {index.name} (missing {missing[:5]}, "
                                 f"not indexed {extra[:5]})")
        tensors.update(state)
    save_file(tensors, str(out_file), metadata={"format": "pt"})
    return len(tensors)
