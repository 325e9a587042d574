"""Real weights, real speech: batched decoding of several clips' first windows == batch-1 decoding.

whisper-tiny.en on the bundled English clips, three slots for four windows (the fourth joins when the
first row leaves), timestamp rules on. Batched AR greedy is compared with batch-1 greedy (on these
clips no near-tie flips under batched matrix products; were one to, this comparison would fail while
the same-batch-shape one below holds, and the README's batching note would list it), and batched
speculative greedy (batched EAGLE head, n-gram pool) with batched AR greedy token for token. The slow
test does the same for whisper-base in English and Spanish.
"""

from __future__ import annotations

import pytest
import torch

from conftest import EN_CLIPS, ES_CLIPS
from specli.core.job import DecodeJob, Probe
from specli.io.audio import N_SAMPLES, load_audio, window_features
from specli.core.batched import RowJob, decode_all
from specli.core.drafters.batched import PerRowDrafters
from specli.asr.drafters.eagle_head import load_head
from specli.asr.drafters.eagle_batched import BatchedEagleDrafter
from specli.core.drafters.ngram import NgramDrafter, NgramPool
from specli.core.greedy import greedy_decode
from specli.core.speculative import SpecOptions
from specli.models.whisper.rules import WhisperLogitRules


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def windows(whisper_models, request):
    """In bfloat16 the windows' cross-attention K/V are bf16 (row-invariant SDPA): batch-N == batch-1 still."""
    model = whisper_models("whisper-tiny.en", request.param)
    mels = torch.cat([window_features(load_audio(c)[:N_SAMPLES], model.target.dims.n_mels) for c in EN_CLIPS[:4]])
    return model, model.target.encode(mels)  # one batched encoder forward: [4, 1500, d]


def _jobs(model, enc) -> list[RowJob]:
    sp = model.special
    rules = WhisperLogitRules.for_model(sp, timestamps=True)
    prompt = sp.prompt(None, timestamps=True)
    job = DecodeJob(prompt, rules, sp.eot, 224 - len(prompt), probe=Probe(0, sp.no_speech))
    return [RowJob(i, enc[i : i + 1], job) for i in range(enc.shape[0])]


def test_real_batched_ar_equals_batch1_and_speculative_equals_ar(windows):
    model, enc = windows
    target, jobs = model.target, _jobs(model, enc)
    ar = dict(decode_all(target, jobs, 3))
    for job in jobs:
        ref = greedy_decode(target, target.start(job.context), job.job)
        assert ar[job.key].tokens == ref.tokens
        assert ar[job.key].finished and ref.finished
        assert ar[job.key].sum_logprob == pytest.approx(ref.sum_logprob, abs=1e-2)
        assert ar[job.key].probed == pytest.approx(ref.probed, abs=1e-4)
    assert len({len(r.tokens) for r in ar.values()}) > 1  # rows of different lengths
    head = load_head("whisper-tiny.en-eagle", target)
    pool = NgramPool(4)
    for name, drafter in (("eagle", BatchedEagleDrafter(head, 3)),
                          ("ngram", PerRowDrafters(lambda: NgramDrafter(pool, model.special.eot)))):
        spec = dict(decode_all(target, jobs, 3, drafter=drafter, options=SpecOptions(max_draft=6)))
        for job in jobs:
            assert spec[job.key].tokens == ar[job.key].tokens
        if name == "eagle":  # the head drafts real speech well: most steps accept something
            assert sum(r.stats.accepted for r in spec.values()) > sum(r.stats.verify_steps for r in spec.values())


@pytest.mark.slow
def test_real_whisper_base_batched_equals_batch1_in_two_languages(whisper_models):
    """whisper-base, English and Spanish windows, timestamps on and off: every row == its batch-1 decode,
    and batched EAGLE (one head forward for all rows) == batched AR."""
    model = whisper_models("whisper-base")
    target, sp = model.target, model.special
    clips = EN_CLIPS[:3] + ES_CLIPS[:2]
    enc = target.encode(torch.cat([window_features(load_audio(c)[:N_SAMPLES], target.dims.n_mels) for c in clips]))
    jobs = []
    for i, clip in enumerate(clips):
        timestamps = i % 2 == 0
        prompt = sp.prompt("es" if clip in ES_CLIPS else "en", timestamps=timestamps)
        rules = WhisperLogitRules.for_model(sp, timestamps=timestamps)
        jobs.append(RowJob(i, enc[i : i + 1], DecodeJob(prompt, rules, sp.eot, 224 - len(prompt),
                                                        probe=Probe(0, sp.no_speech))))
    ar = dict(decode_all(target, jobs, 4))
    for job in jobs:
        ref = greedy_decode(target, target.start(job.context), job.job)
        assert ar[job.key].tokens == ref.tokens
    spec = dict(decode_all(target, jobs, 4, drafter=BatchedEagleDrafter(load_head("whisper-base-eagle", target), 4),
                           options=SpecOptions(max_draft=6)))
    for job in jobs:
        assert spec[job.key].tokens == ar[job.key].tokens
