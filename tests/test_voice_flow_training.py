"""scripts/voice/flow.py's one-step decoder and the voice yaml's own flow steps: a tiny DiT trained by the
regression objective decodes its training mel in one Euler step of the official solver; an official-structure yaml
keeps 10 steps and CFG 0.7, a voice's ``n_timesteps`` / ``inference_cfg_rate`` (written by assemble.py) are read."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from flow_fixtures import TINY_FLOW_YAML

from specli.errors import ModelLoadError
from specli.models.cosyvoice.yaml import read_hyperpyyaml
from specli.tts.acoustic.cfm import CFMSettings
from specli.tts.acoustic.flow import flow_config
from specli.tts.acoustic.flow_cv3 import DiTConfig, FlowCV3, FlowCV3Config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: scripts.voice

from scripts.voice import flow as T  # noqa: E402

_HEADER = "spk_embed_dim: 192\ntoken_frame_rate: 25\ntoken_mel_ratio: 2\nchunk_size: 25\n"
# one Euler step without guidance: what a voice trained as a one-step decoder puts in its yaml
ONE_STEP = CFMSettings(n_timesteps=1, inference_cfg_rate=0.0)


def _tiny_flow() -> FlowCV3:
    torch.manual_seed(0)
    dit = DiTConfig(dim=64, depth=2, heads=2, dim_head=32, ff_mult=2, static_chunk_size=16)
    return FlowCV3(FlowCV3Config(vocab_size=16, token_mel_ratio=T.RATIO, lookahead_channels=16, dit=dit, cfm=ONE_STEP))


def _clips() -> list[tuple[np.ndarray, np.ndarray]]:
    """Two clips whose mel frames are each token's own random frame, 4 a token (as the corpus's are)."""
    g = np.random.default_rng(0)
    table = g.normal(size=(16, 80)).astype(np.float32)  # [codes, 80]
    out = []
    for n in (10, 14):
        codes = g.integers(0, 16, n).astype(np.int64)
        out.append((codes, np.repeat(table[codes], T.RATIO, axis=0).astype(np.float16)))  # [4 n, 80]
    return out


def _one_step_error(flow: FlowCV3, clips) -> float:
    """Mean |mel - flow.inference| through the official solver (fixed noise, 1 step, no CFG), no prompt."""
    errs = []
    for codes, mel in clips:
        out = flow.inference(torch.from_numpy(codes)[None], torch.zeros(1, 0, dtype=torch.long),
                             torch.zeros(1, 0, 80), torch.zeros(1, 192))  # [1, 80, 4 n]
        errs.append(float((out[0].T - torch.from_numpy(mel.astype(np.float32))).abs().mean()))
    return float(np.mean(errs))


def test_regression_objective_trains_a_one_step_decoder() -> None:
    flow, clips = _tiny_flow().train(), _clips()
    before = _one_step_error(flow.eval(), clips)
    flow.train()
    opt = torch.optim.Adam(flow.parameters(), lr=3e-3)
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    recipe = T.Recipe(reg_frac=1.0)  # --objective regress: every row at t = 0, L1 on z + v(z, 0) - mel
    losses = []
    for _ in range(300):  # random noise each step; judged below at the inference's fixed noise
        loss = T.flow_loss(flow, T.collate(clips, [0, 1], 256, rng), recipe, False, gen, False)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    after = _one_step_error(flow.eval(), clips)
    assert np.mean(losses[-20:]) < 0.4 * np.mean(losses[:5])  # the loss falls
    # the mel's frames are N(0, 1): 1.25 before (noise + untrained), measured 0.29 after; predicting the average
    # frame would score ~0.8, so the one step reads the tokens
    assert before > 1.0 and after < 0.4


def test_recipe_rows_regress_from_t0_or_flow_match() -> None:
    """The regression rows' loss is the L1 of the one-step output; reg_frac 0 is upstream's CFM loss."""
    flow, clips = _tiny_flow().eval(), _clips()
    batch = T.collate(clips, [0, 1], 256, random.Random(0))
    tokens, x1, mask, cond = batch
    with torch.no_grad():
        reg = T.flow_loss(flow, batch, T.Recipe(reg_frac=1.0), False, torch.Generator().manual_seed(1), False)
        cfm = T.flow_loss(flow, batch, T.Recipe(), False, torch.Generator().manual_seed(1), False)
        gen = torch.Generator().manual_seed(1)  # the draws of flow_loss, in its order
        torch.rand(2, generator=gen), torch.rand(2, 1, 1, generator=gen)
        z = torch.randn(x1.shape, generator=gen)
        mu, spks = T.conditions(flow, tokens, mask)
        v = flow.decoder.estimator(z, mask, mu, torch.zeros(2), spks, cond)
        want = ((z + v - x1).abs() * mask).sum() / (mask.sum() * 80)
    assert float(reg) == pytest.approx(float(want), rel=1e-5)
    assert float(cfm) != pytest.approx(float(reg), rel=1e-2)


def test_official_yaml_keeps_ten_steps_and_the_voice_key_is_read(tmp_path: Path) -> None:
    from scripts.voice import assemble

    def cfm_of(text: str) -> CFMSettings:
        (tmp_path / "c.yaml").write_text(_HEADER + text)
        return flow_config(read_hyperpyyaml(tmp_path / "c.yaml")["flow"], "cosyvoice3").cfm

    official = cfm_of(TINY_FLOW_YAML)  # upstream's cfm_params: no n_timesteps key
    assert (official.n_timesteps, official.inference_cfg_rate) == (10, 0.7)
    voice = assemble.with_cfm_keys(TINY_FLOW_YAML, 1, 0.0)
    assert cfm_of(voice) == ONE_STEP
    assert cfm_of(assemble.with_cfm_keys(voice, 4, None)) == CFMSettings(n_timesteps=4, inference_cfg_rate=0.0)
    shipped = Path(__file__).resolve().parent.parent / "specli" / "voices" / "specli-en" / "cosyvoice3.yaml"
    assert "n_timesteps" in assemble.with_cfm_keys(shipped.read_text(encoding="utf-8"), 2, None)
    with pytest.raises(ValueError, match="at least one"):
        assemble.with_cfm_keys(TINY_FLOW_YAML, 0, None)
    for bad in ("2.5", "true", "two"):  # never truncated or guessed
        with pytest.raises(ModelLoadError, match="n_timesteps must be a whole number"):
            cfm_of(voice.replace("n_timesteps: 1", f"n_timesteps: {bad}"))


def test_assemble_writes_the_shipped_yaml_and_names_the_ratio_key_only_with_a_lexicon() -> None:
    """The yaml assemble.py writes for the shipped voice's shapes is the shipped file, byte for byte; a voice without
    a lexicon gets neither the phoneme ratio key nor its mention among specli's keys."""
    from scripts.voice import assemble

    shipped = Path(__file__).resolve().parent.parent / "specli" / "voices" / "specli-en" / "cosyvoice3.yaml"
    dit = {"dim": 256, "depth": 6, "heads": 4}
    phonemes = assemble.voice_yaml(256, 19683, 256, dit, phonemes=True)
    assert assemble.with_cfm_keys(phonemes, 1, 0.0) == shipped.read_text(encoding="utf-8")
    text = assemble.voice_yaml(256, 19683, 256, dit, phonemes=False)
    assert "min_token_text_ratio" not in text and "# max_piece_words.\n" in text


def test_a_flow_replaced_into_a_voice_brings_its_dit_shape_into_the_yaml(tmp_path: Path) -> None:
    """A flow grown deeper than the voice's (``flow --depth``) and assembled flow-only (``--from VOICE``) gets a yaml
    whose DiT depth is its own; nothing else in the yaml changes. A yaml with no DiT estimator is refused."""
    from scripts.voice import assemble

    shipped = Path(__file__).resolve().parent.parent / "specli" / "voices" / "specli-en" / "cosyvoice3.yaml"
    text = shipped.read_text(encoding="utf-8")
    deeper = assemble.with_dit_shape(text, {"dim": 256, "depth": 12, "heads": 4})
    changed = [(a, b) for a, b in zip(text.splitlines(), deeper.splitlines(), strict=True) if a != b]
    assert changed == [("            depth: 6", "            depth: 12")]
    (tmp_path / "c.yaml").write_text(_HEADER + assemble.with_dit_shape(TINY_FLOW_YAML, {"dim": 96, "depth": 5,
                                                                                        "heads": 3}))
    dit = flow_config(read_hyperpyyaml(tmp_path / "c.yaml")["flow"], "cosyvoice3").dit
    assert (dit.dim, dit.depth, dit.heads, dit.dim_head) == (96, 5, 3, 16)
    with pytest.raises(ValueError, match="one DiT estimator"):
        assemble.with_dit_shape(text.replace("cosyvoice.flow.DiT.dit.DiT", "cosyvoice.flow.other"), {})

    voice, out = tmp_path / "voice", tmp_path / "out"
    voice.mkdir()
    (voice / "cosyvoice3.yaml").write_text(text, encoding="utf-8")
    flow = {"model": {"w": torch.zeros(2)}, "config": {"dit": {"dim": 256, "depth": 12, "heads": 4},
                                                       "vocab_size": 19683}}
    assert not assemble.replace_flow(voice, flow, out, steps=None, cfg_rate=None)
    assert (out / "cosyvoice3.yaml").read_text(encoding="utf-8") == deeper
    assert (voice / "cosyvoice3.yaml").read_text(encoding="utf-8") == text  # the source voice untouched
    assert "flow.pt" in (out / "SHA256SUMS").read_text()


def test_a_flow_of_another_codebook_makes_a_flow_only_copy(tmp_path: Path) -> None:
    """A flow trained on another tokenizer's codes (3^10 against the voice's 3^9) replaced into a voice: the copy's
    yaml says the flow's codebook (and only there: the LM's speech_token_size stays), what speaks the voice's codes
    (LM, ONNX tokenizer, drafters, text tokenizer) is left out, the source is untouched; in place it is refused."""
    from scripts.voice import assemble

    shipped = Path(__file__).resolve().parent.parent / "specli" / "voices" / "specli-en" / "cosyvoice3.yaml"
    text = shipped.read_text(encoding="utf-8")
    voice, out = tmp_path / "voice", tmp_path / "out"
    (voice / "dflash").mkdir(parents=True)
    (voice / "CosyVoice-BlankEN").mkdir()
    (voice / "cosyvoice3.yaml").write_text(text, encoding="utf-8")
    for name in ("llm.pt", "speech_tokenizer_v3.onnx", "dflash/model.safetensors", "CosyVoice-BlankEN/vocab.json"):
        (voice / name).write_bytes(b"x")
    flow = {"model": {"w": torch.zeros(2)}, "config": {"dit": {"dim": 256, "depth": 6, "heads": 4},
                                                       "vocab_size": 59049}}
    assert assemble.replace_flow(voice, flow, out, steps=None, cfg_rate=None)
    new = (out / "cosyvoice3.yaml").read_text(encoding="utf-8")
    changed = [(a, b) for a, b in zip(text.splitlines(), new.splitlines(), strict=True) if a != b]
    assert changed == [("    vocab_size: 19683", "    vocab_size: 59049")]
    assert sorted(p.name for p in out.iterdir()) == ["SHA256SUMS", "cosyvoice3.yaml", "flow.pt"]
    assert (voice / "llm.pt").is_file() and (voice / "dflash" / "model.safetensors").is_file()
    assert (voice / "cosyvoice3.yaml").read_text(encoding="utf-8") == text
    with pytest.raises(SystemExit, match="flow-only copy goes to another --out"):
        assemble.replace_flow(voice, flow, voice, steps=None, cfg_rate=None)
    assert (voice / "llm.pt").is_file() and (voice / "cosyvoice3.yaml").read_text(encoding="utf-8") == text
    with pytest.raises(ValueError, match="one vocab_size line"):
        assemble.with_flow_codebook(text.replace("    vocab_size: 19683\n", ""), 59049)


def test_validation_clips_stay_out_of_the_round_trips_sentences(tmp_path: Path) -> None:
    corpus = tmp_path / "data"
    corpus.mkdir()
    rows = [f"{i:012x}\tSentence {i}.\t1.0" for i in range(300, 0, -1)]  # file order is not id order
    (corpus / "heldout.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    import argparse

    ap = argparse.ArgumentParser()
    T.add_arguments(ap)
    args = ap.parse_args([])
    args.corpus = corpus
    ids = T.validation_ids(args)
    assert ids == [f"{i:012x}" for i in range(100, 0, -1)]  # file order 200-299: never a ship / selection sentence
    args.val_first, args.val_clips = 250, 100
    with pytest.raises(SystemExit, match="no 100 held-out clips from the 250-th"):
        T.validation_ids(args)


def test_a_flow_grown_deeper_computes_the_same_function_and_its_copies_then_train() -> None:
    small = _tiny_flow()  # 2 blocks; trained weights have a non-zero adaLN modulation, as random ones do
    state = {k: v.clone() for k, v in small.state_dict().items()}
    big_state = T.grown(state, 4)
    assert T.dit_depth(big_state) == 4 and T.dit_depth(state) == 2
    dit = DiTConfig(dim=64, depth=4, heads=2, dim_head=32, ff_mult=2, static_chunk_size=16)
    big = FlowCV3(FlowCV3Config(vocab_size=16, token_mel_ratio=T.RATIO, lookahead_channels=16, dit=dit, cfm=ONE_STEP))
    big.load_state_dict(big_state)  # strict: every key of a 4-block flow, nothing else
    g = torch.Generator().manual_seed(1)
    x, mu, cond = (torch.randn(2, 80, 24, generator=g) for _ in range(3))
    mask, t, spks = torch.ones(2, 1, 24), torch.tensor([0.0, 0.6]), torch.randn(2, 80, generator=g)
    with torch.no_grad():
        want = small.eval().decoder.estimator(x, mask, mu, t, spks, cond)
        got = big.eval().decoder.estimator(x, mask, mu, t, spks, cond)
    assert torch.allclose(got, want, atol=1e-5)  # the copies are the identity at the start
    copy = T.BLOCKS + "1." + T.ADALN + "weight"
    assert not big_state[copy].any() and big_state[T.BLOCKS + "0." + T.ADALN + "weight"].any()
    assert torch.equal(big_state[T.BLOCKS + "3.attn.to_q.weight"], state[T.BLOCKS + "1.attn.to_q.weight"])
    big.train()  # a copy's gates get a gradient: training opens it
    big.decoder.estimator(x, mask, mu, t, spks, cond).square().mean().backward()
    assert big.get_parameter(copy).grad.abs().sum() > 0
    with pytest.raises(ValueError, match="not a multiple"):
        T.grown(state, 3)
    with pytest.raises(ValueError, match="no DiT blocks"):
        T.grown({"llm_decoder.weight": torch.zeros(4, 4)}, 12)


def test_the_flow_stage_grows_an_init_with_fewer_blocks_and_keeps_one_as_deep(tmp_path: Path) -> None:
    from scripts.voice import build

    init = tmp_path / "flow.pt"
    torch.save(_tiny_flow().state_dict(), init)
    args = build.parser("flow").parse_args(["flow", "--depth", "2"])
    args.run, args.init = tmp_path / "run", init
    assert build.grown_init(args) == init  # as deep as asked: used as it is
    args.depth = 4
    path = build.grown_init(args)
    assert path == tmp_path / "run" / "init.pt" and T.dit_depth(torch.load(path, weights_only=True)) == 4
