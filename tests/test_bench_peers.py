"""Bench peers: ``--peers`` specs with a CTranslate2 compute type, and faster-whisper's batched pipeline
decoding several clips together (its texts mapped back to the right clip)."""

from __future__ import annotations

import pytest
import torch

from conftest import EN_CLIPS
from specli.io.audio import load_audio
from specli.bench.peers import (COMPUTE_TYPES, BenchError, FasterWhisperBatchedPeer, FasterWhisperPeer, PeerSpec,
                                PeerTarget, parse_peer, peer_compute_type)
from specli.bench.runner import BenchOptions
from specli.bench.wer import normalize


def test_peer_specs_parse_with_an_optional_compute_type():
    assert parse_peer("hf") == PeerSpec("hf")
    assert parse_peer("faster-whisper") == PeerSpec("faster-whisper")
    assert parse_peer("faster-whisper:int8") == PeerSpec("faster-whisper", "int8")
    assert parse_peer(" faster-whisper-batched:float32 ") == PeerSpec("faster-whisper-batched", "float32")
    assert parse_peer("faster-whisper:int8").name == "faster-whisper:int8"
    assert parse_peer("faster-whisper").name == "faster-whisper"
    assert parse_peer("faster-whisper-batched").batched and not parse_peer("faster-whisper:int8").batched
    for ct in COMPUTE_TYPES:
        assert parse_peer(f"faster-whisper:{ct}").compute_type == ct


@pytest.mark.parametrize("spec, message", [
    ("nope", "unknown peer"), ("faster_whisper", "unknown peer"), ("hf:int8", "takes no compute type"),
    ("faster-whisper:int9", "compute type must be one of"), ("faster-whisper:", "compute type must be one of"),
])
def test_bad_peer_specs_are_refused(spec, message):
    with pytest.raises(BenchError, match=message):
        parse_peer(spec)


def test_bench_options_validate_peers_and_batch_sizes():
    assert BenchOptions(("whisper-tiny.en-ar",), peers=("faster-whisper", "faster-whisper:int8")).peers
    with pytest.raises(BenchError, match="given twice"):
        BenchOptions(("whisper-tiny.en-ar",), peers=("faster-whisper:int8", "faster-whisper:int8"))
    with pytest.raises(BenchError, match="compute type"):
        BenchOptions(("whisper-tiny.en-ar",), peers=("faster-whisper:fp8",))
    assert BenchOptions(("whisper-tiny.en-ar",), batch_sizes=(1, 2, 4)).batch_sizes == (1, 2, 4)
    for bad in ((2, 1), (0, 1), (1, 1)):
        with pytest.raises(BenchError, match="batch sizes"):
            BenchOptions(("whisper-tiny.en-ar",), batch_sizes=bad)


def test_compute_type_default_follows_the_target_where_ctranslate2_has_it():
    import ctranslate2

    supported = ctranslate2.get_supported_compute_types("cpu")
    assert peer_compute_type(torch.float32, "cpu", None) == "float32"
    assert peer_compute_type(torch.bfloat16, "cpu", None) == ("bfloat16" if "bfloat16" in supported else "float32")
    assert peer_compute_type(torch.int8, "cpu", None) == ("int8_bfloat16" if "int8_bfloat16" in supported else "float32")
    assert peer_compute_type(torch.float32, "cpu", "int8") == "int8"
    missing = next(ct for ct in COMPUTE_TYPES if ct not in supported)  # CPUs have no float16 in CTranslate2
    with pytest.raises(BenchError, match=f"has no {missing} on cpu"):
        peer_compute_type(torch.float32, "cpu", missing)


@pytest.fixture(scope="module")
def tiny(whisper_models):
    """What a peer knows of the specli target: name, directory, device, dtype (no weights)."""
    target = PeerTarget.of(whisper_models("whisper-tiny.en"))
    assert (target.name, target.device, target.dtype) == ("whisper-tiny.en", "cpu", "float32")
    return target


def test_faster_whisper_peer_runs_in_the_compute_type_asked(tiny):
    peer = FasterWhisperPeer(tiny, threads=1, compute_type="int8")
    assert (peer.name, peer.dtype) == ("faster-whisper:int8", "int8")
    assert "first in line" in peer.transcribe(load_audio(EN_CLIPS[0]), "en", False).lower()
    plain = FasterWhisperPeer(tiny, threads=1)
    assert (plain.name, plain.dtype) == ("faster-whisper", "float32")


def test_batched_peer_gives_each_clip_its_own_text(tiny):
    """Three clips joined into one pipeline call, two windows per batch (a batch spans two clips): every
    clip gets the text the sequential peer gives it, in input order."""
    clips = [EN_CLIPS[0], EN_CLIPS[3], EN_CLIPS[4]]
    audios = [load_audio(c) for c in clips]
    batched = FasterWhisperBatchedPeer(tiny, threads=1, compute_type="float32")
    assert batched.batched and batched.name == "faster-whisper-batched:float32"
    sequential = FasterWhisperPeer(tiny, threads=1, compute_type="float32")
    want = [normalize(sequential.transcribe(a, "en", False), "en") for a in audios]
    assert all(want) and len(set(want)) == 3
    got = batched.transcribe_many(audios, ["en"] * 3, False, batch_size=2)
    assert [normalize(t, "en") for t in got] == want
    reordered = batched.transcribe_many(audios[::-1], ["en"] * 3, False, batch_size=3)
    assert [normalize(t, "en") for t in reordered] == want[::-1]
    assert normalize(batched.transcribe(audios[1], "en", False), "en") == want[1]
