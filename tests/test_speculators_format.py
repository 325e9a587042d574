"""Drafter checkpoints: speculators format (save -> load exact, a merged-vocabulary file with d2t/t2d),
z-lab DFlash format, offline name resolution, and ``specli synthesize --draft DIR`` (Click runner)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from cosyvoice_fixtures import write_checkpoint
from specli.cli import main
from specli.core.drafters.base import DraftRequest
from specli.core.drafters.llm.dflash import BlockDrafter, new_dflash
from specli.core.drafters.llm.dspark import new_dspark
from specli.core.drafters.llm.eagle3 import Eagle3Drafter, new_eagle3
from specli.core.drafters.llm.base import attach_aux_layers
from specli.core.drafters.llm.speculators import load_speech_drafter, save_speculators
from specli.core.drafters.llm.loading import resolve_drafter_dir
from specli.models.cosyvoice.lm import load_cosyvoice
from specli.models.cosyvoice.layout import merged_layout, vllm_layout
from specli.errors import ModelLoadError


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("cv2") / "ckpt", "cosyvoice2", seed=7)


@pytest.fixture()
def model(ckpt):
    return load_cosyvoice(str(ckpt))


def _module(kind, model, vocab=None, **kw):
    parts = model.lm.draft_parts()
    ids = None if vocab is None else torch.tensor(vocab)
    if kind == "dspark":
        return new_dspark(parts, layers=2, block_size=4, markov_rank=8, draft_vocab_ids=ids, seed=1, **kw)
    if kind == "dflash":
        return new_dflash(parts, layers=2, block_size=4, draft_vocab_ids=ids, seed=1, **kw)
    return new_eagle3(parts, unroll=3, draft_vocab_ids=ids, seed=1, **kw)


def _propose(module, model, greedy=False):
    """Tokens and q of one proposal after a fixed context (sampling with a fixed seed)."""
    lm = model.lm
    lm.qwen.aux_layers = ()
    attach_aux_layers(lm, module.config)
    seq = lm.layout.prompt([5, 9, 30], [], [1, 2, 3]) + [40, 41, 42, 43]
    state = lm.start(64)
    hidden = lm.score(state, torch.tensor([seq[:-1]])).hidden
    drafter = Eagle3Drafter(module) if module.config.kind == "eagle3" else BlockDrafter(module)
    drafter.start(state, seq)
    req = DraftRequest(seq, len(seq) - 4, 3, state, hidden, lambda x, p: x, greedy, torch.Generator().manual_seed(3))
    prop = drafter.propose(req)
    lm.qwen.aux_layers = ()
    return prop.tokens, prop.q


VOCAB = list(range(0, 6564, 7)) + [6561]  # a reduced draft vocabulary (every 7th speech id + eos)


@pytest.mark.parametrize("kind", ["dspark", "dflash", "eagle3"])
def test_save_load_round_trip_is_exact(tmp_path, model, kind):
    module = _module(kind, model, sorted(set(VOCAB)))
    save_speculators(module, tmp_path / kind, training={"steps": 0})
    meta = json.loads((tmp_path / kind / "config.json").read_text())
    assert meta["speculators_model_type"] == kind
    assert meta["aux_hidden_state_layer_ids"] == list(module.config.aux_layers)
    w = load_file(str(tmp_path / kind / "model.safetensors"))
    assert "embed_tokens.weight" not in w and w["t2d"].sum() == len(set(VOCAB)) and "d2t" in w
    loaded = load_speech_drafter(tmp_path / kind, model.lm)
    assert loaded.config == module.config and torch.equal(loaded.draft_ids, module.draft_ids)
    for key, value in module.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    assert torch.equal(loaded.head_w, module.head_w) and torch.equal(loaded.head_b, module.head_b)
    tokens, q = _propose(module, model)
    tokens2, q2 = _propose(loaded, model)
    assert tokens == tokens2 and torch.equal(q, q2)
    assert q[:, [i for i in range(6564) if i not in set(VOCAB)]].sum() == 0  # q = 0 outside the draft vocab


def _as_merged(native_dir, out, module, layout, text_rows=(3, 17, 200)):
    """Rewrite a native speculators directory with SpeechSpec merged-vocabulary ids (as published)."""
    out.mkdir()
    w = load_file(str(native_dir / "model.safetensors"))
    ids = module.draft_ids.tolist()
    file_ids = list(text_rows) + [i + layout.offset for i in ids]
    n_text = len(text_rows)
    g = torch.Generator().manual_seed(0)
    w["d2t"] = torch.tensor(file_ids) - torch.arange(len(file_ids))
    t2d = torch.zeros(layout.size, dtype=torch.bool)
    t2d[file_ids] = True
    w["t2d"] = t2d
    for key in ("lm_head.weight", "markov_head.markov_w2.weight"):
        w[key] = torch.cat([torch.randn(n_text, w[key].shape[1], generator=g), w[key]])
    w1 = torch.randn(layout.size, w["markov_head.markov_w1.weight"].shape[1], generator=g)
    w1[layout.offset : layout.offset + layout.native_rows] = w["markov_head.markov_w1.weight"]
    w["markov_head.markov_w1.weight"] = w1
    assert "lm_head.bias" not in w  # published CosyVoice2 drafters were trained without the head bias
    save_file(w, str(out / "model.safetensors"))
    meta = json.loads((native_dir / "config.json").read_text())
    meta.update(draft_vocab_size=len(file_ids), mask_token_id=module.config.mask_token_id + layout.offset)
    meta["transformer_layer_config"]["vocab_size"] = layout.size
    del meta["specli"]
    (out / "config.json").write_text(json.dumps(meta))


def test_a_merged_vocabulary_checkpoint_loads_and_drafts(tmp_path, model):
    module = _module("dspark", model, sorted(set(VOCAB)), head_bias=False, aux_layers=(2, 1, 2),
                     convention="input")
    save_speculators(module, tmp_path / "native")
    layout = merged_layout(model.spec, text_vocab=600)
    _as_merged(tmp_path / "native", tmp_path / "merged", module, layout)
    with pytest.raises(ModelLoadError):  # without the layout its ids are not this target's
        load_speech_drafter(tmp_path / "merged", model.lm)
    loaded = load_speech_drafter(tmp_path / "merged", model.lm, layout)
    assert torch.equal(loaded.draft_ids, module.draft_ids)  # text rows dropped, speech ids mapped to native
    assert loaded.config.mask_token_id == module.config.mask_token_id and not loaded.config.head_bias
    assert loaded.config.aux_convention == "input"  # speculators ids are layer inputs
    tokens, q = _propose(module, model)
    tokens2, q2 = _propose(loaded, model)
    assert tokens == tokens2 and torch.allclose(q, q2, atol=1e-6)
    vllm = vllm_layout(model.spec, pad_to=64)  # the official vLLM export: offset 0, padded
    assert vllm.size % 64 == 0 and vllm.to_native(vllm.from_native([5])) == [5]


def test_a_zlab_dflash_checkpoint_loads_with_layer_outputs(tmp_path, model):
    module = _module("dflash", model, aux_layers=(0, 1), convention="output", head_bias=False)
    save_speculators(module, tmp_path / "native")
    w = load_file(str(tmp_path / "native" / "model.safetensors"))
    for key in ("d2t", "t2d", "lm_head.weight"):
        del w[key]  # z-lab files hold neither head nor vocabulary maps: both are the target's
    out = tmp_path / "zlab"
    out.mkdir()
    save_file(w, str(out / "model.safetensors"))
    c = module.config
    (out / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": c.hidden,
        "num_hidden_layers": c.layers, "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim, "intermediate_size": c.intermediate, "rms_norm_eps": c.rms_eps,
        "rope_parameters": {"rope_theta": c.rope_theta, "rope_type": "default"}, "num_target_layers": 2,
        "vocab_size": c.target_vocab, "dflash_config": {"block_size": 4, "mask_token_id": c.mask_token_id,
                                                        "target_layer_ids": [0, 1]}}))
    loaded = load_speech_drafter(out, model.lm)
    assert loaded.config.aux_convention == "output" and loaded.config.target_layers() == (1, 2)
    tokens, q = _propose(module, model)
    tokens2, q2 = _propose(loaded, model)
    assert tokens == tokens2 and torch.allclose(q, q2, atol=1e-6)  # head bias: z-lab drafters have none
    assert not loaded.config.head_bias


def test_bad_checkpoints_and_offline_names(tmp_path, model, monkeypatch):
    module = _module("dspark", model, sorted(set(VOCAB)))
    save_speculators(module, tmp_path / "d")
    w = load_file(str(tmp_path / "d" / "model.safetensors"))
    w["t2d"] = torch.zeros_like(w["t2d"])
    save_file(w, str(tmp_path / "d" / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="d2t and t2d disagree"):
        load_speech_drafter(tmp_path / "d", model.lm)
    monkeypatch.delenv("SPECLI_MODELS_DIR", raising=False)
    with pytest.raises(ModelLoadError, match="never downloads"):
        resolve_drafter_dir("cosyvoice3-dspark")
    monkeypatch.setenv("SPECLI_MODELS_DIR", str(tmp_path))
    assert resolve_drafter_dir("d") == tmp_path / "d"


def _run(args):
    return CliRunner().invoke(main, ["synthesize", "--format", "npy", *args], catch_exceptions=False)


def test_synthesize_with_a_drafter_directory(tmp_path, ckpt, model, monkeypatch):
    module = _module("dspark", model)
    save_speculators(module, tmp_path / "models" / "cosyvoice2-dspark")
    texts = ["--text", "hello there", "--text", "one two"]
    outs = {}
    for draft in ("none", str(tmp_path / "models" / "cosyvoice2-dspark")):
        out = tmp_path / ("ar" if draft == "none" else "spec")
        res = _run(["--model", str(ckpt), *texts, "--sampler", "greedy", "--draft", draft, "-o", str(out)])
        assert res.exit_code == 0, res.stderr
        outs[draft] = {p.name: np.load(p).tolist() for p in out.glob("*.npy")}
    assert list(outs.values())[0] == list(outs.values())[1]
    res = _run(["--model", str(ckpt), "--text", "hi", "--draft", str(tmp_path / "nothing"), "-o", str(tmp_path)])
    assert res.exit_code == 3 and "never downloads" in res.stderr
    # the preset's drafter by name from $SPECLI_MODELS_DIR (read when the name is resolved; vllm sampler, chain)
    monkeypatch.setenv("SPECLI_MODELS_DIR", str(tmp_path / "models"))
    res = _run(["--preset", "cosyvoice2-dspark", "--model", str(ckpt), "--text", "hello", "-o", str(tmp_path / "sub"),
                "--jsonl", "-"])
    assert res.exit_code == 0, res.stderr
    record = json.loads(res.stdout.splitlines()[0])
    assert record["stats"]["verify_steps"] > 0 and (tmp_path / "sub" / "text_00001.npy").exists()
