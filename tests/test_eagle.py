"""EAGLE Speech-Draft head: training math, save/load, lossless drafting, resumable on-policy data."""

from __future__ import annotations

import functools
import json
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import EN_CLIPS, examples
from specli.core.job import DecodeJob, Probe
from specli.distill.data import generate, load_windows, read_manifest, window_record
from specli.distill.train import TrainOptions, learning_rate, make_batch, start_rows, train, unrolled_loss, validate
from specli.core.drafters.base import DraftRequest
from specli.asr.drafters.eagle_head import (EagleConfig, PackedLinear, SpeechDraftHead, draft_vocabulary, load_head,
                                           packed_for_inference, save_head)
from specli.models.layers import cross_attention
from specli.asr.drafters.eagle import EagleDrafter
from specli.asr.drafters.model import ModelDraftOptions
from specli.core.greedy import greedy_decode
from specli.core.logits import GREEDY, SamplingParams, filter_logits
from specli.core.speculative import SpecOptions, speculative_decode
from specli.errors import AudioError, ModelLoadError
from tiny_models import EOT, NO_TS, SOT, tiny_rules, tiny_target, window

TARGET = tiny_target(0)
TINY = SimpleNamespace(target=TARGET)


def _head(seed: int = 0, target=TARGET, draft_vocab: int = 0) -> SpeechDraftHead:
    """A random head; with ``draft_vocab``, its draft vocabulary is that many random ids."""
    torch.manual_seed(seed)
    if not draft_vocab:
        return SpeechDraftHead(EagleConfig.for_target(target, "tiny"), target)
    ids = torch.randperm(target.dims.vocab)[:draft_vocab].sort().values
    return SpeechDraftHead(EagleConfig.for_target(target, "tiny", draft_vocab), target, ids)


@functools.cache
def _windows(seeds=(1, 2), max_new: int = 20) -> list[dict]:
    """Records of tiny greedy decodes (prompt + sampled + eot), as ``distill data`` writes them."""
    out = []
    for s in seeds:
        state = window(TARGET, s)
        prompt = [SOT, 7 + s, NO_TS]
        res = greedy_decode(TARGET, state, DecodeJob(prompt, tiny_rules(False), EOT, max_new))
        tokens = prompt + res.tokens + ([EOT] if res.finished else [])
        out.append(window_record(TINY, state.audio_features[0], tokens, len(prompt)))
    return out


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    opts = TrainOptions(lr=1e-3, warmup=10, steps=110)
    rates = [learning_rate(opts, s) for s in range(110)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(rates[9:], rates[10:])) and rates[-1] == pytest.approx(1e-4, rel=0.01)
    assert learning_rate(TrainOptions(lr=1e-3, warmup=10), 10_000) == 1e-3  # no budget: constant


@pytest.mark.parametrize("draft_vocab", [0, 40])
def test_training_steps_reduce_the_loss(draft_vocab):
    head, batch = _head(draft_vocab=draft_vocab), make_batch(_windows(), unroll=7, max_starts=64)
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


def test_block_starts_from_the_targets_last_decoder_layer():
    head = _head(1).init_from_target(TARGET)
    blk = TARGET.dec_blocks[-1]
    assert torch.equal(head.fc2.weight, blk.fc2.weight.float())
    assert torch.equal(head.qkv.weight[: head.cfg.d_model], blk.self_attn["q"].weight.float())
    assert torch.equal(head.cross_kv_proj.weight[head.cfg.d_model :], blk.cross_attn["v"].weight.float())
    assert torch.equal(head.ln_cross.weight, blk.cross_ln[0].float())


def test_draft_vocabulary_keeps_specials_then_the_most_frequent_tokens():
    counts = torch.tensor([5, 0, 9, 1, 7, 0, 3, 100, 100])
    assert draft_vocabulary(counts, 5, first_special=7).tolist() == [0, 2, 4, 7, 8]
    assert draft_vocabulary(counts, 2, first_special=7).tolist() == [7, 8]  # specials always kept
    head = _head(draft_vocab=30)
    full = head.full_logits(torch.randn(2, 3, TARGET.dims.d_model))
    assert full.shape == (2, 3, TARGET.dims.vocab)
    outside = torch.ones(TARGET.dims.vocab, dtype=torch.bool)
    outside[head.vocab_ids] = False
    assert torch.isneginf(full[..., outside]).all() and torch.isfinite(full[..., head.vocab_ids]).all()
    assert torch.equal(head.to_draft[head.vocab_ids], torch.arange(30))


def test_packed_inference_copy_matches_the_trained_head():
    head = _head(5, draft_vocab=30)
    fast = packed_for_inference(head)
    assert isinstance(fast.qkv, PackedLinear) and isinstance(fast.lm_head, PackedLinear) and head.training
    assert fast.embed.data_ptr() == head.embed.data_ptr() == TARGET.embed.data_ptr()  # shared, not copied
    batch = make_batch(_windows(seeds=(5,)), 7, 64)
    with torch.no_grad():
        for a, b in zip(_step_logits(head, batch), _step_logits(fast, batch)):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("draft_vocab", [0, 25])
def test_save_load_round_trip_and_target_check(tmp_path, draft_vocab):
    head = _head(3, draft_vocab=draft_vocab)
    with torch.no_grad():
        for prm in head.parameters():
            prm.add_(0.01 * torch.randn_like(prm))
            prm.copy_(prm.half().float())  # heads are stored in fp16: make the round trip exact
    save_head(head, tmp_path / "h", {"steps": 1})
    loaded = load_head(tmp_path / "h", TARGET)
    batch = make_batch(_windows(seeds=(5,)), 7, 64)
    a, b = _step_logits(head, batch), _step_logits(loaded, batch)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(loaded.vocab_ids, head.vocab_ids) and loaded.cfg == head.cfg
    stored = load_head.__globals__["load_file"](str(tmp_path / "h" / "model.safetensors"))
    assert stored["fuse.weight"].dtype == torch.float16 and loaded.fuse.weight.dtype == torch.float32
    assert "embed" not in load_head.__globals__["load_file"](str(tmp_path / "h" / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="does not match"):
        load_head(tmp_path / "h", tiny_target(0, layers=3))


MODES = {
    "chain": ModelDraftOptions(),
    "adaptive": ModelDraftOptions(confidence_threshold=0.3),
    "sparse-tree": ModelDraftOptions(tree_topk=2, tree_threshold=0.9),
}


def test_int8_packed_copy_is_close_to_the_trained_head_and_the_cpu_default():
    from specli.models.layers import Int8Linear, Linear

    head = _head(5, draft_vocab=30)
    small = packed_for_inference(head, int8=True)
    assert isinstance(small.qkv.linear, Int8Linear) and isinstance(small.lm_head.linear, Int8Linear)
    assert isinstance(small.cross_kv_proj.linear, Linear)  # once per window over every frame: stays float
    batch = make_batch(_windows(seeds=(5,)), 7, 64)
    with torch.no_grad():
        for a, b in zip(_step_logits(head, batch), _step_logits(small, batch)):
            assert (a - b).abs().max() < 0.05 * a.abs().max()
    assert isinstance(EagleDrafter(head).head.qkv.linear, Int8Linear)  # the CPU default
    assert isinstance(EagleDrafter(head, int8=False).head.qkv.linear, Linear)


@examples(3)
@given(audio_seed=st.integers(0, 1000), head_seed=st.integers(0, 1000), timestamps=st.booleans(),
       max_draft=st.sampled_from([1, 3, 5, 8]), max_new=st.integers(1, 30), draft_vocab=st.sampled_from([0, 8, 30]))
@pytest.mark.parametrize("mode", sorted(MODES))
def test_eagle_speculative_greedy_equals_greedy(mode, audio_seed, head_seed, timestamps, max_draft, max_new,
                                                draft_vocab):
    rules = tiny_rules(timestamps)
    prompt = [SOT] + ([] if timestamps else [NO_TS])
    ref = greedy_decode(TARGET, window(TARGET, audio_seed), DecodeJob(prompt, rules, EOT, max_new, probe=Probe(0, 1)))
    drafter = EagleDrafter(_head(head_seed, draft_vocab=draft_vocab), MODES[mode])
    out = speculative_decode(TARGET, window(TARGET, audio_seed),
                             DecodeJob(prompt, rules, EOT, max_new, probe=Probe(0, 1)), drafter,
                             SpecOptions(max_draft=max_draft))
    assert out.tokens == ref.tokens
    assert out.finished == ref.finished
    assert out.sum_logprob == pytest.approx(ref.sum_logprob, abs=1e-3)


def _request(seed: int, greedy: bool, timestamps: bool, budget: int = 6) -> DraftRequest:
    """A drafting request after a tiny window's prompt (the target's hidden state of the pending token)."""
    prompt = [SOT] + ([] if timestamps else [NO_TS])
    state = window(TARGET, seed)
    hidden = TARGET.score(state, torch.tensor([prompt])).hidden
    params = GREEDY if greedy else SamplingParams(temperature=1.3, top_k=20, top_p=0.9)
    filt = functools.partial(filter_logits, rules=tiny_rules(timestamps), params=params)
    return DraftRequest(prompt, len(prompt), budget, state, hidden, filt, greedy,
                        torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("timestamps", [False, True])
def test_drafting_in_the_draft_vocabulary_equals_drafting_over_the_scattered_row(greedy, timestamps):
    head = _head(7, draft_vocab=30)
    drafter = EagleDrafter(head, MODES["sparse-tree"], torch.float32)
    ref = EagleDrafter(head, MODES["sparse-tree"], torch.float32)  # as before: the full row, -inf outside
    small = ref.head.logits
    ref.head.logits = lambda h: drafter.vocab.to_full(small(h))
    ref.vocab = None
    assert drafter.vocab is not None and len(drafter.vocab) == 30
    for seed in range(4):
        drafter.start(window(TARGET, seed), [])
        ref.start(window(TARGET, seed), [])
        got, want = drafter.propose(_request(seed, greedy, timestamps)), ref.propose(_request(seed, greedy, timestamps))
        assert got.tokens == want.tokens and got.parents == want.parents and len(got) > 0
        assert set(got.tokens) <= set(head.vocab_ids.tolist())
        assert got.confidence == pytest.approx(want.confidence, abs=1e-6)
        if greedy:
            assert got.q is None and want.q is None
        else:  # q rows in the full vocabulary, zero outside the draft vocabulary
            assert got.q.shape == (len(got), TARGET.dims.vocab)
            torch.testing.assert_close(got.q, want.q, rtol=1e-5, atol=1e-7)


def test_head_runs_in_bfloat16_under_a_bfloat16_target_and_stays_lossless():
    target = tiny_target(0, dtype=torch.bfloat16)
    head = _head(3, target=target, draft_vocab=30)
    prompt, rules = [SOT, NO_TS], tiny_rules(False)
    drafter = EagleDrafter(head, MODES["chain"])
    ref = greedy_decode(target, window(target, 4), DecodeJob(prompt, rules, EOT, 30))
    out = speculative_decode(target, window(target, 4), DecodeJob(prompt, rules, EOT, 30), drafter,
                             SpecOptions(max_draft=5))
    assert out.tokens == ref.tokens and out.stats.drafted > 0
    assert drafter.head.lm_head.linear.dtype == torch.bfloat16 and drafter.head.ln_rec.weight.dtype == torch.bfloat16
    assert drafter._cross[0].dtype == torch.bfloat16  # window K/V in the head's dtype (cross_attention accumulates fp32)
    assert EagleDrafter(head, MODES["chain"], torch.float32).head.lm_head.linear.dtype == torch.float32
    batched = drafter.batched(4)  # the batch drafter runs the head as this drafter does (dtype, int8 matrices)
    assert batched.head.ln_rec.weight.dtype == torch.bfloat16
    assert type(batched.head.lm_head.linear) is type(drafter.head.lm_head.linear)  # Int8Linear on the CPU
    batched.admit(0, window(target, 4), prompt)
    assert batched._cross[0].dtype == torch.bfloat16


def test_cross_attention_in_the_kv_dtype_matches_sdpa():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for n in (3, 40, 40))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert torch.equal(cross_attention(q, k, v), want)
    torch.testing.assert_close(cross_attention(q.bfloat16(), k, v).float(), want, rtol=2e-2, atol=2e-2)


def test_train_checkpoints_resume_and_validate(tmp_path):
    windows = _windows(seeds=(6, 7), max_new=TARGET.dims.text_ctx - 3)  # as inference's max_new
    model = SimpleNamespace(target=TARGET, name="tiny", special=SimpleNamespace(
        eot=EOT, no_timestamps=NO_TS, sot=SOT, no_speech=None, timestamp_begin=36, suppress_tokens=(5,),
        begin_suppress_tokens=(EOT,), max_initial_timestamp_index=4))
    opts = TrainOptions(epochs=2, steps=3, batch=1, checkpoint_every=1, draft_vocab=20)
    first = train(windows, model, tmp_path, opts)
    assert first.steps == 3 and (tmp_path / "model.safetensors").is_file()
    head = load_head(tmp_path, TARGET)
    # every id from eot on is a special token in Whisper's layout (here 46 of 48): kept even past 20 rows
    assert head.vocab_ids.tolist() == list(range(EOT, TARGET.dims.vocab)) and head.cfg.draft_vocab == 46
    again = train(windows, model, tmp_path, TrainOptions(epochs=2, batch=1, val_windows=1), windows)
    assert again.steps == 4  # resumed mid-epoch 2 from step 3: one batch left (and its draft vocabulary)
    assert torch.equal(load_head(tmp_path, TARGET).vocab_ids, head.vocab_ids)
    assert again.val_acceptance is not None and again.val_acceptance >= 1.0
    assert again.best_acceptance is not None and again.best_acceptance >= again.val_acceptance
    saved = json.loads((tmp_path / "config.json").read_text())["training"]
    assert saved["val_acceptance"] == again.best_acceptance  # OUT holds the best validated head
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


def test_batched_labels_equal_one_file_at_a_time_and_a_bad_file_fails_alone(tmp_path, whisper_models):
    """--batch-size 3: the same windows (tokens, prompt length, states) as labelling one file at a time, a
    long-form file included; an unreadable file among them is reported after the others are written."""
    model = whisper_models("whisper-tiny.en")
    long = tmp_path / "long.wav"
    sf.write(long, np.concatenate([sf.read(c, dtype="float32")[0] for c in EN_CLIPS * 2]), 16000)  # 47 s
    clips = [EN_CLIPS[0], long, EN_CLIPS[3], EN_CLIPS[4]]
    generate(clips, model, tmp_path / "one")
    with pytest.raises(AudioError, match="missing.wav"):
        generate([clips[0], tmp_path / "missing.wav", *clips[1:]], model, tmp_path / "batched", batch_size=3)
    assert sorted(read_manifest(tmp_path / "batched")["done"]) == sorted(read_manifest(tmp_path / "one")["done"])

    def per_file(out):  # file -> its windows, read through the manifest's shard of that file
        return {f: torch.load(out / e["shard"], weights_only=True)["windows"]
                for f, e in read_manifest(out)["done"].items()}

    one, batched = per_file(tmp_path / "one"), per_file(tmp_path / "batched")
    assert len(one[str(long.resolve())]) > 1  # the long file has several windows
    for f, windows in one.items():
        assert len(windows) == len(batched[f]), f
        for w, b in zip(windows, batched[f]):
            assert w["tokens"].tolist() == b["tokens"].tolist() and w["plen"] == b["plen"]
            for name in ("audio", "low", "mid", "last"):
                assert torch.allclose(w[name].float(), b[name].float(), atol=2e-2), name


def test_distill_cli_data_without_timestamps_then_train_on_two_dirs(tmp_path, one_torch_thread):
    from click.testing import CliRunner

    from specli.cli import main

    def run(*args):
        return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)

    short = sorted(EN_CLIPS, key=lambda p: p.stat().st_size)[:2]
    for i, clip in enumerate(short):
        res = run("distill", "data", clip, "--preset", "whisper-tiny.en-ar", "--no-timestamps", "-q",
                  "--out", tmp_path / f"d{i}")
        assert res.exit_code == 0, res.output
    w = load_windows(tmp_path / "d0")[0]
    assert w["tokens"][int(w["plen"]) - 1] == 50362  # <|notimestamps|> ends the prompt: decoded as asked
    assert all(t < 50363 for t in w["tokens"][int(w["plen"]):].tolist())  # no timestamp token sampled
    res = run("distill", "train", tmp_path / "d0", tmp_path / "d1", "--preset", "whisper-tiny.en-ar",
              "--out", tmp_path / "head", "--steps", 2, "--batch", 1, "--draft-vocab", 2000, "--val",
              tmp_path / "d1", "-q")
    assert res.exit_code == 0, res.output
    assert "2 step(s)" in res.output and "validation acceptance" in res.output
    res = run("distill", "train", tmp_path / "missing", "--preset", "whisper-tiny.en-ar")
    assert res.exit_code == 2 and "does not exist" in res.output
