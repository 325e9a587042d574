"""The session memo serves the shipped models unchanged: a CLI call that uses one (and attaches a drafter's aux
layers to it) changes none of its tensors, the next serve sees it as loaded, and a non-shipped checkpoint or a
compiled encoder is never served from the memo."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from conftest import EN_CLIPS
from model_memo import VOICES
from specli.cli import main

pytestmark = pytest.mark.usefixtures("memo_loaders")


def _digest(tensors) -> str:
    """sha256 over a few tensors' bytes (every 7th, at most 12: cheap, and any in-place write to them shows)."""
    h = hashlib.sha256()
    for t in list(tensors)[::7][:12]:
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes() if t.dtype != torch.bfloat16
                 else t.detach().float().numpy().tobytes())
    return h.hexdigest()


def _tensors(obj, seen=None, depth=0):
    """Every tensor reachable through ``obj``'s attributes, lists and modules (deterministic order)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 6:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.layout == torch.strided and not obj.is_mkldnn:  # an opaque packed weight has no bytes to read
            yield obj
    elif isinstance(obj, torch.nn.Module):
        yield from (t for t in obj.state_dict().values() if t.layout == torch.strided and not t.is_mkldnn)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x, seen, depth + 1)
    elif hasattr(obj, "__dict__"):
        for k in sorted(vars(obj)):
            yield from _tensors(vars(obj)[k], seen, depth + 1)


def test_a_transcribe_call_leaves_the_served_whisper_as_loaded(tmp_path: Path, whisper_models, memo_loaders) -> None:
    model = whisper_models("whisper-tiny.en")
    before, loads = _digest(_tensors(model.target)), memo_loaders.loads.get("whisper", 0)
    for fmt in ("txt", "json"):
        res = CliRunner().invoke(main, ["transcribe", str(EN_CLIPS[1]), "--preset", "whisper-tiny.en-eagle-asr",
                                        "-f", fmt, "-o", str(tmp_path / fmt), "--threads", "1",
                                        "--dtype", "float32"],
                                 catch_exceptions=False)
        assert res.exit_code == 0, res.output
    assert memo_loaders.loads.get("whisper", 0) == loads  # both calls were served the session's model
    assert whisper_models("whisper-tiny.en") is model and _digest(_tensors(model.target)) == before
    assert model.target.compiled_encoder is None


def test_a_drafter_call_changes_no_tensor_and_its_aux_layers_go_with_it(tmp_path: Path, voice_lm, vocalizer,
                                                                        memo_loaders) -> None:
    lm, voc = voice_lm(), vocalizer()
    aux, before = lm.lm.qwen.aux_layers, (_digest(_tensors(lm.lm)), _digest(_tensors(voc)))
    loads = dict(memo_loaders.loads)
    res = CliRunner().invoke(main, ["synthesize", "--model", str(VOICES / "specli-en"), "--preset", "specli-en-dflash",
                                    "--sampler", "greedy", "--text", "Hi there.", "--format", "wav", "--threads", "1",
                                    "--audio-dtype", "float32", "-o", str(tmp_path / "out")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert lm.lm.qwen.aux_layers != aux  # the DFlash drafter attached its layers to the served LM ...
    assert voice_lm() is lm and lm.lm.qwen.aux_layers == aux  # ... and the next serve has them as loaded
    assert (_digest(_tensors(lm.lm)), _digest(_tensors(voc))) == before
    assert memo_loaders.loads == loads  # the call was served the session's LM and vocalizer


def test_other_checkpoints_load_for_real(tmp_path: Path, model_memo) -> None:
    copy = tmp_path / "specli-en"
    shutil.copytree(VOICES / "specli-en", copy)
    assert model_memo.cosyvoice(str(copy)) is not model_memo.cosyvoice(str(copy))
    assert model_memo.cosyvoice("specli-en") is model_memo.cosyvoice(str(VOICES / "specli-en"))
    served = model_memo.whisper("whisper-tiny.en")
    assert model_memo.whisper(str(served.path)) is not served  # a directory is not a shipped name
