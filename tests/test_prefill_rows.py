"""A prompt prefill projects only the rows it reads onto the vocabulary (issue 45), and they are the rows a
full projection gives, bit for bit (fp32, real whisper-base weights, a long previous-text prompt)."""

from __future__ import annotations

import torch

from conftest import EN_CLIPS
from specli.core.job import DecodeJob, Probe, prefill
from specli.io.audio import load_audio, window_features
from specli.models.whisper.rules import WhisperLogitRules


def _prompt(model) -> tuple[int, ...]:
    """A long-form window's prompt: <|startofprev|>, 40 previous-text tokens, then sot, language, task."""
    sp = model.special
    previous = model.tokenizer.encode(" and mister john dashwood had then leisure to consider how much there"
                                      " might be prudently in his power to do for them")[:40]
    return (sp.sot_prev, *previous, *sp.prompt("en"))


def test_prefill_logits_are_the_read_rows_of_the_full_projection(whisper_models):
    model = whisper_models("whisper-base")
    target, sp = model.target, model.special
    feats = target.encode(window_features(load_audio(EN_CLIPS[0]), target.dims.n_mels))
    prompt = _prompt(model)
    sot = prompt.index(sp.sot)
    job = DecodeJob(prompt, WhisperLogitRules.for_model(sp), sp.eot, 8, probe=Probe(sot, sp.no_speech))
    tokens = torch.tensor([list(prompt)])
    full = target.score(target.start(feats), tokens)  # [1, n, vocab], every row
    for last in (False, True):
        got = prefill(target, target.start(feats), job, len(prompt), last=last)
        rows = [sot, len(prompt) - 1] if last else [sot]
        assert got.out.logits.shape == (1, len(rows), target.dims.vocab)
        assert torch.equal(got.out.logits, full.logits[:, rows])
        assert torch.equal(got.out.hidden.last, full.hidden.last)  # drafters still read every row's state
        assert got.probed == job.probe.read(full.logits[0, sot])
