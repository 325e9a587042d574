"""Lean Whisper target vs transformers on a tiny random config; tree scoring; crop / compact."""

from __future__ import annotations

import pytest
import torch
import transformers
from hypothesis import given
from hypothesis import strategies as st

from conftest import examples

from specli.models.whisper.target import WhisperDims, WhisperTarget

VOCAB = 97


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=80, d_model=32, encoder_layers=2, encoder_attention_heads=4,
        decoder_layers=3, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=1500, max_target_positions=64, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=3,
    )
    hf = transformers.WhisperForConditionalGeneration(cfg).eval()
    target = WhisperTarget(WhisperDims.from_hf_config(cfg.to_dict()), hf.state_dict())
    mel = torch.randn(1, 80, 3000)
    with torch.no_grad():
        enc = hf.model.encoder(mel).last_hidden_state
    return hf, target, mel, enc


def test_encoder_matches_transformers(tiny):
    hf, target, mel, enc = tiny
    assert torch.allclose(target.encode(mel), enc, atol=1e-4)


def test_incremental_scoring_matches_full_forward(tiny):
    hf, target, mel, enc = tiny
    tokens = torch.randint(0, VOCAB, (1, 12))
    with torch.no_grad():
        out = hf(encoder_outputs=(enc,), decoder_input_ids=tokens, output_hidden_states=True)
    state = target.start(enc)
    parts = [target.score(state, tokens[:, a:b]) for a, b in ((0, 5), (5, 6), (6, 9), (9, 12))]
    logits = torch.cat([p.logits for p in parts], 1)
    assert torch.allclose(logits, out.logits, atol=1e-4)
    last = torch.cat([p.hidden.last for p in parts], 1)
    low = torch.cat([p.hidden.low for p in parts], 1)
    assert torch.allclose(low, out.decoder_hidden_states[1], atol=1e-4)
    assert torch.allclose(last, out.decoder_hidden_states[-1], atol=1e-4)
    assert state.cache.length == 12


def _random_tree(draw_parents: list[int]) -> list[int]:
    """Parents list: node 0's parent is -1 (attached to the committed prefix); node i's parent < i."""
    return [-1] + [p % (i + 1) - 1 if p % (i + 1) else -1 for i, p in enumerate(draw_parents)]


def _paths(parents: list[int]) -> list[list[int]]:
    paths = []
    for i in range(len(parents)):
        path, j = [], i
        while j != -1:
            path.append(j)
            j = parents[j]
        paths.append(path[::-1])
    return paths


def _tree_inputs(parents: list[int], start: int):
    n = len(parents)
    paths = _paths(parents)
    mask = torch.zeros(1, n, n, dtype=torch.bool)
    for i, path in enumerate(paths):
        mask[0, i, path] = True
    positions = torch.tensor([[start + len(p) - 1 for p in paths]])
    return paths, mask, positions


@examples(25)
@given(
    prefix_len=st.integers(1, 6),
    parent_draws=st.lists(st.integers(0, 50), min_size=0, max_size=9),
    seed=st.integers(0, 10_000),
)
def test_tree_scoring_equals_scoring_each_path(tiny, prefix_len, parent_draws, seed):
    _hf, target, _mel, enc = tiny
    g = torch.Generator().manual_seed(seed)
    parents = _random_tree(parent_draws)
    prefix = torch.randint(0, VOCAB, (1, prefix_len), generator=g)
    nodes = torch.randint(0, VOCAB, (1, len(parents)), generator=g)
    paths, mask, positions = _tree_inputs(parents, prefix_len)
    state = target.start(enc)
    target.score(state, prefix)
    tree = target.score(state, nodes, positions=positions, tree_mask=mask)
    for i, path in enumerate(paths):
        ref_state = target.start(enc)
        ref = target.score(ref_state, torch.cat([prefix, nodes[:, path]], 1))
        assert torch.allclose(tree.logits[0, i], ref.logits[0, -1], atol=1e-4), (parents, i)
        assert torch.allclose(tree.hidden.mid[0, i], ref.hidden.mid[0, -1], atol=1e-4)


@examples(15)
@given(parent_draws=st.lists(st.integers(0, 50), min_size=1, max_size=8), leaf_pick=st.integers(0, 100))
def test_compact_keeps_later_steps_exact(tiny, parent_draws, leaf_pick):
    """Score a tree, keep one root-to-node path, then continue: equals decoding that path alone."""
    _hf, target, _mel, enc = tiny
    parents = _random_tree(parent_draws)
    prefix = torch.tensor([[3, 7, 11]])
    nodes = torch.randint(0, VOCAB, (1, len(parents)))
    paths, mask, positions = _tree_inputs(parents, 3)
    state = target.start(enc)
    target.score(state, prefix)
    target.score(state, nodes, positions=positions, tree_mask=mask)
    path = paths[leaf_pick % len(paths)]
    state.cache.compact(3, [3 + j for j in path])
    nxt = torch.tensor([[5, 9]])
    got = target.score(state, nxt).logits
    ref_state = target.start(enc)
    ref = target.score(ref_state, torch.cat([prefix, nodes[:, path], nxt], 1)).logits[:, -2:]
    assert torch.allclose(got, ref, atol=1e-4)


def test_crop_rolls_back_exactly(tiny):
    _hf, target, _mel, enc = tiny
    state = target.start(enc)
    first = target.score(state, torch.tensor([[3, 4, 5]])).logits
    target.score(state, torch.tensor([[60, 61, 62, 63]]))  # a rejected draft
    state.cache.crop(3)
    again = target.score(state, torch.tensor([[8]])).logits
    ref = target.score(target.start(enc), torch.tensor([[3, 4, 5, 8]])).logits
    assert torch.allclose(again[0, -1], ref[0, -1], atol=1e-5)
    assert torch.allclose(first, ref[:, :3], atol=1e-5)


def test_cache_guards(tiny):
    _hf, target, _mel, enc = tiny
    state = target.start(enc, max_len=4)
    target.score(state, torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError):
        state.cache.crop(5)
    with pytest.raises(ValueError):
        state.cache.compact(1, [0])
    with pytest.raises(ValueError):
        target.score(state, torch.tensor([[1, 2]]))  # 5 slots > 4
