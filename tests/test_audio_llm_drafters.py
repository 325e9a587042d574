"""EAGLE-3 and DFlash drafters on the audio-LLM targets (tiny random Qwen2-Audio and Qwen3-Omni thinker): the
aux hidden states the drafters read are transformers' ``output_hidden_states`` in the stored layer-output
convention; the families' recipes scale their published layer ids to a tiny depth; with random drafter weights
speculative greedy decoding equals plain greedy decoding at batch 1 and in ragged batches, and sampling keeps
the target's law; the experts an MoE verification touches grow with the draft length; presets name drafter
directories resolved from $SPECLI_MODELS_DIR (missing: exit 3)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf
import torch

from conftest import EN_CLIPS
from qwen2_audio_fixtures import write_tiny_qwen2_audio
from qwen3_omni_fixtures import write_tiny_qwen3_omni
from specli.core.batched import RowJob, decode_all
from specli.core.drafters.batched import batch_drafter
from specli.core.drafters.llm.base import attach_aux_layers
from specli.core.drafters.llm.dflash import new_dflash
from specli.core.drafters.llm.eagle3 import new_eagle3
from specli.core.drafters.llm.loading import load_drafter, wrap
from specli.core.drafters.llm.speculators import save_speculators
from specli.core.greedy import greedy_decode
from specli.core.logits import SamplingParams
from specli.core.speculative import SpecOptions, speculative_decode
from specli.errors import ModelLoadError
from specli.models.audio_lm import DraftRecipe
from specli.models.qwen2 import rms_norm
from specli.models.qwen2_audio.loader import load_qwen2_audio
from specli.models.qwen3_omni.loader import load_qwen3_omni
from specli.models.speech import WindowPrompt

FAMILIES = ["qwen2-audio", "qwen3-omni"]
KINDS = ["eagle3", "dflash"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("audio-llm")
    return {"qwen2-audio": write_tiny_qwen2_audio(root / "qwen2-audio"),
            "qwen3-omni": write_tiny_qwen3_omni(root / "qwen3-omni")}


@pytest.fixture(scope="module")
def models(dirs):
    return {"qwen2-audio": load_qwen2_audio(str(dirs["qwen2-audio"]), "float32"),
            "qwen3-omni": load_qwen3_omni(str(dirs["qwen3-omni"]), "float32")}


def _clip(i: int, seconds: float | None = None) -> np.ndarray:
    audio, _ = sf.read(str(EN_CLIPS[i]), dtype="float32")
    return audio if seconds is None else audio[: int(seconds * 16000)]


def _window(model, audio: np.ndarray, max_new: int = 24, language: str | None = "en"):
    """(job, state, mel, frames) of one window of ``audio``."""
    hooks = model.speech_hooks()
    mel, frames = hooks.features(audio)
    job = hooks.window_job(WindowPrompt("transcribe", language, (), (), True, (-1,), max_new, frames, None))
    return job, model.target.start(model.target.encode(mel, [frames])), mel, frames


def random_drafter(model, kind: str, seed: int = 0):
    """A randomly initialised drafter of the family's recipe (layer outputs), attached to the target."""
    target = model.target
    parts = target.draft_parts()
    ids, convention = target.draft_recipe.aux_layers(kind, parts.layers)
    if kind == "eagle3":
        module = new_eagle3(parts, 5, seed=seed, aux_layers=ids, convention=convention)
    else:
        module = new_dflash(parts, 2, target.draft_recipe.dflash_block, seed=seed, aux_layers=ids,
                            convention=convention)
    target.lm.aux_layers = ()  # one drafter at a time on the shared target
    attach_aux_layers(target, module.config)
    return module


def test_recipes_scale_the_published_layer_ids():
    qwen2_audio = DraftRecipe(32, (1, 8, 15, 22, 28), 4, 5)
    omni = DraftRecipe(48, (1, 12, 23, 34, 45), 8, 7)
    assert qwen2_audio.aux_layers("eagle3", 32) == ((1, 15, 28), "output")  # SpecForge's [1, L/2-1, L-4]
    assert omni.aux_layers("eagle3", 48) == ((1, 23, 44), "output")
    assert qwen2_audio.aux_layers("dflash", 32) == ((1, 8, 15, 22, 28), "output")
    assert omni.aux_layers("dflash", 48) == ((1, 12, 23, 34, 45), "output")
    for recipe in (qwen2_audio, omni):
        for depth in (3, 4, 8, 12):
            for kind in KINDS:
                ids, _ = recipe.aux_layers(kind, depth)
                assert list(ids) == sorted(set(ids)) and all(0 <= i < depth for i in ids)
                assert kind != "eagle3" or len(ids) == 3


def _hf_hidden_states(family: str, dirs, job, mel, frames) -> tuple[torch.Tensor, ...]:
    ids = torch.tensor([job.prompt])
    mask = (torch.arange(mel.shape[2]) < frames).long()[None]
    if family == "qwen2-audio":
        from transformers import Qwen2AudioForConditionalGeneration

        hf = Qwen2AudioForConditionalGeneration.from_pretrained(str(dirs[family]), dtype=torch.float32).eval()
    else:
        from transformers import Qwen3OmniMoeForConditionalGeneration

        hf = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(dirs[family]), dtype=torch.float32,
                                                                  enable_audio_output=False).eval().thinker
    with torch.inference_mode():
        out = hf(input_ids=ids, attention_mask=torch.ones_like(ids), input_features=mel,
                 feature_attention_mask=mask, output_hidden_states=True)
    return out.hidden_states


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", KINDS)
def test_aux_states_are_transformers_layer_outputs(models, dirs, family, kind):
    """Layer-output id ``i`` (the drafter's config) is transformers' ``hidden_states[i + 1]``; the output of the
    last block is transformers' last entry before its final norm (which transformers applies to that entry)."""
    model = models[family]
    module = random_drafter(model, kind)
    assert module.config.aux_convention == "output"
    job, state, mel, frames = _window(model, _clip(0, 2.0))
    ours = model.target.score(state, torch.tensor([list(job.prompt)])).hidden.aux
    theirs = _hf_hidden_states(family, dirs, job, mel, frames)
    layers = model.target.dims.layers
    assert len(theirs) == layers + 1
    for i, got in zip(module.config.aux_layers, ours, strict=True):
        if i + 1 < layers:
            torch.testing.assert_close(got, theirs[i + 1], atol=2e-4, rtol=1e-4)
        else:
            d = model.target.dims
            torch.testing.assert_close(rms_norm(got, model.target.lm.norm, d.rms_eps), theirs[i + 1],
                                       atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("clip", "seconds", "max_draft"), [(0, None, 3), (1, 2.5, 7), (3, 7.5, 1)])
def test_random_drafter_greedy_equals_greedy(models, family, kind, clip, seconds, max_draft):
    model = models[family]
    drafter = wrap(random_drafter(model, kind, seed=clip))
    job, state, _mel, _frames = _window(model, _clip(clip, seconds), max_new=30, language=None if clip else "en")
    ref = greedy_decode(model.target, state, job)
    state.cache.crop(0)
    out = speculative_decode(model.target, state, job, drafter, SpecOptions(max_draft=max_draft))
    assert out.tokens == ref.tokens and out.finished == ref.finished
    assert out.sum_logprob == pytest.approx(ref.sum_logprob, abs=1e-3)
    assert out.stats.verify_steps >= 1 and out.stats.drafted >= 1


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", KINDS)
def test_random_drafter_ragged_batch_rows_equal_batch_1(models, family, kind):
    model = models[family]
    drafter = wrap(random_drafter(model, kind, seed=3))
    windows = [_window(model, _clip(i, s), max_new=n, language=lang)
               for i, s, n, lang in ((0, None, 20, "en"), (1, 2.05, 9, None), (2, 0.3, 30, "en"), (3, 7.5, 14, None))]
    ref = {key: greedy_decode(model.target, state, job) for key, (job, state, _m, _f) in enumerate(windows)}
    rows = [RowJob(key, state.audio, job) for key, (job, state, _m, _f) in enumerate(windows)]
    got = dict(decode_all(model.target, rows, 3, drafter=batch_drafter(drafter, 3), options=SpecOptions(max_draft=4)))
    for key, res in ref.items():
        assert got[key].tokens == res.tokens and got[key].finished == res.finished


@pytest.mark.parametrize("family", FAMILIES)
def test_random_eagle3_sampling_keeps_the_first_token_law(models, family):
    model = models[family]
    drafter = wrap(random_drafter(model, "eagle3", seed=1))
    job, state, _mel, _frames = _window(model, _clip(3, 2.0), max_new=2, language=None)
    job = replace(job, sampling=SamplingParams(temperature=1.5))
    probs = (model.target.score(state, torch.tensor([list(job.prompt)])).logits[0, -1] / 1.5).softmax(-1)
    counts = torch.zeros(probs.numel())
    runs = 300
    gen = torch.Generator().manual_seed(0)
    for _ in range(runs):
        state.cache.crop(0)
        out = speculative_decode(model.target, state, replace(job, generator=gen), drafter, SpecOptions(max_draft=2))
        counts[out.tokens[0] if out.tokens else job.eot] += 1
    tv = 0.5 * (counts / runs - probs).abs().sum()
    assert float(tv) < 3 * 0.5 * (int((probs > 1e-3).sum()) / runs) ** 0.5


def test_experts_touched_grow_with_the_draft_length(models):
    """A verification of ``n`` tokens touches more distinct experts than a decode step (top-2 of 8 per token)."""
    model = models["qwen3-omni"]
    target = model.target
    job, state, _mel, _frames = _window(model, _clip(0, 3.0))
    target.experts.reset()
    target.score(state, torch.tensor([list(job.prompt)]))
    assert target.experts is not None and target.experts.forwards == 0  # prefills are not verifications
    prefix = state.cache.length
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 4, 8):
        for _ in range(6):
            target.score(state, torch.randint(0, 256, (1, n), generator=g))
            state.cache.crop(prefix)
    means = [target.experts.mean(n) for n in (1, 2, 4, 8)]
    moe_layers = sum(blk.moe is not None for blk in target.lm.blocks)
    assert means[0] == pytest.approx(2 * moe_layers)  # one token: exactly top-k experts a layer
    assert means == sorted(means) and means[-1] > means[0]
    assert all(m <= 8 * moe_layers for m in means)
    assert models["qwen2-audio"].target.experts is None  # a dense decoder tallies nothing
    target.experts.reset()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", KINDS)
def test_presets_load_their_drafter_from_the_models_dir(models, dirs, family, kind, tmp_path, monkeypatch):
    from specli.asr.strategies import load_engine
    from specli.presets import load_preset

    preset = load_preset(f"{family}-{kind}")
    assert preset.draft.drafter == kind and preset.draft.draft_dir == f"{family}-{kind}"
    monkeypatch.setenv("SPECLI_MODELS_DIR", str(tmp_path))
    with pytest.raises(ModelLoadError, match=f"{family}-{kind}"):
        load_engine(preset, model=str(dirs[family]))
    module = random_drafter(models[family], kind, seed=5)
    save_speculators(module, tmp_path / f"{family}-{kind}")
    engine = load_engine(preset, model=str(dirs[family]))
    cfg = engine.decode.drafter.module.config
    assert cfg.kind == kind and cfg.aux_layers == module.config.aux_layers and cfg.aux_convention == "output"
    assert engine.model.target.lm.aux_layers == module.config.target_layers()
    direct = load_drafter(str(tmp_path / f"{family}-{kind}"), engine.model.target, kind=kind)
    assert torch.equal(direct.module.fc.weight, module.fc.weight)


def test_a_zlab_dflash_checkpoint_loads_through_the_omni_preset(models, dirs, tmp_path, monkeypatch):
    """z-lab / SpecForge DFlash (``DFlashDraftModel``, ``dflash_config.target_layer_ids`` as layer outputs, no
    head or vocabulary maps: the target's) drafts for the Omni thinker through qwen3-omni-dflash, losslessly."""
    import json

    from safetensors.torch import load_file, save_file

    from specli.asr.strategies import load_engine
    from specli.presets import load_preset

    module = random_drafter(models["qwen3-omni"], "dflash", seed=7)
    save_speculators(module, tmp_path / "native")
    w = {k: v for k, v in load_file(str(tmp_path / "native" / "model.safetensors")).items()
         if k not in ("d2t", "t2d", "lm_head.weight")}
    out = tmp_path / "qwen3-omni-dflash"
    out.mkdir()
    save_file(w, str(out / "model.safetensors"))
    c = module.config
    (out / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": c.hidden,
        "num_hidden_layers": c.layers, "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim, "intermediate_size": c.intermediate, "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_theta, "vocab_size": c.target_vocab,
        "dflash_config": {"block_size": c.block_size, "mask_token_id": c.mask_token_id,
                          "target_layer_ids": list(c.aux_layers)}}))
    monkeypatch.setenv("SPECLI_MODELS_DIR", str(tmp_path))
    engine = load_engine(load_preset("qwen3-omni-dflash"), model=str(dirs["qwen3-omni"]))
    drafter = engine.decode.drafter
    assert drafter.module.config.aux_convention == "output" and drafter.module.config.aux_layers == c.aux_layers
    model = engine.model
    job, state, _mel, _frames = _window(model, _clip(1, 2.5), max_new=30, language=None)
    ref = greedy_decode(model.target, state, job)
    state.cache.crop(0)
    out_ = speculative_decode(model.target, state, job, drafter, SpecOptions(max_draft=7))
    assert out_.tokens == ref.tokens and out_.stats.drafted >= 1
