"""EAGLE head distillation recipe: translate-task labels, feature noise / dropout, the label plan."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ES_CLIPS
from specli.core.job import DecodeJob
from specli.distill.data import load_windows, read_manifest, window_record
from specli.distill.train import TrainOptions, dropped, make_batch, noisy, train, unrolled_loss
from specli.asr.drafters.eagle_head import EagleConfig, SpeechDraftHead, load_head
from specli.core.greedy import greedy_decode
from tiny_models import EOT, NO_TS, SOT, tiny_rules, tiny_target, window

REPO = Path(__file__).resolve().parents[1]
TARGET = tiny_target(0)
MODEL = SimpleNamespace(target=TARGET, name="tiny", special=SimpleNamespace(
    eot=EOT, no_timestamps=NO_TS, sot=SOT, no_speech=None, timestamp_begin=36, suppress_tokens=(5,),
    begin_suppress_tokens=(EOT,), max_initial_timestamp_index=4))


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _windows(seeds=(1, 2, 3)) -> list[dict]:
    out = []
    for s in seeds:
        state = window(TARGET, s)
        prompt = [SOT, 7 + s, NO_TS]
        res = greedy_decode(TARGET, state, DecodeJob(prompt, tiny_rules(False), EOT, TARGET.dims.text_ctx - 3))
        tokens = prompt + res.tokens + ([EOT] if res.finished else [])
        out.append(window_record(SimpleNamespace(target=TARGET), state.audio_features[0], tokens, len(prompt)))
    return out


@pytest.mark.parametrize("bad", [{"feature_noise": -0.1}, {"dropout": 1.0}, {"dropout": -0.01},
                                 {"feature_noise": float("nan")}, {"precision": "float16"}])
def test_train_options_reject_bad_regularisers(bad):
    with pytest.raises(ValueError):
        TrainOptions(**bad)


def test_regularisers_are_identity_when_off_and_seeded_when_on():
    h = torch.randn(3, 5, 64)
    assert noisy(h, 0.0) is h and dropped(h, 0.0) is h
    a = noisy(h, 0.1, torch.Generator().manual_seed(3))
    assert torch.equal(a, noisy(h, 0.1, torch.Generator().manual_seed(3)))
    assert not torch.equal(a, noisy(h, 0.1, torch.Generator().manual_seed(4)))
    d = dropped(h, 0.25, torch.Generator().manual_seed(3))
    assert torch.equal(d, dropped(h, 0.25, torch.Generator().manual_seed(3)))


@settings(max_examples=20, deadline=None)
@given(scale=st.floats(0.01, 100.0), std=st.floats(0.01, 0.5), seed=st.integers(0, 1000))
def test_feature_noise_is_relative_to_each_rows_rms(scale, std, seed):
    h = torch.randn(64, 512, generator=torch.Generator().manual_seed(seed)) * scale
    rel = (noisy(h, std, torch.Generator().manual_seed(seed + 1)) - h) / h.pow(2).mean(-1, keepdim=True).sqrt()
    assert abs(float(rel.std()) - std) < 0.05 * std  # 32k draws: the std is within 5%
    assert abs(float(rel.mean())) < 0.05 * std


@settings(max_examples=20, deadline=None)
@given(p=st.floats(0.05, 0.6), seed=st.integers(0, 1000))
def test_dropout_drops_a_fraction_p_and_keeps_the_expectation(p, seed):
    x = torch.ones(200, 256)
    y = dropped(x, p, torch.Generator().manual_seed(seed))
    zero = float((y == 0).float().mean())
    assert abs(zero - p) < 0.02  # 51k draws
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / (1 - p)))
    assert abs(float(y.mean()) - 1.0) < 0.05


def test_unrolled_loss_with_regularisers_differs_but_learns():
    torch.manual_seed(0)
    head = SpeechDraftHead(EagleConfig.for_target(TARGET, "tiny"), TARGET)
    batch = make_batch(_windows(), unroll=7, max_starts=64)
    plain, _ = unrolled_loss(head, batch, 0.8)
    reg, per_step = unrolled_loss(head, batch, 0.8, 0.1, 0.2, torch.Generator().manual_seed(0))
    again, _ = unrolled_loss(head, batch, 0.8, 0.1, 0.2, torch.Generator().manual_seed(0))
    assert len(per_step) == 7 and float(reg) != float(plain) and float(reg) == float(again)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    losses = []
    for step in range(6):
        loss, _ = unrolled_loss(head, batch, 0.8, 0.05, 0.1, torch.Generator().manual_seed(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(unrolled_loss(head, batch, 0.8)[0]))  # measured without the regularisers
    assert losses[-1] < float(plain) * 0.9, losses


def test_train_with_noise_and_dropout_saves_a_head_in_the_unchanged_format(tmp_path):
    windows = _windows()
    ref = train(windows, MODEL, tmp_path / "plain", TrainOptions(steps=2, batch=2, draft_vocab=20, feature_noise=0,
                                                                 dropout=0))
    reg = train(windows, MODEL, tmp_path / "reg", TrainOptions(steps=2, batch=2, draft_vocab=20, feature_noise=0.1,
                                                               dropout=0.2), windows[:1])
    assert ref.steps == reg.steps == 2 and reg.val_acceptance is not None and reg.val_acceptance >= 1.0
    plain, noisy_head = load_head(tmp_path / "plain", TARGET), load_head(tmp_path / "reg", TARGET)
    assert noisy_head.state_dict().keys() == plain.state_dict().keys()
    for key, value in plain.state_dict().items():
        assert noisy_head.state_dict()[key].shape == value.shape and noisy_head.state_dict()[key].dtype == value.dtype
    meta = {d: json.loads((tmp_path / d / "config.json").read_text()) for d in ("plain", "reg")}
    assert meta["reg"]["config"] == meta["plain"]["config"] and meta["reg"]["format"] == meta["plain"]["format"]
    assert meta["reg"]["training"]["feature_noise"] == 0.1 and meta["reg"]["training"]["dropout"] == 0.2
    assert not any(isinstance(m, torch.nn.Dropout) for m in noisy_head.modules())


def test_bfloat16_precision_trains_float32_weights_that_learn(tmp_path):
    """--precision bfloat16: the steps run under CPU autocast, the head's weights and AdamW state stay float32,
    the loss falls as in float32, and the head is saved in the unchanged format with the precision recorded."""
    windows = _windows()
    opts = dict(epochs=12, steps=12, batch=3, draft_vocab=20, feature_noise=0, dropout=0, lr=3e-3, warmup=1)
    torch.manual_seed(0)  # the fusion layers' initialisation
    plain = train(windows, MODEL, tmp_path / "fp32", TrainOptions(**opts))
    torch.manual_seed(0)
    half = train(windows, MODEL, tmp_path / "bf16", TrainOptions(**opts, precision="bfloat16"))
    assert half.steps == plain.steps == 12 and half.last_loss != plain.last_loss  # bf16 matmuls: other roundings
    head = load_head(tmp_path / "bf16", TARGET)
    assert all(p.dtype == torch.float32 for p in head.parameters())
    first = float(unrolled_loss(SpeechDraftHead.for_target(TARGET, "tiny", head.vocab_ids).init_from_target(TARGET),
                                make_batch(windows, 7, 64), 0.8)[0])
    learned = float(unrolled_loss(head, make_batch(windows, 7, 64), 0.8)[0])
    assert learned < 0.8 * first and abs(half.last_loss - plain.last_loss) < 0.25 * plain.last_loss + 0.1
    meta = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert meta["training"]["precision"] == "bfloat16"


def test_init_fine_tunes_a_trained_head_with_its_own_draft_vocabulary(tmp_path):
    """--init HEAD: training starts from that head's weights and keeps its draft vocabulary (whatever
    --draft-vocab says); without it a fresh head starts from the target's last layer."""
    windows = _windows()
    torch.manual_seed(0)
    train(windows, MODEL, tmp_path / "first", TrainOptions(epochs=4, steps=4, batch=3, draft_vocab=20, lr=3e-3))
    first = load_head(tmp_path / "first", TARGET)
    again = train(windows, MODEL, tmp_path / "again", TrainOptions(steps=1, batch=3, draft_vocab=0, lr=1e-12,
                                                                   init=str(tmp_path / "first")))
    tuned = load_head(tmp_path / "again", TARGET)
    assert torch.equal(tuned.vocab_ids, first.vocab_ids) and again.steps == 1
    for key, value in first.state_dict().items():
        assert torch.allclose(tuned.state_dict()[key].float(), value.float(), atol=1e-3), key
    fresh = train(windows, MODEL, tmp_path / "fresh", TrainOptions(steps=1, batch=3, draft_vocab=0, lr=1e-12))
    assert load_head(tmp_path / "fresh", TARGET).vocab_ids.numel() != first.vocab_ids.numel() and fresh.steps == 1
    assert json.loads((tmp_path / "again" / "config.json").read_text())["training"]["init"] == str(tmp_path / "first")


def _cli(*args):
    from click.testing import CliRunner

    from specli.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_cli_rejects_bad_regularisers_and_english_only_translate(tmp_path):
    (tmp_path / "d").mkdir()
    res = _cli("distill", "train", tmp_path / "d", "--preset", "whisper-tiny.en-ar", "--dropout", "1")
    assert res.exit_code == 2 and "--dropout" in res.output
    res = _cli("distill", "train", tmp_path / "d", "--preset", "whisper-tiny.en-ar", "--feature-noise", "-1")
    assert res.exit_code == 2 and "--feature-noise" in res.output
    res = _cli("distill", "data", ES_CLIPS[0], "--preset", "whisper-tiny.en-ar", "--task", "translate",
               "--out", tmp_path / "x")
    assert res.exit_code == 2 and "translate" in res.output and not (tmp_path / "x").exists()
    res = _cli("distill", "data", ES_CLIPS[0], "--preset", "whisper-base-ar", "--language", "klingon",
               "--out", tmp_path / "y")
    assert res.exit_code == 2 and "klingon" in res.stderr and not (tmp_path / "y").exists()


def test_distill_data_translate_labels_are_the_targets_translate_decode(tmp_path, whisper_models, one_torch_thread):
    from specli.io.audio import iter_audio_chunks
    from specli.asr.windows import TranscribeOptions, transcribe_stream

    model = whisper_models("whisper-base")  # float32, as labelled with --dtype float32
    clip = min(ES_CLIPS, key=lambda p: p.stat().st_size)
    res = _cli("distill", "data", clip, "--preset", "whisper-base-ar", "--task", "translate", "--language", "Spanish",
               "--no-timestamps", "--dtype", "float32", "-q", "--out", tmp_path / "tr")
    assert res.exit_code == 0, res.output
    w = load_windows(tmp_path / "tr")[0]
    sp = model.special
    prompt = w["tokens"][: int(w["plen"])].tolist()
    assert prompt[-3:] == [sp.languages["es"], sp.translate, sp.no_timestamps]
    entry = next(iter(read_manifest(tmp_path / "tr")["done"].values()))
    assert (entry["task"], entry["language"], entry["timestamps"]) == ("translate", "es", False)
    # on-policy: the stored tokens are what `translate` itself decodes
    opts = TranscribeOptions(task="translate", language="es", timestamps=False)
    text = "".join(s.text for s in transcribe_stream(model, iter_audio_chunks(clip), opts).segments).strip()
    labelled = model.tokenizer.decode([t for t in w["tokens"][int(w["plen"]):].tolist() if t < sp.eot]).strip()
    assert labelled == text and labelled.isascii()


def test_label_plan_mixes_modes_in_proportion_and_never_labels_held_out_clips_for_training(tmp_path, capsys):
    plan = _script("distill_plan")
    layout = {"train/espeak": 300, "train/espeak-es": 300, "train/asterisk-ru": 40, "train-extra/festival": 30,
              "heldout-in/espeak": 5, "heldout-out/piper": 3, "heldout-lang/espeak-it": 4, "heldout-lang/prompt-fr": 2}
    for folder, n in layout.items():
        (tmp_path / folder).mkdir(parents=True)
        for i in range(n):
            (tmp_path / folder / f"{Path(folder).name}-{i:04d}.wav").touch()
    jobs = plan.val_jobs(tmp_path, True) + plan.train_jobs(tmp_path, 40, 70, 20, True)
    val = {j[0]: j for j in jobs if j[0].startswith("val/")}
    assert set(val) == {"val/heldout-in", "val/heldout-out", "val/espeak-it.transcribe", "val/espeak-it.translate",
                        "val/prompt-fr.transcribe", "val/prompt-fr.translate"}
    assert val["val/prompt-fr.translate"][1:4] == ("translate", "ts", "fr")
    vals = [j for j in jobs if j[0].startswith("val/")]  # chunks of 3, round-robin: every set's first chunk first
    assert [j[4] for j in vals[:6]] == ["v000"] * 6 and vals[6][:1] + vals[6][4:5] == ("val/heldout-in", "v001")
    assert sum(len(j[5]) for j in vals if j[0] == "val/heldout-in") == 5
    trained = [c for j in jobs if not j[0].startswith("val/") for c in j[5]]
    assert len(trained) == len(set(trained)) == 670 and not any("heldout" in str(c) for c in trained)
    ts = sum(len(j[5]) for j in jobs if not j[0].startswith("val/") and j[2] == "ts")
    assert 0.62 < ts / 670 < 0.78
    foreign = [j for j in jobs if j[3] != "en" and not j[0].startswith("val/")]
    tr = sum(len(j[5]) for j in foreign if j[1] == "translate") / sum(len(j[5]) for j in foreign)
    assert 0.13 < tr < 0.27
    assert all(j[1] == "transcribe" for j in jobs if j[3] == "en")
    for j in foreign:  # the decode mode is a function of the clip's path, not of the job order
        h = zlib.crc32(f"{j[5][0].parent.name}/{j[5][0].name}".encode())
        assert j[1] == ("translate" if (h // 100) % 100 < 20 else "transcribe")
    first = [j[0] for j in jobs if not j[0].startswith("val/")][:5]
    assert len({f.split(".")[0] for f in first}) >= 4  # round-robin: the first chunks span the sources
    english = plan.val_jobs(tmp_path, False) + plan.train_jobs(tmp_path, 40, 70, 20, False)
    assert {j[3] for j in english} == {"en"} and {j[1] for j in english} == {"transcribe"}
    sys.argv = ["distill_plan", str(tmp_path), "--english-only"]
    plan.main()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(english) and all(len(line.split("\t")) == 6 for line in lines)


def test_foreign_text_filter_and_held_out_core_prompts():
    audio = _script("make_distill_audio")
    assert audio.FOREIGN_CLEAN.match("¿Qué tal, amigo? Жизнь прекрасна.")
    assert not audio.FOREIGN_CLEAN.match("Il 1984 fu un anno") and not audio.FOREIGN_CLEAN.match("a_b c")
    if not (audio.ASTERISK / audio.CORE_VOICES["es"]).is_dir():
        pytest.skip("asterisk-core-sounds-es-wav is not installed")
    for lang in ("es", "fr"):
        fit, held = audio.core_prompts(lang, 0)
        assert held and not set(fit) & set(held)
        assert not any(f.name in audio.SAMPLE_NAMES for f in fit)  # samples/ clips are never trained on


def test_heldout_only_writes_the_same_held_out_clips_as_a_full_run(tmp_path):
    """--heldout-only (rebuilding the benchmark sets on a fresh machine) consumes the training texts without
    synthesising them, so every held-out clip is made from the same texts / recordings as in a full run, and
    byte for byte the same where the engine is deterministic (piper draws its own noise)."""
    import shutil

    audio = _script("make_distill_audio")
    tools = [shutil.which("espeak-ng"), shutil.which("text2wave"), importlib.util.find_spec("piper"),
             (audio.ASTERISK / audio.CORE_VOICES["en"]).is_dir(), audio.POCKETSPHINX.is_dir()]
    if not all(tools):
        pytest.skip("espeak-ng, festival, piper-tts, asterisk-core-sounds-en-wav and pocketsphinx-testdata needed")
    counts = ["--espeak", "1", "--festival", "1", "--heldout", "1", "--languages", "en", "--clip-seconds", "6"]
    for out, extra in ((tmp_path / "full", []), (tmp_path / "held", ["--heldout-only"])):
        subprocess.run([sys.executable, str(Path(audio.__file__)), "--out", str(out), *counts, *extra],
                       check=True, capture_output=True, timeout=240)
    assert not (tmp_path / "held" / "train").exists() and (tmp_path / "full" / "train").is_dir()
    held = sorted(p.relative_to(tmp_path / "held") for p in (tmp_path / "held").rglob("*.wav"))
    full = sorted(p.relative_to(tmp_path / "full") for p in (tmp_path / "full").rglob("heldout-*/**/*.wav"))
    assert held == full and {p.parts[0] for p in held} == {"heldout-in", "heldout-out"}
    assert all((tmp_path / "held" / p).read_bytes() == (tmp_path / "full" / p).read_bytes()
               for p in held if "piper" not in p.parts)

    def sources(path: Path) -> set[str]:
        return {line for line in path.read_text().splitlines() if line.startswith("heldout-")}

    assert sources(tmp_path / "held" / "sources-heldout.tsv") == sources(tmp_path / "full" / "sources.tsv")


def test_distill_eval_reports_acceptance_per_directory(tmp_path, one_torch_thread):
    from conftest import EN_CLIPS

    clip = min(EN_CLIPS, key=lambda p: p.stat().st_size)
    for mode in ("--timestamps", "--no-timestamps"):
        res = _cli("distill", "data", clip, "--preset", "whisper-tiny.en-ar", mode, "--dtype", "float32", "-q",
                   "--out", tmp_path / mode)
        assert res.exit_code == 0, res.output
    res = _cli("distill", "eval", tmp_path / "--timestamps", tmp_path / "--no-timestamps", "--preset",
               "whisper-tiny.en-ar", "--head", "whisper-tiny.en-eagle", "--dtype", "float32", "--windows", 1)
    assert res.exit_code == 0, res.output
    lines = [line.split("\t") for line in res.output.strip().splitlines()]
    assert lines[0] == ["directory", "windows", "acceptance", "mismatched"] and len(lines) == 3
    for row in lines[1:]:
        assert row[1] == "1" and float(row[2]) >= 1.0 and row[3] == "0"  # lossless: the labels' own tokens
    res = _cli("distill", "train", tmp_path / "--timestamps", "--preset", "whisper-tiny.en-ar", "--dtype", "float32",
               "--val", tmp_path / "--timestamps", "--val", tmp_path / "--no-timestamps", "--val-windows", 2,
               "--steps", 1, "--batch", 1, "--draft-vocab", 2000, "--feature-noise", 0.1, "--dropout", 0.2,
               "--out", tmp_path / "head")
    assert res.exit_code == 0, res.output
    assert "on 2 window(s); 0 decoded differently" in res.output  # one window of each --val directory
    training = json.loads((tmp_path / "head" / "config.json").read_text())["training"]
    assert (training["feature_noise"], training["dropout"]) == (0.1, 0.2)
    res = _cli("distill", "eval", tmp_path / "--timestamps", "--preset", "whisper-tiny.en-ar")
    assert res.exit_code == 2 and "--head" in res.stderr


def test_interleave_takes_each_validation_directory_in_turn():
    from specli.commands.distill import interleave

    assert interleave([[1, 2, 3], ["a"], [], [True, False]]) == [1, "a", True, 2, False, 3]
    assert interleave([]) == []
