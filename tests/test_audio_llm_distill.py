"""`specli distill data|train` for audio-LLM presets end to end on a tiny random Qwen2-Audio: on-policy greedy
transcripts of samples/en clips (the prompt with its audio placeholders is never a loss position), a few training
steps of an EAGLE-3 and a DFlash drafter (the family's layer ids scaled to the tiny depth, as layer outputs)
saved in the speculators format, loaded through the qwen2-audio-eagle3 / -dflash presets from $SPECLI_MODELS_DIR
and transcribing the same text as plain decoding; the trained drafters are lossless at batch 1 and in ragged
batches."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import soundfile as sf
import torch
from click.testing import CliRunner

from conftest import EN_CLIPS
from qwen2_audio_fixtures import write_tiny_qwen2_audio
from specli.cli import main
from specli.core.batched import RowJob, decode_all
from specli.core.drafters.batched import batch_drafter
from specli.core.drafters.llm.loading import load_drafter
from specli.core.greedy import greedy_decode
from specli.core.speculative import SpecOptions, speculative_decode
from specli.distill.audio_lm_data import recipe_layers, use_layers, window_record
from specli.distill.data import load_windows
from specli.models.qwen2_audio.loader import load_qwen2_audio
from specli.models.speech import WindowPrompt

FAST = ("--temperature-increment-on-fallback", "0", "--language", "en")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_qwen2_audio(tmp_path_factory.mktemp("qwen2-audio-distill") / "tiny")


@pytest.fixture(scope="module")
def data_dir(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("audio-lm-data") / "data"
    res = run("distill", "data", EN_CLIPS[0], EN_CLIPS[1], "--preset", "qwen2-audio-ar", "--model", tiny_dir,
              "--language", "en", "--out", out, "-q")
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def models_dir(tiny_dir, data_dir, tmp_path_factory):
    """Drafters trained a few steps, saved under a $SPECLI_MODELS_DIR with the presets' names."""
    root = tmp_path_factory.mktemp("models")
    for kind in ("eagle3", "dflash"):
        res = run("distill", "train", data_dir, "--preset", "qwen2-audio-ar", "--model", tiny_dir, "--drafter", kind,
                  "--layers", "2", "--steps", "3", "--batch", "2", "--anchors", "8", "--out",
                  root / f"qwen2-audio-{kind}")
        assert res.exit_code == 0, res.output
        assert re.search(r"3 step\(s\), loss [0-9.]+", res.output), res.output
    return root


def test_data_records_transcripts_after_the_audio_prompt(tiny_dir, data_dir, tmp_path):
    manifest = json.loads((data_dir / "manifest.json").read_text())
    model = load_qwen2_audio(str(tiny_dir), "float32")
    assert manifest["kind"] == "audio-lm" and manifest["aux_layers"] == list(recipe_layers(model.target))
    assert len(manifest["done"]) == 2
    records = load_windows(data_dir)
    audio_token, eot = model.target.audio_token, model.tokenizer.eot
    tail = records[0]["tokens"][int(records[0]["plen"]) - 3 : int(records[0]["plen"])].tolist()
    for r in records:
        tokens, plen = r["tokens"].tolist(), int(r["plen"])
        # the prompt (chat turn, audio placeholders, instruction) ends where the loss positions begin
        assert tokens[:plen].count(audio_token) > 0
        assert tokens[plen - 3 : plen] == tail
        assert len(tokens) > plen and (tokens[-1] == eot or len(tokens) - plen == 224)
        assert r["aux"].shape == (len(tokens), len(manifest["aux_layers"]), model.target.dims.hidden)
    # the labels are the target's own greedy transcript of the window, as transcribe decodes it without fallback
    hooks = model.speech_hooks()
    audio, _ = sf.read(str(EN_CLIPS[0]), dtype="float32")
    _mel, frames = hooks.features(audio)
    first = records[0]
    job = hooks.window_job(WindowPrompt("transcribe", "en", (), (), True, (-1,), 448, frames, None))
    assert list(job.prompt) == first["tokens"][: int(first["plen"])].tolist()
    res = run("transcribe", "--model", tiny_dir, EN_CLIPS[0], "-f", "json", "-o", tmp_path, *FAST)
    assert res.exit_code == 0, res.output
    segment = json.loads((tmp_path / f"{EN_CLIPS[0].stem}.json").read_text())["segments"][0]
    labelled = first["tokens"][int(first["plen"]):].tolist()
    assert segment["tokens"] == (labelled[:-1] if labelled[-1] == eot else labelled)  # eot, or the length cap


def test_other_family_flags_and_drafters_are_refused(tiny_dir, data_dir, tmp_path):
    res = run("distill", "data", EN_CLIPS[0], "--preset", "qwen2-audio-ar", "--text", "hi", "--out", tmp_path / "x")
    assert res.exit_code == 2 and "--text" in res.output
    res = run("distill", "train", data_dir, "--preset", "qwen2-audio-ar", "--model", tiny_dir, "--out", tmp_path / "y")
    assert res.exit_code == 2 and "eagle3 or dflash" in res.output


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_trained_drafter_loads_through_the_preset_and_transcribes_losslessly(tiny_dir, models_dir, kind, tmp_path,
                                                                               monkeypatch):
    cfg = json.loads((models_dir / f"qwen2-audio-{kind}" / "config.json").read_text())
    assert cfg["speculators_model_type"] == kind and cfg["specli"]["aux_layer_convention"] == "output"
    model = load_qwen2_audio(str(tiny_dir), "float32")
    ids, _ = model.target.draft_recipe.aux_layers(kind, model.target.dims.layers)
    assert cfg["aux_hidden_state_layer_ids"] == list(ids)
    monkeypatch.setenv("SPECLI_MODELS_DIR", str(models_dir))
    texts = {}
    for preset in ("qwen2-audio-ar", f"qwen2-audio-{kind}"):
        res = run("transcribe", "--preset", preset, "--model", tiny_dir, EN_CLIPS[0], EN_CLIPS[2], "-f", "json",
                  "-o", tmp_path / preset, *FAST)
        assert res.exit_code == 0, res.output
        texts[preset] = {p.stem: json.loads(p.read_text())["text"] for p in (tmp_path / preset).glob("*.json")}
    assert texts["qwen2-audio-ar"] == texts[f"qwen2-audio-{kind}"] and len(texts["qwen2-audio-ar"]) == 2


def test_missing_drafter_directory_exits_3(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLI_MODELS_DIR", str(tmp_path))
    res = CliRunner().invoke(main, ["transcribe", "--preset", "qwen2-audio-dflash", "--model", str(tiny_dir),
                                    str(EN_CLIPS[0]), "-o", str(tmp_path / "o")])
    assert res.exit_code == 3 and "qwen2-audio-dflash" in res.output


def _window(model, i: int, seconds: float | None, max_new: int):
    hooks = model.speech_hooks()
    audio, _ = sf.read(str(EN_CLIPS[i]), dtype="float32")
    audio = audio if seconds is None else audio[: int(seconds * 16000)]
    mel, frames = hooks.features(np.asarray(audio))
    job = hooks.window_job(WindowPrompt("transcribe", "en", (), (), True, (-1,), max_new, frames, None))
    return job, model.target.start(model.target.encode(mel, [frames]))


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_trained_drafter_is_lossless_at_batch_1_and_in_ragged_batches(tiny_dir, models_dir, kind):
    model = load_qwen2_audio(str(tiny_dir), "float32")
    drafter = load_drafter(str(models_dir / f"qwen2-audio-{kind}"), model.target, kind=kind)
    windows = [_window(model, i, s, n) for i, s, n in ((0, None, 30), (1, 2.05, 9), (2, 0.3, 25), (3, 7.5, 14))]
    ref = {}
    for key, (job, state) in enumerate(windows):
        ref[key] = greedy_decode(model.target, state, job)
        for max_draft in (1, 3, 6):
            state.cache.crop(0)
            out = speculative_decode(model.target, state, job, drafter, SpecOptions(max_draft=max_draft))
            assert out.tokens == ref[key].tokens and out.finished == ref[key].finished
    rows = [RowJob(key, state.audio, job) for key, (job, state) in enumerate(windows)]
    got = dict(decode_all(model.target, rows, 3, drafter=batch_drafter(drafter, 3), options=SpecOptions(max_draft=4)))
    for key, res in ref.items():
        assert got[key].tokens == res.tokens and got[key].finished == res.finished
    assert torch.equal(torch.tensor(model.target.lm.aux_layers),
                       torch.tensor(drafter.module.config.target_layers()))


def test_a_transcript_holding_the_audio_placeholder_is_text_in_its_record(tiny_dir):
    """A random target may emit its own audio placeholder id; decoding embeds it as text (its positions are past
    the prompt), so the record's states must too: one prefill of the prompt, then the transcript."""
    model = load_qwen2_audio(str(tiny_dir), "float32")
    layers = use_layers(model.target, recipe_layers(model.target))
    job, state = _window(model, 0, 3.0, 8)
    prompt = list(job.prompt)
    transcript = [5, model.target.audio_token, 7, model.target.audio_token]
    rec = window_record(model.target, state.audio[0], prompt + transcript, len(prompt), "x#0", layers)
    state.cache.crop(0)
    model.target.score(state, torch.tensor([prompt]))
    steps = [model.target.score(state, torch.tensor([[t]])).hidden for t in transcript]
    want = torch.cat([h.last for h in steps], dim=1)[0].half()  # [4, hidden]: decoded one token at a time
    assert rec["tokens"].tolist() == prompt + transcript
    assert torch.allclose(rec["last"][len(prompt):].float(), want.float(), atol=2e-3)
    assert rec["aux"].shape[:2] == (len(prompt) + 4, len(recipe_layers(model.target)))
