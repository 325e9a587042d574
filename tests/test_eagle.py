"""EAGLE Speech-Draft head: training math, save/load, lossless drafting, resumable on-policy data."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import EN_CLIPS
from specli.distill.data import generate, load_windows, read_manifest, window_record
from specli.distill.train import TrainOptions, make_batch, start_rows, train, unrolled_loss, validate
from specli.engines.drafters.eagle import EagleConfig, EagleDrafter, SpeechDraftHead, load_head, save_head
from specli.engines.drafters.model import ModelDraftOptions
from specli.engines.greedy import greedy_decode
from specli.engines.speculative import SpecOptions, speculative_decode
from specli.errors import AudioError, ModelLoadError
from tiny_models import EOT, NO_TS, SOT, tiny_rules, tiny_target, window

TARGET = tiny_target(0)
TINY = SimpleNamespace(target=TARGET)


def _head(seed: int = 0, target=TARGET) -> SpeechDraftHead:
    torch.manual_seed(seed)
    return SpeechDraftHead(EagleConfig.for_target(target, "tiny"), target)


@functools.cache
def _windows(seeds=(1, 2), max_new: int = 20) -> list[dict]:
    """Records of tiny greedy decodes (prompt + sampled + eot), as ``distill data`` writes them."""
    out = []
    for s in seeds:
        state = window(TARGET, s)
        prompt = [SOT, 7 + s, NO_TS]
        res = greedy_decode(TARGET, state, prompt, tiny_rules(False), EOT, max_new)
        tokens = prompt + res.tokens + ([EOT] if res.finished else [])
        out.append(window_record(TINY, state.audio_features[0], tokens, len(prompt)))
    return out


def test_training_steps_reduce_the_loss():
    head, batch = _head(), make_batch(_windows(), unroll=7, max_starts=64)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        loss, per_step = unrolled_loss(head, batch, beta=0.8)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert len(per_step) == 7
    assert losses[-1] < losses[0] * 0.9, losses
    assert not any(n.startswith(("embed", "dec_pos", "lm_head")) for n, _ in head.named_parameters())


def _step_logits(head, batch) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    real = head.logits
    head.logits = lambda h: seen.append(real(h)) or seen[-1]
    try:
        unrolled_loss(head, batch, 0.8)
    finally:
        del head.logits
    return seen


def test_unrolled_steps_read_the_heads_own_states_not_the_targets():
    head, w = _head(), _windows(seeds=(4,))[0]
    rows = start_rows(w)
    s = len(rows) // 2  # one start row in the middle of the window
    p = rows[s]
    base = _step_logits(head, make_batch([w], 7, 1000))
    later = dict(w)  # perturb the target's states of every row but p
    for name in ("low", "mid", "last"):
        noise = torch.randn_like(w[name].float()).half()
        noise[p] = w[name][p]
        later[name] = noise
    moved = _step_logits(head, make_batch([later], 7, 1000))
    for k in range(7):
        assert torch.equal(base[k][0, s], moved[k][0, s]), f"step {k + 1} read another row's target state"
    own = dict(w)  # perturb row p only: every step changes (it flows through the head's own states)
    own["last"] = w["last"].clone()
    own["last"][p] += 1.0
    changed = _step_logits(head, make_batch([own], 7, 1000))
    assert all(not torch.allclose(base[k][0, s], changed[k][0, s]) for k in range(7))
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    real_next, real_block = head.next_input, head.block
    head.next_input = lambda h, t, pos: inputs.append(h) or real_next(h, t, pos)
    head.block = lambda *a: (lambda r: outputs.append(r[0]) or r)(real_block(*a))
    unrolled_loss(head, make_batch([w], 7, 1000), 0.8)
    assert len(inputs) == 6 and all(i is o for i, o in zip(inputs, outputs))


def test_save_load_round_trip_and_target_check(tmp_path):
    head = _head(3)
    with torch.no_grad():
        for prm in head.parameters():
            prm.add_(0.01 * torch.randn_like(prm))
    save_head(head, tmp_path / "h", {"steps": 1})
    loaded = load_head(tmp_path / "h", TARGET)
    batch = make_batch(_windows(seeds=(5,)), 7, 64)
    a, b = _step_logits(head, batch), _step_logits(loaded, batch)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert "embed" not in load_head.__globals__["load_file"](str(tmp_path / "h" / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="does not match"):
        load_head(tmp_path / "h", tiny_target(0, layers=3))


MODES = {
    "chain": ModelDraftOptions(),
    "adaptive": ModelDraftOptions(confidence_threshold=0.3),
    "sparse-tree": ModelDraftOptions(tree_topk=2, tree_threshold=0.9),
}


@settings(max_examples=3, deadline=None)
@given(audio_seed=st.integers(0, 1000), head_seed=st.integers(0, 1000), timestamps=st.booleans(),
       max_draft=st.sampled_from([1, 3, 5, 8]), max_new=st.integers(1, 30))
@pytest.mark.parametrize("mode", sorted(MODES))
def test_eagle_speculative_greedy_equals_greedy(mode, audio_seed, head_seed, timestamps, max_draft, max_new):
    rules = tiny_rules(timestamps)
    prompt = [SOT] + ([] if timestamps else [NO_TS])
    ref = greedy_decode(TARGET, window(TARGET, audio_seed), prompt, rules, EOT, max_new, no_speech=1)
    drafter = EagleDrafter(_head(head_seed), MODES[mode])
    out = speculative_decode(TARGET, window(TARGET, audio_seed), prompt, rules, EOT, max_new, no_speech=1,
                             drafter=drafter, options=SpecOptions(max_draft=max_draft))
    assert out.tokens == ref.tokens
    assert out.finished == ref.finished
    assert out.sum_logprob == pytest.approx(ref.sum_logprob, abs=1e-3)


def test_train_checkpoints_resume_and_validate(tmp_path):
    windows = _windows(seeds=(6, 7), max_new=TARGET.dims.text_ctx - 3)  # as inference's max_new
    model = SimpleNamespace(target=TARGET, name="tiny", special=SimpleNamespace(
        eot=EOT, no_timestamps=NO_TS, sot=SOT, no_speech=None, timestamp_begin=36, suppress_tokens=(5,),
        begin_suppress_tokens=(EOT,), max_initial_timestamp_index=4))
    first = train(windows, model, tmp_path, TrainOptions(epochs=2, steps=3, batch=1, checkpoint_every=1))
    assert first.steps == 3 and (tmp_path / "model.safetensors").is_file()
    again = train(windows, model, tmp_path, TrainOptions(epochs=2, batch=1, val_windows=1), windows)
    assert again.steps == 4  # resumed mid-epoch 2 from step 3: one batch left
    assert again.val_acceptance is not None and again.val_acceptance >= 1.0
    acc, bad = validate(load_head(tmp_path, TARGET), model, windows[1:])
    assert bad == 0 and acc >= 1.0


def test_distill_data_is_resumable(tmp_path, whisper_models):
    model = whisper_models("whisper-tiny.en")
    audio, rate = sf.read(EN_CLIPS[0], dtype="float32")
    a, b = tmp_path / "a.wav", tmp_path / "b.wav"
    sf.write(a, audio, rate)
    sf.write(b, audio[: len(audio) // 2], rate)
    out = tmp_path / "data"
    with pytest.raises(AudioError):
        generate([a, tmp_path / "missing.wav"], model, out)
    assert list(read_manifest(out)["done"]) == [str(a.resolve())]
    seen: list[str] = []
    summary = generate([a, b], model, out, lambda msg, done, total: seen.append(msg))
    assert (summary.skipped, summary.done) == (1, 1) and len(seen) == 1 and "b.wav" in seen[0]
    windows = load_windows(out)
    assert len(windows) == 2
    w = windows[0]
    n, d = len(w["tokens"]), model.target.dims.d_model
    assert w["audio"].dtype == torch.float16 and w["audio"].shape == (1500, d)
    assert w["last"].shape == (n, d) and w["low"].dtype == torch.float16
    assert w["tokens"][-1] == model.special.eot and w["plen"] < n
    text = model.tokenizer.decode([t for t in w["tokens"][w["plen"]:].tolist() if t < model.special.eot])
    assert np.char.str_len(text) > 3
