"""scripts/voice speech tokenizer: cheap offline checks (no corpus, no bundled-model weights needed)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: scripts.voice

from scripts.voice.tokenizer import graph as G  # noqa: E402

soxr = pytest.importorskip("soxr")


def _speechlike(seconds: float, seed: int, rate: int = 22050) -> np.ndarray:
    """Harmonics with a moving pitch plus noise bursts: energy across the whole 0-8 kHz range."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 120 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 40))
    env = 0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)
    return (0.1 * env * voiced + 0.02 * rng.standard_normal(len(t))).astype(np.float32)


def test_conversion_matrix_against_filterbanks():
    from specli.tts.acoustic.features import whisper_log_mel

    m = G.conversion_matrix()
    assert m.shape == (80, 128) and m.dtype == np.float32 and (m >= 0).all()
    f128, f80 = G.slaney_16k(128), G.slaney_16k(80)
    rel = np.abs(m @ f128 - f80).sum() / f80.sum()
    assert rel < 0.06  # measured 0.054: the 128 triangles cannot rebuild the 80 exactly
    audio = soxr.resample(_speechlike(3.0, 0), 22050, 16000, quality="HQ").astype(np.float32)
    x128, x80 = whisper_log_mel(audio, 128), whisper_log_mel(audio, 80)
    err = (G.convert_log_mel(x128, torch.from_numpy(m)) - x80).abs()
    assert err.mean() < 0.02 and err.max() < 0.25  # 1.0 = 40 dB; mean 0.009 on piper speech


@pytest.mark.parametrize("preset", sorted(G.LEVEL_PRESETS))
def test_fsq_index_round_trip(preset):
    torch.manual_seed(0)
    fsq = G.FSQ(G.LEVEL_PRESETS[preset], dim_in=16)
    x = torch.randn(2000, 16) * 3
    idx = fsq.indices(x)
    assert idx.min() >= 0 and idx.max() < fsq.size
    assert torch.equal(fsq.codes_from_indices(idx), fsq.codes(x, quantise=True))
    grids = torch.meshgrid(*[torch.arange(n) - n // 2 for n in fsq.levels], indexing="ij")
    digits = torch.stack([g.reshape(-1) for g in grids], -1)  # every code once
    all_idx = ((digits + fsq.half_width.long()) * fsq.basis).sum(-1)
    assert torch.equal(torch.sort(all_idx).values, torch.arange(fsq.size))
    assert torch.equal(fsq.digits(all_idx), digits)
    assert (fsq.codes(x, quantise=True).abs() <= 1).all()


@pytest.mark.parametrize("seconds", [0.05, 0.5, 1.0, 2.9, 7.3, 19.9, 29.5])
def test_n_tokens_matches_padded_audio(seconds):
    from specli.tts.acoustic.features import prompt_mel, whisper_log_mel

    audio = _speechlike(seconds, 1)
    padded = np.pad(audio, (0, -len(audio) % G.TOKEN_HOP_22K))
    n = len(padded) // G.TOKEN_HOP_22K
    a16 = soxr.resample(padded, 22050, 16000, quality="HQ").astype(np.float32)
    frames = whisper_log_mel(a16, 128).shape[2]
    assert G.n_tokens(frames) == n
    assert int(G.n_tokens_graph(torch.tensor([frames], dtype=torch.int32))) == n
    assert prompt_mel(padded, 8000, n_fft=1024, hop=256, sample_rate=22050).shape[2] == 4 * n


def test_interpolation_reads_the_right_frames():
    h = torch.arange(40, dtype=torch.float32).reshape(1, 40, 1)
    out = G.interpolate_tokens(h, torch.tensor([17]))[0, :, 0]
    pos = torch.clamp((torch.arange(17) + 0.5) * G.ENC_PER_TOKEN, max=39.0)
    assert torch.allclose(out, pos, atol=1e-5)


def _tiny_graph(levels: tuple[int, ...], taps: tuple[int, ...] = (2,)) -> G.TokenizerGraph:
    torch.manual_seed(0)
    enc = G.Encoder(d=64, heads=2, ffn=128, n_layers=2, positions=1500, taps=taps)
    with torch.no_grad():
        enc.embed_positions.normal_(0, 0.1)
    return G.TokenizerGraph(enc.eval(), G.conversion_matrix(), G.FSQ(levels, dim_in=64 * len(taps))).eval()


@pytest.mark.parametrize(("quant", "taps"), [("none", (2,)), ("weights", (2,)), ("none", (1, 2))])
def test_exported_onnx_follows_frontend_contract(tmp_path, quant, taps):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from scripts.voice.tokenizer import export as X

    from specli.tts.acoustic.features import whisper_log_mel
    from specli.tts.acoustic.frontend import SpeechTokenizer

    graph = _tiny_graph(G.LEVEL_PRESETS["3^6"], taps)  # (1, 2): both layers' outputs concatenated
    path = tmp_path / "speech_tokenizer_v3.onnx"
    info = X.export(graph, path, ["tokens"], quant=quant)
    assert info["int8_matmuls"] == (0 if quant == "none" else 2 * 6 + 3)
    tokenizer = SpeechTokenizer(path)  # the frontend's signature check
    for seconds in (0.6, 3.3, 11.0):
        audio = _speechlike(seconds, 2)
        padded = np.pad(audio, (0, -len(audio) % G.TOKEN_HOP_22K))
        a16 = soxr.resample(padded, 22050, 16000, quality="HQ").astype(np.float32)
        mel = whisper_log_mel(a16, 128)
        tokens = tokenizer(mel)
        assert tokens.dtype == torch.int64 and tokens.shape == (1, len(padded) // G.TOKEN_HOP_22K)
        assert 0 <= int(tokens.min()) and int(tokens.max()) < 729
        with torch.no_grad():
            ref = graph(mel, torch.tensor([mel.shape[2]], dtype=torch.int32)).long()
        agree = (ref == tokens).float().mean().item()
        assert agree == 1.0 if quant == "none" else agree > 0.8


def test_int8_weights_writes_the_same_bytes_whatever_the_hash_seed(tmp_path):
    """The tokenizer's sha256 is its identity (the tokens stage checks it): the int8 pass must not order its
    DequantizeLinear nodes by set hashing, which changes with each process's PYTHONHASHSEED."""
    pytest.importorskip("onnx")
    import subprocess

    from scripts.voice.tokenizer import export as X

    fp32 = tmp_path / "fp32.onnx"
    X.export_fp32(_tiny_graph(G.LEVEL_PRESETS["3^6"]), fp32, ["tokens"])
    code = "import sys; from pathlib import Path; from scripts.voice.tokenizer.export import int8_weights; " \
           "int8_weights(Path(sys.argv[1]), Path(sys.argv[2]))"
    root = Path(__file__).resolve().parent.parent
    for seed in ("1", "2", "3"):  # the process's hash seed is the subject
        subprocess.run([sys.executable, "-c", code, str(fp32), str(tmp_path / f"int8-{seed}.onnx")], check=True,
                       cwd=root, env={**os.environ, "PYTHONHASHSEED": seed})
    assert len({(tmp_path / f"int8-{s}.onnx").read_bytes() for s in ("1", "2", "3")}) == 1


def test_the_phoneme_cache_is_rewritten_whole_so_two_fillers_leave_whole_lines(tmp_path, monkeypatch):
    from scripts.voice.tokenizer import data as D

    cache = tmp_path / "phonemes.tsv"

    def ipa(text: str) -> str:  # espeak is not the subject; another run adds its line while this one works
        if not (cache.is_file() and "0000000000ff" in cache.read_text(encoding="utf-8")):
            with cache.open("a", encoding="utf-8") as fh:
                fh.write("0000000000ff\tlater\n")
        return text.lower().replace(" ", "ˈ")

    monkeypatch.setattr(D, "espeak_ipa", ipa)
    clips = [D.Clip(f"{i:012x}", f"Line {i} here", "train", 1.0) for i in range(5)]
    first = D.phonemize(clips[:3], cache)
    assert first == {c.id: c.text.lower().replace(" ", "ˈ") for c in clips[:3]}
    assert D.read_phonemes(cache) == {**first, "0000000000ff": "later"}  # the other run's line kept
    both = D.phonemize(clips, cache)  # two more; the three known are not redone
    assert set(both) == {c.id for c in clips} | {"0000000000ff"}
    assert D.read_phonemes(cache) == both and all("\t" in ln for ln in cache.read_text(encoding="utf-8").splitlines())


def test_several_tap_layers_are_concatenated_before_the_fsq(tmp_path):
    from scripts.voice.tokenizer import probe as P
    from scripts.voice.tokenizer import store as S
    from scripts.voice.tokenizer.train import parse_layer

    assert parse_layer("6") == 6 and parse_layer("4,6") == [4, 6]  # one tap stays an int, as runs always were
    assert G.tap_layers(6) == (6,) and G.tap_layers([4, 6]) == (4, 6)
    for bad in ([6, 4], [4, 4], [0], []):
        with pytest.raises(ValueError, match="distinct, ascending"):
            G.tap_layers(bad)
    torch.manual_seed(0)
    enc = G.Encoder(d=64, heads=2, ffn=128, n_layers=2, positions=1500, taps=(1, 2))
    fsq = G.FSQ(G.LEVEL_PRESETS["3^6"], dim_in=128)
    graph = G.TokenizerGraph(enc.eval(), G.conversion_matrix(), fsq).eval()
    mel = torch.randn(1, 128, 333) * 0.3
    length = torch.tensor([333], dtype=torch.int32)
    with torch.no_grad():
        low, high = graph.features(mel, length)  # [1, n, 64] each
        tokens = graph(mel, length)
        assert torch.equal(tokens.long(), fsq.indices(torch.cat([low, high], -1)))
        assert not torch.equal(tokens.long(), fsq.indices(torch.cat([high, low], -1)))  # the order matters
    rows = [("a", {"L4": np.full((3, 512), 1.0), "L6": np.full((3, 512), 2.0)}, np.zeros((12, 80))),
            ("b", {"L4": np.full((2, 512), 3.0), "L6": np.full((2, 512), 4.0)}, np.zeros((8, 80)))]
    with pytest.raises(SystemExit, match=r"holds encoder layers \[\], not \[4, 6\]"):
        S.check_taps(tmp_path, (4, 6))  # no features yet
    S.check_meta(tmp_path, {"onnx_sha256": "x", "taps": [4, 6]})
    S.check_taps(tmp_path, (4, 6))
    with pytest.raises(SystemExit, match=r"holds encoder layers \[4, 6\], not \[5\]: .*--taps 4,5,6"):
        S.check_taps(tmp_path, (4, 5))
    S.write_shard(tmp_path, rows)
    fs = S.load_features(tmp_path, (4, 6), {"b"})
    assert fs.ids == ["b"] and fs.feats.shape == (2, 1024)
    assert (fs.feats[:, :512] == 3.0).all() and (fs.feats[:, 512:] == 4.0).all()
    assert S.load_features(tmp_path, (6,)).feats.shape == (5, 512)
    cfg = {"layer": [4, 6], "levels": [3] * 6, "quantise": True, "hidden": 16}
    assert P.from_config(cfg, 10).fsq.proj.in_features == 1024
    assert P.from_config({**cfg, "layer": 4}, 10).fsq.proj.in_features == 512
