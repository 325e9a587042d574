"""On-policy distillation of speech-token drafters (DSpark / DFlash / EAGLE-3) on a tiny CosyVoice3 target.

The target is the tiny random CV3 checkpoint of ``cosyvoice_fixtures`` made learnable: its blocks
add nothing (``o_proj`` / ``down_proj`` zeroed, so the final state is the normed embedding of the
current token: a first-order Markov chain), and the head favours 41 speech ids (every 160th id and
eos) over the rest, so a few short sequences visit each of them often. An untrained DSpark drafter
already gets slot 0 roughly right (its near-identity layers over the target's own embedding and
head); the later slots have to learn the chain through the Markov head, which training does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from cosyvoice_fixtures import write_checkpoint

from specli.cli import main
from specli.distill.data import load_windows
from specli.distill.speech_data import SpeechDataOptions, generate_speech, read_speech_manifest
from specli.distill.speech_train import (
    SpeechTrainOptions,
    batch_loss,
    layer_index,
    make_batch,
    new_module,
    target_logits,
    train_speech,
    validate,
)
from specli.core.drafters.llm.speculators import load_speech_drafter
from specli.core.sampling import SamplerOptions
from specli.tts.synthesis import SynthesisRequest
from specli.models.cosyvoice.lm import load_cosyvoice

WORDS = "the quick brown fox jumps over a lazy dog while seven tiny birds sing near old green trees".split()
TEXTS = [" ".join(WORDS[i % len(WORDS) : i % len(WORDS) + 3]) for i in range(16)]
EOS = 6562  # CosyVoice3: speech_token_size + 1


def markov_checkpoint(path: Path, kind: str = "cosyvoice3", eos: int = EOS) -> Path:
    """The tiny checkpoint turned into a peaked first-order Markov chain over 41 speech ids."""
    ck = write_checkpoint(path, kind, seed=4)
    sd = torch.load(ck / "llm.pt", weights_only=True)
    for key in sd:
        if key.endswith(("o_proj.weight", "down_proj.weight")):
            sd[key].zero_()
    for key in ("speech_embedding.weight", "llm_embedding.weight", "llm.model.model.embed_tokens.weight"):
        if key in sd:
            sd[key][:, 0] = 30.0  # a constant direction the head reads to favour the kept ids
    head = sd["llm_decoder.weight"]
    head *= 4.0
    keep = torch.zeros(head.shape[0], dtype=torch.bool)
    keep[torch.arange(0, 6561, 160)] = True
    keep[eos] = True
    head[:, 0] = torch.where(keep, 0.0, -2.0)
    head[eos, 0] = -0.4  # longer utterances
    torch.save(sd, ck / "llm.pt")
    return ck


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    ck = markov_checkpoint(tmp_path_factory.mktemp("cv3markov") / "ckpt")
    return ck, load_cosyvoice(str(ck))


@pytest.fixture(scope="module")
def data(target, tmp_path_factory):
    """On-policy shards: 12 training utterances, 4 held out."""
    _, model = target
    root = tmp_path_factory.mktemp("speechdata")
    reqs = [SynthesisRequest(f"u{i:02d}", t) for i, t in enumerate(TEXTS)]
    generate_speech(reqs[:12], model, root / "train", SpeechDataOptions(per_shard=6))
    generate_speech(reqs[12:], model, root / "val", SpeechDataOptions(per_shard=6))
    return root / "train", root / "val"


FAST = dict(anchors=16, markov_rank=64, draft_vocab=256, batch=4, warmup=5, val_sequences=4)


def test_data_keeps_only_eos_terminated_sequences_and_resumes(target, data):
    ck, model = target
    train_dir, _ = data
    man = read_speech_manifest(train_dir)
    assert man["sampler"]["name"] == "ras" and man["sampler"]["top_k"] == 25 and man["aux_layers"] == [0, 1, 2]
    records = load_windows(train_dir)
    assert len(records) >= 8
    kept_ids = {r["id"] for r in records}
    dropped = [i for e in man["done"].values() for i in e["dropped"]]
    assert len(kept_ids) + len(dropped) == 12
    for r in records:
        toks = r["tokens"]
        assert int(toks[-1]) == EOS and EOS not in toks[r["plen"] : -1].tolist()
        assert r["aux"].shape == (len(toks), 3, 32) and r["aux"].dtype == torch.float16
        assert r["last"].shape == (len(toks), 32)
        assert len(toks) - 1 - r["plen"] <= r["max_len"]  # (CV3 masks sos, not eos, below min_len)
    # the stored states are the target's: the head over `last` gives the target's logits
    r = records[0]
    state = model.lm.start(len(r["tokens"]) + 1)
    out = model.lm.score(state, r["tokens"][None])
    assert torch.allclose(out.hidden.last[0].half().float(), r["last"].float(), atol=1e-2)
    # resume: nothing is redone
    reqs = [SynthesisRequest(f"u{i:02d}", t) for i, t in enumerate(TEXTS[:12])]
    again = generate_speech(reqs, model, train_dir, SpeechDataOptions(per_shard=6))
    assert (again.kept, again.skipped) == (0, 12)
    with pytest.raises(Exception, match="sampler"):
        generate_speech(reqs, model, train_dir, SpeechDataOptions(SamplerOptions("greedy")))


def test_sequences_that_never_stop_are_dropped(tmp_path):
    ck = write_checkpoint(tmp_path / "boost", "cosyvoice3", seed=4, boost=7)  # id 7 dominates every step
    model = load_cosyvoice(str(ck))
    reqs = [SynthesisRequest("a", "the quick brown fox"), SynthesisRequest("b", "a lazy dog")]
    s = generate_speech(reqs, model, tmp_path / "d", SpeechDataOptions(SamplerOptions("greedy")))
    assert (s.kept, s.dropped) == (0, 2)
    assert load_windows(tmp_path / "d") == []


def _params(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_dspark_training_lowers_the_loss_and_raises_acceptance(target, data, tmp_path):
    _, model = target
    train_dir, val_dir = data
    records, val = load_windows(train_dir), load_windows(val_dir)
    man = read_speech_manifest(train_dir)
    opts = SpeechTrainOptions("dspark", epochs=12, lr=1e-2, val_every=12, **FAST)
    untrained = new_module("dspark", model, records, opts)
    assert untrained.config.draft_vocab == 256 and untrained.config.block_size == 8
    assert untrained.config.layers == 3 and untrained.config.markov_rank == 64
    sampler = SamplerOptions(**man["sampler"])
    base = validate(untrained, model, val, sampler).acceptance_length
    summary = train_speech(records, model, tmp_path / "dspark", opts, val, man)
    assert summary.steps == 36 and summary.best_acceptance is not None
    trained = load_speech_drafter(tmp_path / "dspark", model.lm)
    assert torch.equal(trained.draft_ids, untrained.draft_ids)
    gen = torch.Generator().manual_seed(5)
    batch = make_batch(records[:4], layer_index(man["aux_layers"], untrained), 16, EOS, torch.device("cpu"), gen)
    with torch.no_grad():
        before, _ = batch_loss(untrained, batch, opts)
        after, parts = batch_loss(trained, batch, opts)
    assert float(after) < 0.8 * float(before)
    acc = validate(trained, model, val, sampler).acceptance_length
    assert acc == pytest.approx(summary.best_acceptance)
    assert acc > base + 0.5, f"acceptance untrained {base:.3f}, trained {acc:.3f}"


# measured (benchmarks/speech_drafter_acceptance.py, 12 epochs): dflash tau 1.18 -> 1.31, eagle3 1.00 -> 1.41
@pytest.mark.parametrize(("kind", "gain"), [("dflash", 0.05), ("eagle3", 0.2)])
def test_dflash_and_eagle3_training_lowers_the_loss_and_raises_acceptance(target, data, tmp_path, kind, gain):
    _, model = target
    train_dir, val_dir = data
    records, man, val = load_windows(train_dir), read_speech_manifest(train_dir), load_windows(val_dir)
    opts = SpeechTrainOptions(kind, epochs=12, lr=1e-2, layers=2, val_every=12, **FAST)
    fresh = new_module(kind, model, records, opts)
    assert fresh.config.block_size == (4 if kind == "dflash" else 7)
    sampler = SamplerOptions(**man["sampler"])
    base = validate(fresh, model, val, sampler).acceptance_length
    summary = train_speech(records, model, tmp_path / kind, opts, val, man)
    trained = load_speech_drafter(tmp_path / kind, model.lm)
    batch = make_batch(records[:4], layer_index(man["aux_layers"], fresh), 16, EOS, torch.device("cpu"),
                       torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert float(batch_loss(trained, batch, opts)[0]) < 0.8 * float(batch_loss(fresh, batch, opts)[0])
    assert summary.steps == 36
    acc = validate(trained, model, val, sampler).acceptance_length
    assert acc > base + gain, f"acceptance untrained {base:.3f}, trained {acc:.3f}"


class _Cut(Exception):
    pass


def test_resume_after_a_cut_continues_from_the_checkpoint(target, data, tmp_path):
    _, model = target
    train_dir, _ = data
    records, man = load_windows(train_dir), read_speech_manifest(train_dir)
    opts = SpeechTrainOptions("dspark", epochs=3, lr=1e-2, checkpoint_every=2, **FAST)
    straight = train_speech(records, model, tmp_path / "straight", opts, None, man)

    def cut(msg: str) -> None:
        if "step 5:" in msg:
            raise _Cut
    with pytest.raises(_Cut):
        train_speech(records, model, tmp_path / "cut", opts, None, man, cut)
    assert sorted(p.name for p in (tmp_path / "cut" / "checkpoints").iterdir())[-1] == "ckpt-00000004.pt"
    seen: list[str] = []
    resumed = train_speech(records, model, tmp_path / "cut", opts, None, man, seen.append)
    assert resumed.steps == straight.steps == 9
    assert seen[0].startswith("epoch 2 step 5:")  # steps 1-4 were not redone
    a = _params(load_speech_drafter(tmp_path / "straight", model.lm))
    b = _params(load_speech_drafter(tmp_path / "cut", model.lm))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    # a step budget also stops resumably
    budget = SpeechTrainOptions("dspark", epochs=3, lr=1e-2, steps=2, **FAST)
    assert train_speech(records, model, tmp_path / "budget", budget, None, man).steps == 2
    more = train_speech(records, model, tmp_path / "budget", SpeechTrainOptions(
        "dspark", epochs=3, lr=1e-2, steps=4, **FAST), None, man, (lines := []).append)
    assert more.steps == 4 and lines[0].startswith("epoch 1 step 3:")


def test_cli_data_and_train(target, tmp_path):
    ck, _ = target
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS[:2]) + "\n")
    runner = CliRunner()
    args = ["distill", "data", str(texts), "--preset", "cosyvoice3-ar", "--model", str(ck), "--out",
            str(tmp_path / "d"), "--per-shard", "2", "-q"]
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "kept" in res.stderr and "0 already done" in res.stderr
    res = runner.invoke(main, args)
    assert res.exit_code == 0 and "2 already done" in res.stderr
    train = ["distill", "train", str(tmp_path / "d"), "--preset", "cosyvoice3-ar", "--model", str(ck),
             "--drafter", "dspark", "--steps", "2", "--anchors", "4", "--markov-rank", "8", "--draft-vocab", "256",
             "--val", str(tmp_path / "d"), "--out", str(tmp_path / "drafter"), "-q"]
    res = runner.invoke(main, train)
    assert res.exit_code == 0, res.output
    assert "2 step(s)" in res.stderr and "validation acceptance" in res.stderr
    cfg = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dspark" and cfg["draft_vocab_size"] == 256
    # a Whisper data directory is refused for a synthesis preset, with a clean error
    res = runner.invoke(main, ["distill", "train", str(tmp_path), "--preset", "cosyvoice3-ar", "--model", str(ck)])
    assert res.exit_code != 0 and "not speech distillation data" in res.stderr

    res = runner.invoke(main, ["distill", "train", str(tmp_path / "d"), "--preset", "cosyvoice3-ar", "--model",
                               str(ck), "--drafter", "dflash", "--layers", "1", "--steps", "1", "--anchors", "4",
                               "--draft-vocab", "256", "--out", str(tmp_path / "dflash"), "-q"])
    assert res.exit_code == 0, res.output
    assert "1 step(s)" in res.stderr
    assert json.loads((tmp_path / "dflash" / "config.json").read_text())["speculators_model_type"] == "dflash"


def test_cosyvoice2_keeps_its_head_bias(tmp_path):
    """CosyVoice2's llm_decoder has a bias (the published recipes dropped it): the training target and
    the drafter's head keep it."""
    ck = markov_checkpoint(tmp_path / "cv2", "cosyvoice2", eos=6561)
    model = load_cosyvoice(str(ck))
    reqs = [SynthesisRequest(f"c{i}", t) for i, t in enumerate(TEXTS[:3])]
    generate_speech(reqs, model, tmp_path / "d", SpeechDataOptions(SamplerOptions("vllm", top_k=50)))
    records, man = load_windows(tmp_path / "d"), read_speech_manifest(tmp_path / "d")
    assert records and man["sampler"]["name"] == "vllm" and man["eos"] == 6561
    r = records[0]
    out = model.lm.score(model.lm.start(len(r["tokens"]) + 1), r["tokens"][None])
    parts = model.lm.draft_parts()
    assert parts.head_bias is not None
    assert torch.allclose(target_logits(parts, r["last"]), out.logits[0], atol=0.1)
    opts = SpeechTrainOptions("dspark", epochs=1, steps=2, **FAST)
    train_speech(records, model, tmp_path / "drafter", opts, None, man)
    drafter = load_speech_drafter(tmp_path / "drafter", model.lm)
    assert drafter.config.head_bias and drafter.head_b is not None
