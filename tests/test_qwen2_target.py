"""Lean Qwen2 target == transformers' Qwen2ForCausalLM; tree scoring == path scoring; cache edits exact."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from specli.models.qwen2 import Qwen2Dims, Qwen2Target, rope_theta
from specli.core.tree import tree_inputs

TOL = 1e-4


def _tiny(seed: int = 0, tie: bool = False) -> tuple[Qwen2ForCausalLM, Qwen2Target]:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=97, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=96, max_position_embeddings=256,
                      rope_theta=5000.0, tie_word_embeddings=tie, rms_norm_eps=1e-6)
    ref = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # random, non-trivial norms and biases
        for name, p in ref.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    lean = Qwen2Target(Qwen2Dims.from_hf_config(cfg.to_dict()), dict(ref.state_dict()), aux_layers=(0, 2, 3))
    return ref, lean


def test_rope_theta_from_both_config_styles():
    assert rope_theta({"rope_theta": 1e6}) == 1e6
    assert rope_theta({"rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}}) == 5000.0
    assert rope_theta({}) == 10000.0
    with pytest.raises(ValueError, match="yarn"):
        rope_theta({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}})


@pytest.mark.parametrize("tie", [False, True])
def test_logits_and_hidden_states_equal_transformers_with_inputs_embeds(tie):
    ref, lean = _tiny(1, tie)
    embeds = torch.randn(1, 11, 64)
    with torch.no_grad():
        out = ref(inputs_embeds=embeds, output_hidden_states=True)
    state = lean.start(32)
    got = lean.score(state, None, embeds=embeds)
    assert torch.allclose(got.logits, out.logits.float(), atol=TOL, rtol=0)
    hs = out.hidden_states  # (embeddings, block 1, ..., normed last)
    assert torch.allclose(got.hidden.aux[0], hs[0], atol=TOL)
    assert torch.allclose(got.hidden.aux[1], hs[2], atol=TOL)
    assert torch.allclose(got.hidden.low, hs[1], atol=TOL)
    assert torch.allclose(got.hidden.last, hs[-1], atol=TOL)
    assert state.length == 11
    # incremental decoding with token ids equals one full forward
    ids = torch.randint(0, 97, (1, 4))
    with torch.no_grad():
        full = ref(inputs_embeds=torch.cat([embeds, ref.model.embed_tokens(ids)], 1)).logits
    for j in range(4):
        step = lean.score(state, ids[:, j : j + 1])
        assert torch.allclose(step.logits[0, 0], full[0, 11 + j], atol=TOL, rtol=0)


def test_tree_scoring_equals_path_scoring():
    ref, lean = _tiny(2)
    prompt = torch.randint(0, 97, (1, 6))
    # tree: root(pending) -> a -> b, root -> c -> d, a -> e
    parents, toks = [-1, 0, -1, 2, 0], [5, 7, 9, 11, 13]
    pending = 3
    s_tree = lean.start(64)
    lean.score(s_tree, prompt)
    mask, pos = tree_inputs(parents, s_tree.length)
    tree = lean.score(s_tree, torch.tensor([[pending, *toks]]), positions=pos, tree_mask=mask).logits[0]
    for node, path in {1: [0, 1], 3: [2, 3], 4: [0, 4]}.items():
        s = lean.start(64)
        lean.score(s, prompt)
        chain = lean.score(s, torch.tensor([[pending, *[toks[i] for i in path]]])).logits[0]
        assert torch.allclose(tree[node + 1], chain[-1], atol=TOL, rtol=0)
        assert torch.allclose(tree[0], chain[0], atol=TOL, rtol=0)


def test_crop_and_compact_keep_later_steps_exact():
    ref, lean = _tiny(3)
    prompt = torch.randint(0, 97, (1, 5))
    with torch.no_grad():
        expect = ref(torch.cat([prompt, torch.tensor([[4, 8, 15]])], 1)).logits[0, -1]
    # crop: score a wrong chain, roll back, continue on the right one
    s = lean.start(32)
    lean.score(s, prompt)
    lean.score(s, torch.tensor([[4, 60, 61, 62]]))
    s.cache.crop(6)
    got = lean.score(s, torch.tensor([[8, 15]])).logits[0, -1]
    assert torch.allclose(got, expect, atol=TOL, rtol=0)
    # compact: score a tree, keep the path 4 -> 8 (nodes 1, 3), continue
    s = lean.start(32)
    lean.score(s, prompt)
    start = s.length
    mask, pos = tree_inputs([-1, -1, 0, 1], start)
    lean.score(s, torch.tensor([[4, 70, 8, 71, 72]]), positions=pos, tree_mask=mask)
    s.cache.compact(start, [start, start + 2])
    got = lean.score(s, torch.tensor([[15]])).logits[0, -1]
    assert torch.allclose(got, expect, atol=TOL, rtol=0)


def test_bad_aux_layer_rejected():
    ref, _ = _tiny(4)
    with pytest.raises(ValueError, match="aux layers"):
        Qwen2Target(Qwen2Dims.from_hf_config(ref.config.to_dict()), dict(ref.state_dict()), aux_layers=(4,))
