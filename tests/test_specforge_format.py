"""SpecForge's own EAGLE-3 checkpoints (``LlamaForCausalLMEagle3``, sgl-project/SpecForge) on the audio-LLM targets.

Ported means numerically equal: a small transcription of SpecForge's draft model under its test-time-training
loop (written from ``specforge/modeling/draft/llama3_eagle.py`` and its trainer, in plain torch) and specli's
loaded drafter give the same draft logits and the same greedy proposals for the same target states. A
speculative decode with a loaded SpecForge drafter equals plain greedy decoding; a checkpoint that does not fit
the target is refused with a ModelLoadError naming the file and the mismatch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import soundfile as sf
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from conftest import EN_CLIPS
from qwen2_audio_fixtures import write_tiny_qwen2_audio
from qwen3_omni_fixtures import write_tiny_qwen3_omni
from specli.core.batched import RowJob, decode_all
from specli.core.drafters.base import DraftRequest
from specli.core.drafters.batched import batch_drafter
from specli.core.drafters.llm.loading import load_drafter, wrap
from specli.core.drafters.llm.specforge import specforge_aux_layers
from specli.core.drafters.llm.speculators import load_speech_drafter, save_speculators
from specli.core.greedy import greedy_decode
from specli.core.speculative import SpecOptions, speculative_decode
from specli.errors import ModelLoadError
from specli.models.audio_lm import DraftRecipe
from specli.models.qwen2_audio.loader import load_qwen2_audio
from specli.models.qwen3_omni.loader import load_qwen3_omni
from specli.models.speech import WindowPrompt


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("specforge")
    return {"qwen2-audio": write_tiny_qwen2_audio(root / "qwen2-audio"),
            "qwen3-omni": write_tiny_qwen3_omni(root / "qwen3-omni")}


@pytest.fixture(scope="module")
def models(dirs):
    return {"qwen2-audio": load_qwen2_audio(str(dirs["qwen2-audio"]), "float32"),
            "qwen3-omni": load_qwen3_omni(str(dirs["qwen3-omni"]), "float32")}


def _window(model, seconds: float | None, clip: int = 0, max_new: int = 24):
    audio, _ = sf.read(str(EN_CLIPS[clip]), dtype="float32")
    audio = audio if seconds is None else audio[: int(seconds * 16000)]
    hooks = model.speech_hooks()
    mel, frames = hooks.features(audio)
    job = hooks.window_job(WindowPrompt("transcribe", "en", (), (), True, (-1,), max_new, frames, None))
    return job, model.target.start(model.target.encode(mel, [frames]))


# -- a SpecForge checkpoint directory, as its exporters write it -----------------------------------------------------

def write_specforge(out: Path, target, seed: int = 0, hidden: int | None = None, own_embed: bool = False,
                    fc_norm: bool = False, norm_output: bool = True, aux=None, weights: str = "safetensors"):
    """Random ``LlamaForCausalLMEagle3`` weights under SpecForge's key names and config fields; the draft
    vocabulary is every target id but those = 1 mod 3 (d2t / t2d as SpecForge's preprocessing builds them)."""
    parts = target.draft_parts()
    h, th, heads, kv = hidden or parts.hidden, parts.hidden, 4, 2
    hd, inter = h // heads, 2 * h
    used = [i for i in range(parts.vocab) if i % 3 != 1]
    g = torch.Generator().manual_seed(seed)

    def lin(o, i):
        return torch.randn(o, i, generator=g) * i ** -0.5

    def norm(n):
        return 1 + 0.2 * torch.randn(n, generator=g)

    w = {"fc.weight": lin(h, 3 * th), "norm.weight": norm(h), "lm_head.weight": 3 * lin(len(used), h),
         "d2t": torch.tensor([t - i for i, t in enumerate(used)], dtype=torch.long),
         "t2d": torch.tensor([i in set(used) for i in range(parts.vocab)], dtype=torch.bool)}
    for key in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        w[f"midlayer.{key}.weight"] = norm(h)
    for key, shape in (("q", (heads * hd, 2 * h)), ("k", (kv * hd, 2 * h)), ("v", (kv * hd, 2 * h)),
                       ("o", (h, heads * hd))):
        w[f"midlayer.self_attn.{key}_proj.weight"] = 2 * lin(*shape)
    w.update({"midlayer.mlp.gate_proj.weight": lin(inter, h), "midlayer.mlp.up_proj.weight": lin(inter, h),
              "midlayer.mlp.down_proj.weight": lin(h, inter)})
    if own_embed:
        w["embed_tokens.weight"] = torch.randn(parts.vocab, h, generator=g)
    if fc_norm:
        w.update({f"fc_norm.{i}.weight": norm(th) for i in range(3)})
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "attention_bias": False,
           "hidden_act": "silu", "hidden_size": h, "intermediate_size": inter, "num_attention_heads": heads,
           "num_key_value_heads": kv, "head_dim": hd, "num_hidden_layers": 1, "rms_norm_eps": 1e-6,
           "rope_scaling": None, "rope_theta": 10000.0, "max_position_embeddings": 2048, "pad_token_id": 0,
           "tie_word_embeddings": False, "torch_dtype": "float32", "vocab_size": parts.vocab,
           "draft_vocab_size": len(used)}
    if h != th:
        cfg["target_hidden_size"] = th
    if fc_norm or not norm_output:
        cfg.update(fc_norm=fc_norm, norm_output=norm_output)
    if aux is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux)}
    save_dir(out, cfg, w, weights)
    return cfg, w


def save_dir(out: Path, cfg: dict, w: dict, weights: str = "safetensors") -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if weights == "safetensors":
        save_file({k: v.contiguous() for k, v in w.items()}, str(out / "model.safetensors"))
    else:
        torch.save(w, str(out / "pytorch_model.bin"))


# -- the transcription: SpecForge's draft model under its trainer's test-time-training loop --------------------------

def _rms(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotary(x, positions, theta):
    """Llama rotary embedding of ``x [B, heads, T, D]`` at ``positions [T]`` (rotate-half form)."""
    d = x.shape[-1]
    angles = positions[:, None].float() / theta ** (torch.arange(0, d, 2).float() / d)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def specforge_ttt(w, cfg, aux, ids, steps, table):
    """Draft logits ``[steps, B, T, Vd]``. The trainer shifts the ids left once, then once more after every step:
    step ``j``, row ``t`` reads ``ids[t + j + 1]`` (0 past the end) and the row's previous step output (step 0:
    ``fc(aux_t)``), at position ``t + j``; it attends causally over the step-0 rows and to its own earlier steps."""
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    b, t, _ = aux.shape
    if cfg.get("fc_norm"):
        aux = torch.cat([_rms(c, w[f"fc_norm.{i}.weight"], eps) for i, c in enumerate(aux.chunk(3, -1))], -1)
    h = aux @ w["fc.weight"].T

    def layer(key):
        return w[f"midlayer.{key}.weight"]

    def shift(x):
        return torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], 1)

    ids, positions, causal = shift(ids), torch.arange(t), torch.full((t, t), float("-inf")).triu(1)
    keys, values, logits = [], [], []
    for j in range(steps):
        x = torch.cat([_rms(table[ids], layer("input_layernorm"), eps), _rms(h, layer("hidden_norm"), eps)], -1)
        q = (x @ layer("self_attn.q_proj").T).view(b, t, nh, hd).transpose(1, 2)
        k = (x @ layer("self_attn.k_proj").T).view(b, t, nkv, hd).transpose(1, 2)
        v = (x @ layer("self_attn.v_proj").T).view(b, t, nkv, hd).transpose(1, 2)
        q, k = _rotary(q, positions + j, theta), _rotary(k, positions + j, theta)
        keys.append(k.repeat_interleave(nh // nkv, 1))
        values.append(v.repeat_interleave(nh // nkv, 1))
        scores = [q @ keys[0].transpose(2, 3) / hd ** 0.5 + causal]
        scores += [(q * ki).sum(-1, keepdim=True) / hd ** 0.5 for ki in keys[1:]]
        p = torch.cat(scores, -1).softmax(-1)
        attn = p[..., :t] @ values[0] + sum(p[..., t + i - 1 : t + i] * values[i] for i in range(1, j + 1))
        h = h + attn.transpose(1, 2).reshape(b, t, nh * hd) @ layer("self_attn.o_proj").T
        y = _rms(h, layer("post_attention_layernorm"), eps)
        h = h + (F.silu(y @ layer("mlp.gate_proj").T) * (y @ layer("mlp.up_proj").T)) @ layer("mlp.down_proj").T
        logits.append((_rms(h, w["norm.weight"], eps) if cfg.get("norm_output", True) else h) @ w["lm_head.weight"].T)
        ids = shift(ids)
    return torch.stack(logits)


def specforge_chain(w, cfg, aux, context, n, table):
    """A greedy chain of ``n`` drafts after ``context`` (``aux`` for positions ``0 .. P-1``): the row of the last
    target state (``P - 1``) unrolled with the drafts as its later ids; draft row -> target id through d2t."""
    tokens, p_last, probs = list(context), len(context) - 2, []
    for j in range(n):
        pad = aux.new_zeros(1, len(tokens) - aux.shape[1], aux.shape[2])
        row = specforge_ttt(w, cfg, torch.cat([aux, pad], 1), torch.tensor([tokens]), j + 1, table)[j, 0, p_last]
        dist = row.softmax(-1)
        best = int(dist.argmax())
        tokens.append(best + int(w["d2t"][best]))
        probs.append(float(dist[best]))
    return tokens[len(context):], probs


VARIANTS = {
    "sglang-export": {},  # no embedding (the target's), safetensors
    "hf-export": {"own_embed": True, "weights": "bin", "fc_norm": True},  # embed_tokens, pytorch_model.bin
    "narrow": {"hidden": 48, "own_embed": True, "norm_output": False},  # target_hidden_size 64 != hidden_size 48
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ported_means_numerically_equal(models, tmp_path, variant):
    model = models["qwen2-audio"]
    target = model.target
    cfg, w = write_specforge(tmp_path / variant, target, seed=3, **VARIANTS[variant])
    target.lm.aux_layers = ()
    drafter = load_drafter(str(tmp_path / variant), target, kind="eagle3")
    module = drafter.module
    assert module.config.aux_layers == (1, 1, 0) and module.config.aux_convention == "output"  # [1, L/2-1, L-4]
    assert target.lm.aux_layers == (2, 2, 1)  # outputs of blocks 1, 1, 0 = inputs of blocks 2, 2, 1
    table = w["embed_tokens.weight"] if "embed_tokens.weight" in w else target.embed(torch.arange(cfg["vocab_size"]))
    job, state = _window(model, 2.0)
    seq = list(job.prompt) + [72, 101, 108, 108, 111]
    hidden = target.score(state, torch.tensor([seq[:-1]])).hidden
    aux = torch.cat(hidden.aux, -1)
    with torch.no_grad():  # teacher-forced steps: specli's anchor a, step j is SpecForge's row a - 1, step j
        ours = module.forward_train(aux, torch.tensor([seq[:-1]]))
    theirs = specforge_ttt(w, cfg, aux, torch.tensor([seq[:-1]]), module.config.block_size, table)
    t = aux.shape[1]
    for j in range(module.config.block_size):
        torch.testing.assert_close(ours.logits[0, 1 : t - j, j], theirs[j, 0, : t - 1 - j], atol=2e-4, rtol=1e-4)
    assert bool((ours.positions[0, 0] == -1).all())  # anchor 0 (x_0 with no target state) is no SpecForge row
    drafter.start(state, seq)
    proposal = drafter.propose(DraftRequest(seq, len(job.prompt), 5, state, hidden, lambda x, p: x, True))
    tokens, probs = specforge_chain(w, cfg, aux, seq, 5, table)
    assert proposal.tokens == tokens and proposal.parents == [-1, 0, 1, 2, 3]
    assert proposal.confidence == pytest.approx(probs, abs=1e-5)
    assert all(i % 3 != 1 for i in tokens)  # draft rows map through d2t to kept target ids


def test_specforge_default_layers_are_the_recipes():
    """SpecForge captures [1, L // 2 - 1, L - 4] (layer outputs) unless eagle_config says; the audio-LLM recipe
    gives the same ids at real depths."""
    recipe = DraftRecipe(32, (1, 8, 15, 22, 28), 4, 5)
    for depth in (8, 12, 24, 28, 32, 36, 48):
        want = (1, depth // 2 - 1, depth - 4)
        assert specforge_aux_layers({}, depth, Path("config.json")) == want
        assert recipe.aux_layers("eagle3", depth) == (want, "output")
    recorded = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 11, 21]}}
    assert specforge_aux_layers(recorded, 24, Path("config.json")) == (1, 11, 21)


@pytest.mark.parametrize("family", ["qwen2-audio", "qwen3-omni"])
def test_speculative_with_a_specforge_drafter_equals_greedy(models, tmp_path, family):
    model = models[family]
    target = model.target
    aux = None if family == "qwen2-audio" else (0, 1, 2)  # the 3-block Omni thinker is too shallow for the default
    write_specforge(tmp_path / "d", target, seed=5, aux=aux, own_embed=family == "qwen3-omni")
    target.lm.aux_layers = ()
    drafter = load_drafter(str(tmp_path / "d"), target, kind="eagle3")
    windows = [_window(model, s, clip, n) for clip, s, n in ((0, None, 24), (1, 2.5, 30), (3, 7.5, 12))]
    refs = []
    for (job, state), k in zip(windows, (3, 6, 1), strict=True):
        refs.append(greedy_decode(target, state, job))
        state.cache.crop(0)
        out = speculative_decode(target, state, job, drafter, SpecOptions(max_draft=k))
        assert out.tokens == refs[-1].tokens and out.finished == refs[-1].finished and out.stats.drafted >= 1
    rows = [RowJob(i, state.audio, job) for i, (job, state) in enumerate(windows)]
    got = dict(decode_all(target, rows, 2, drafter=batch_drafter(drafter, 2), options=SpecOptions(max_draft=4)))
    assert [got[i].tokens for i in range(len(refs))] == [ref.tokens for ref in refs]  # ragged batch rows too


def test_a_specforge_drafter_loads_through_the_preset_and_resaves(models, dirs, tmp_path, monkeypatch):
    """$SPECLI_MODELS_DIR/qwen2-audio-eagle3 in SpecForge's layout serves the preset; saved again in the
    speculators format it keeps SpecForge's row convention and proposes the same."""
    from specli.asr.strategies import load_engine
    from specli.presets import load_preset

    write_specforge(tmp_path / "qwen2-audio-eagle3", models["qwen2-audio"].target, seed=9)
    monkeypatch.setenv("SPECLI_MODELS_DIR", str(tmp_path))
    engine = load_engine(load_preset("qwen2-audio-eagle3"), model=str(dirs["qwen2-audio"]))
    module = engine.decode.drafter.module
    assert module.config.extra["source"] == "specforge" and not module.config.eagle_zero_row
    save_speculators(module, tmp_path / "again")
    target = engine.model.target
    again = load_speech_drafter(tmp_path / "again", target)
    assert again.config == module.config
    job, state = _window(engine.model, 2.0)
    hidden = target.score(state, torch.tensor([list(job.prompt[:-1])])).hidden
    props = []
    for mod in (module, again):
        drafter = wrap(mod)
        drafter.start(state, list(job.prompt))
        props.append(drafter.propose(DraftRequest(list(job.prompt), len(job.prompt), 4, state, hidden,
                                                  lambda x, p: x, True)))
    assert props[0].tokens == props[1].tokens and props[0].confidence == pytest.approx(props[1].confidence)


def _drop(key):
    return lambda c, w: w.pop(key)


def _set(key, value):
    return lambda c, w: c.__setitem__(key, value)


def _weight(key, value):
    return lambda c, w: w.__setitem__(key, value)


BAD = {
    "missing key": (_drop("midlayer.mlp.up_proj.weight"),
                    r"model\.safetensors: misses \['midlayer\.mlp\.up_proj\.weight'\]"),
    "unknown key": (_weight("midlayer.self_attn.q_norm.weight", torch.ones(16)), r"model\.safetensors: has keys"),
    "target width": (_set("target_hidden_size", 32), r"config\.json: reads 32-wide target states.*hidden size is 64"),
    "fc width": (_weight("fc.weight", torch.zeros(64, 96)), r"model\.safetensors: fc\.weight is \[64, 96\]"),
    "vocabulary": (_set("vocab_size", 300), r"config\.json: trained for a 300-token vocabulary.*264"),
    "maps": (_weight("t2d", torch.ones(264, dtype=torch.bool)), r"model\.safetensors: d2t and t2d disagree"),
    "head rows": (lambda c, w: w.__setitem__("lm_head.weight", w["lm_head.weight"][:-1]), r"lm_head\.weight"),
    "shapes": (_set("num_attention_heads", 8), r"model\.safetensors: the weights do not fit config\.json"),
    "layers": (_set("num_hidden_layers", 2), r"config\.json: num_hidden_layers 2"),
    "rope": (_set("rope_scaling", {"rope_type": "yarn", "factor": 4.0}), r"config\.json: rope scaling"),
    "fc_norm": (_set("fc_norm", True), r"fc_norm is True, the fc_norm weights are absent"),
    "aux ids": (_set("eagle_config", {"eagle_aux_hidden_state_layer_ids": [1, 2, 9]}), r"within 0\.\.3"),
    "architecture": (_set("architectures", ["PEagleDraftModel"]), r"unknown drafter format.*does not read"),
    "other architecture": (_set("architectures", ["LlamaForCausalLM"]), r"config\.json: unknown drafter format"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_checkpoints_give_clear_errors(models, tmp_path, case):
    target = models["qwen2-audio"].target
    cfg, w = write_specforge(tmp_path / "ok", target)
    mutate, message = BAD[case]
    mutate(cfg, w)
    save_dir(tmp_path / case, cfg, w)
    target.lm.aux_layers = ()
    with pytest.raises(ModelLoadError, match=message):
        load_drafter(str(tmp_path / case), target)
    assert target.lm.aux_layers == ()  # nothing attached


def test_unreadable_or_shallow_checkpoints(models, tmp_path):
    qwen2, omni = models["qwen2-audio"].target, models["qwen3-omni"].target
    write_specforge(tmp_path / "d", qwen2)
    (tmp_path / "d" / "config.json").write_text("{")
    with pytest.raises(ModelLoadError, match=r"config\.json: cannot read it"):
        load_drafter(str(tmp_path / "d"), qwen2)
    write_specforge(tmp_path / "e", qwen2)
    (tmp_path / "e" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: cannot read the weights"):
        load_drafter(str(tmp_path / "e"), qwen2)
    (tmp_path / "e" / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"e is not a drafter directory: missing \*\.safetensors \(SpecForge: or pytorch_model\.bin\)"):
        load_drafter(str(tmp_path / "e"), qwen2)
    write_specforge(tmp_path / "f", omni)  # no eagle_config: [1, 0, -1] on a 3-block target
    omni.lm.aux_layers = ()
    with pytest.raises(ModelLoadError, match=r"\[1, 0, -1\] for this 3-block target.*eagle_aux_hidden_state_layer_ids"):
        load_drafter(str(tmp_path / "f"), omni)
    narrow = write_specforge(tmp_path / "g", qwen2, hidden=48, own_embed=True)[1]
    del narrow["embed_tokens.weight"]
    save_dir(tmp_path / "g", json.loads((tmp_path / "g" / "config.json").read_text()), narrow)
    with pytest.raises(ModelLoadError, match=r"48-wide draft layer over a 64-wide target needs its own embed_tokens"):
        load_drafter(str(tmp_path / "g"), qwen2)
    assert qwen2.lm.aux_layers == () and omni.lm.aux_layers == ()
