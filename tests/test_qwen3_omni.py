"""Qwen3-Omni thinker's quirks (test_audio_llm_contract runs the family contract: transformers' generate and logits,
speculative == greedy at batch 1 and in ragged batches, the first-token law, missing files): a tiny random
``Qwen3OmniMoeForConditionalGeneration`` (8 experts top-2, a vision tower of depth 1, no talker) loads its MoE blocks
without the talker; the grouped MoE equals transformers' sparse block (with and without norm_topk_prob); 1-D RoPE at
position + the row's delta equals the 3-D M-RoPE for text positions, per batch row; the prompt holds one audio pad
per audio position; instructions and languages."""

from __future__ import annotations

import pytest
import torch

from audio_llm_families import clip, window
from qwen3_omni_fixtures import IDS
from specli.errors import UsageError
from specli.models.aut import audio_positions
from specli.models.moe import MoE


@pytest.fixture(scope="module")
def model(audio_llm):
    return audio_llm("qwen3-omni").model


@pytest.fixture(scope="module")
def thinker(audio_llm):
    return audio_llm("qwen3-omni").hf


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_grouped_moe_equals_the_sparse_block(thinker, norm_topk_prob):
    block = thinker.model.language_model.layers[0].mlp
    block.gate.norm_topk_prob = norm_topk_prob
    try:
        weights = {f"m.{k}": v for k, v in block.state_dict().items()}
        moe = MoE(weights, "m", torch.float32, 2, norm_topk_prob)
        x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            torch.testing.assert_close(moe(x), block(x), atol=1e-5, rtol=1e-5)
        assert 2 <= moe.experts_touched <= 8
    finally:
        block.gate.norm_topk_prob = True


def test_loader_builds_moe_blocks_without_the_talker(model):
    blocks = model.target.lm.blocks
    assert [b.moe is not None for b in blocks] == [True, False, True]  # mlp_only_layers=[1]: dense
    assert model.target.dims.head_dim == 16 and not model.target.dims.tie_embeddings
    assert model.target.dims.moe.top_k == 2 and model.target.audio_ctx == 390


def test_mrope_with_equal_axes_is_1d_rope(model, thinker):
    rotary = thinker.model.language_model.rotary_emb  # interleaved M-RoPE, sections [2, 3, 3]
    pos = torch.tensor([[0, 5, 17, 389, 1000], [3, 4, 7, 8, 2047]])
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), pos[None].expand(3, -1, -1))
    ours_cos, ours_sin = model.target.lm._rope(pos)
    torch.testing.assert_close(ours_cos[:, 0], cos, atol=0, rtol=0)
    torch.testing.assert_close(ours_sin[:, 0], sin, atol=0, rtol=0)
    cos3, _ = rotary(torch.zeros(1), torch.stack([pos, pos + 1, pos]))  # unequal axes: not 1-D RoPE
    assert not torch.equal(cos3, cos)


def test_text_positions_are_position_plus_row_delta_per_batch_row(model, thinker):
    """A ragged batch (left padding) of an audio prompt, an image prompt and a short audio prompt: for each row,
    the text after the last multimodal block has equal 3-D ids = index + that row's delta (so decoding at
    cache position + delta with 1-D RoPE is exact); the audio prompts' delta is 0 and equals ours."""
    a, b = window(model, clip(0, 2.0))[0], window(model, clip(1, 0.7))[0]
    image = [IDS["<|im_start|>"], 10, IDS["<|vision_start|>"], *[IDS["<|image_pad|>"]] * 4, IDS["<|vision_end|>"],
             *range(20, 30), IDS["<|im_end|>"]]
    rows = [list(a.prompt), image, list(b.prompt)]
    width = max(map(len, rows))
    ids = torch.tensor([[IDS["<|endoftext|>"]] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    audio_frames = torch.tensor([200, 70])
    positions, deltas = thinker.model.get_rope_index(ids, image_grid_thw=torch.tensor([[1, 4, 4]]),
                                                     attention_mask=mask, audio_seqlens=audio_frames)
    assert deltas[1].item() < 0 and deltas[0].item() == deltas[2].item() == 0  # the image row is ragged in RoPE
    for r, row in enumerate(rows):
        real = positions[:, r, width - len(row):]  # [3, n]
        last_mm = max(i for i, t in enumerate(row) if t in (IDS["<|audio_end|>"], IDS["<|vision_end|>"]))
        text = real[:, last_mm + 1:]
        index = torch.arange(last_mm + 1, len(row))
        assert torch.equal(text[0], text[1]) and torch.equal(text[1], text[2])
        assert torch.equal(text[0].long(), index + int(deltas[r]))
    for prompt in (a.prompt, b.prompt):
        assert model.target.prompt_rope_delta(torch.tensor(prompt)) == 0
    with pytest.raises(ValueError, match="image or video tokens"):
        model.target.prompt_rope_delta(torch.tensor(image))


@pytest.mark.parametrize(("clip_index", "seconds", "language", "task"),
                         [(0, None, "en", "transcribe"), (1, 3.3, None, "transcribe"), (2, 0.3, "fr", "translate")])
def test_the_prompt_holds_one_audio_pad_per_audio_position(model, clip_index, seconds, language, task):
    job, _state, _mel, frames = window(model, clip(clip_index, seconds), language=language, task=task)
    assert job.prompt.count(IDS["<|audio_pad|>"]) == audio_positions(frames)


def test_instructions_and_languages(model):
    from specli.models.qwen3_omni.text import default_instruction

    assert default_instruction("transcribe", "en") == "Transcribe the English audio into text."
    assert default_instruction("translate", None) == "Translate the audio into English text."
    with pytest.raises(UsageError, match="does not know language"):
        model.speech_hooks().check_support("tiny", "transcribe", "xx")
