"""The shared training loop (:mod:`specli.distill.loop`): a run cut between a checkpoint and the validation
that follows it resumes with the true best validation, and a worse later validation never replaces the
better module saved in OUT, for both families (EAGLE-ASR heads of a tiny Whisper target, DSpark drafters of
a tiny CosyVoice3 LM).

Validation is scripted (``validate`` replaced by a function that returns given acceptances, or raises a
cut): the loop's bookkeeping is under test, not the decode.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_distill_recipe import MODEL, _windows
from test_speech_distill import FAST, TEXTS, markov_checkpoint

import specli.distill.speech_train as speech_train
import specli.distill.train as eagle_train
from specli.core.types import DecodeStats
from specli.distill.data import load_windows
from specli.distill.loop import TrainSummary
from specli.distill.speech_data import SpeechDataOptions, generate_speech, read_speech_manifest
from specli.models.cosyvoice.lm import load_cosyvoice
from specli.tts.synthesis import SynthesisRequest

Run = Callable[[int], TrainSummary]  # step budget -> the (resumed) run's summary


class _Cut(Exception):
    """A run stopped inside validation (as Ctrl-C would)."""


@pytest.fixture(scope="module")
def speech_target(tmp_path_factory):
    """The tiny CosyVoice3 Markov-chain LM, three of its on-policy sequences and their manifest."""
    root = tmp_path_factory.mktemp("loopcv3")
    model = load_cosyvoice(str(markov_checkpoint(root / "ckpt")))
    reqs = [SynthesisRequest(f"u{i:02d}", t) for i, t in enumerate(TEXTS[:6])]
    generate_speech(reqs, model, root / "d", SpeechDataOptions(per_shard=6))
    records = load_windows(root / "d")
    assert len(records) >= 3
    return model, records[:3], read_speech_manifest(root / "d")


def _eagle_run(out: Path) -> Run:
    windows = _windows()  # three windows: batch 1 makes three steps an epoch

    def run(steps: int) -> TrainSummary:
        opts = eagle_train.TrainOptions(epochs=2, steps=steps, batch=1, checkpoint_every=1, draft_vocab=20,
                                        val_windows=1)
        return eagle_train.train(windows, MODEL, out, opts, windows[:1])

    return run


def _speech_run(out: Path, speech_target) -> Run:
    model, records, manifest = speech_target

    def run(steps: int) -> TrainSummary:
        opts = speech_train.SpeechTrainOptions("dspark", epochs=2, steps=steps, checkpoint_every=1, lr=1e-2,
                                               **{**FAST, "batch": 1, "val_sequences": 1})
        return speech_train.train_speech(records, model, out, opts, records[:1], manifest)

    return run


def _scripted(values: list) -> Callable[[], float]:
    """A stand-in for ``validate``'s acceptance: the next of ``values`` (an exception instance is raised)."""
    left = iter(values)

    def next_value() -> float:
        value = next(left)
        if isinstance(value, Exception):
            raise value
        return value

    return next_value


def _saved(out: Path) -> dict[str, bytes]:
    """The files of the module saved in OUT (checkpoints left out)."""
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}


def _checkpoint_best(out: Path) -> float:
    latest = sorted((out / "checkpoints").glob("ckpt-*.pt"))[-1]
    return float(torch.load(latest, weights_only=True)["best_val"])


@pytest.mark.parametrize("family", ["eagle", "speech"])
def test_a_run_cut_after_a_checkpoint_resumes_with_the_true_best(family, tmp_path, monkeypatch, request):
    """Run 1 stops on its step budget in the middle of epoch 1 and validates there (2.0, the best). Run 2
    (a bigger budget) is cut inside its first validation; run 3 resumes and validates worse (1.5, 1.25).
    The best a resumed run starts from is 2.0, and the module saved in OUT stays run 1's, byte for byte."""
    out = tmp_path / family
    acceptance = _scripted([2.0, _Cut(), 1.5, 1.25])
    if family == "eagle":
        run = _eagle_run(out)
        monkeypatch.setattr(eagle_train, "validate", lambda *a, **k: (acceptance(), 0))
    else:
        run = _speech_run(out, request.getfixturevalue("speech_target"))

        def stats(*a, **k) -> DecodeStats:  # acceptance length (accepted + steps) / steps
            return DecodeStats(verify_steps=4, accepted=round(4 * (acceptance() - 1)))

        monkeypatch.setattr(speech_train, "validate", stats)
    first = run(2)
    assert (first.steps, first.val_acceptance, first.best_acceptance) == (2, 2.0, 2.0)
    saved = _saved(out)
    assert _checkpoint_best(out) == 2.0  # the checkpoint a rerun resumes from knows the best
    with pytest.raises(_Cut):
        run(6)  # steps 3 (end of epoch 1: checkpointed), then cut in that epoch's validation
    last = run(6)  # validates the end of epoch 1 again (1.5), trains epoch 2, validates it (1.25)
    assert (last.steps, last.val_acceptance, last.best_acceptance) == (6, 1.25, 2.0)
    assert _checkpoint_best(out) == 2.0
    assert _saved(out) == saved  # the better module of run 1 is still the one in OUT
