"""Ragged batched decoding (core/batched.py): every row decodes as it would alone, token for token.

Property tests on tiny random targets (Whisper and Qwen2): rows of different prompt lengths, rules,
length limits and end steps (a per-row rule forces eot after a row-specific number of tokens), more
rows than slots (rows leave, the last row moves into the hole, new rows join), drafters that are
always wrong / always right / random trees / the n-gram pool. Batched speculative greedy is compared
with batched AR greedy of the same batch shape, and both with batch-1 greedy decoding.

Batched vs unbatched matrix products: the batched forward runs the same products over more rows and
masks each row's cache instead of slicing it, so logits differ from batch 1 in the last bits. On
these tiny models (and the real clips of tests/test_batched_real.py) no greedy choice is close enough
to a tie for that to flip a token; a flip would show up as a failure of the batch-1 comparisons below
while the same-batch-shape comparisons still hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import examples

from specli.core.batched import BatchDecoder, RowJob, decode_all
from specli.core.drafters.base import Drafter, ModelDraftOptions
from specli.core.drafters.batched import PerRowDrafters
from specli.asr.drafters.eagle_head import EagleConfig, SpeechDraftHead
from specli.asr.drafters.eagle import EagleDrafter
from specli.asr.drafters.eagle_batched import BatchedEagleDrafter
from specli.asr.drafters.model import ModelDrafter
from specli.core.drafters.ngram import NgramDrafter, NgramPool
from specli.core import speculative
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob, Probe
from specli.core.logits import SamplingParams, filter_logits
from specli.core.speculative import SpecOptions
from specli.core.types import LogitRules
from tiny_models import (EOT, NO_TS, SOT, VOCAB, AlwaysWrongDrafter, NoisyTreeDrafter, RandomTreeDrafter, tiny_rules,
                         tiny_target, window)

TARGET = tiny_target(0)
OTHER = tiny_target(1, layers=1)
torch.manual_seed(5)
HEAD = SpeechDraftHead(EagleConfig.for_target(TARGET, "tiny"), TARGET).init_from_target(TARGET).eval()
_IDS = torch.randperm(VOCAB)[:30].sort().values  # a draft vocabulary of 30 of the 48 ids
SMALL_HEAD = SpeechDraftHead(EagleConfig.for_target(TARGET, "tiny", 30), TARGET, _IDS).init_from_target(TARGET).eval()


@dataclass(frozen=True)
class EotAfter:
    """A row's rules, plus: from ``length`` sampled tokens on, eot is the most likely token (rows end at
    different steps, and a drafter that follows the rules drafts eot inside its chain)."""

    base: LogitRules
    length: int

    def __call__(self, logits: torch.Tensor, prefixes) -> torch.Tensor:
        out = self.base(logits, prefixes)
        for i, prefix in enumerate(prefixes):
            if len(prefix) >= self.length:
                out[i, EOT] = out[i].max() + 3.0
        return out


# audio seed, tokens after sot, timestamps, max_new_tokens, eot after, previous text (before sot)
ROW = st.tuples(st.integers(0, 40), st.lists(st.integers(6, 35), max_size=3), st.booleans(), st.integers(1, 30),
                st.integers(1, 30), st.lists(st.integers(6, 35), max_size=4))


def _jobs(rows) -> list[RowJob]:
    jobs = []
    for key, (audio_seed, extra, timestamps, max_new, eot_after, *prev) in enumerate(rows):
        w = window(TARGET, audio_seed)
        before = [1, *prev[0]] if prev and prev[0] else []  # <|startofprev|> and the previous text
        prompt = [*before, SOT, *extra] + ([] if timestamps else [NO_TS])
        job = DecodeJob(prompt, EotAfter(tiny_rules(timestamps), eot_after), EOT, max_new, probe=Probe(len(before), 1))
        jobs.append(RowJob(key, (w.audio_features, w.features), job))
    return jobs


def _batch1(target, job: RowJob, state):
    return greedy_decode(target, state, job.job)


def test_no_speech_prob_when_sot_ends_a_prompt_with_previous_text():
    """sot last in the prompt (previous text, timestamps on): its row is scored in the first decoding
    step, after the prefill; batch-1 speculative and batched decoding read it there, as greedy does."""
    row = _jobs([(4, [], True, 6, 30, [7, 8, 9])])[0]
    assert row.job.probe.index == len(row.job.prompt) - 1 > 0
    ref = _batch1(TARGET, row, window(TARGET, 4))
    assert ref.probed > 0
    spec = speculative.speculative_decode(TARGET, window(TARGET, 4), row.job, AlwaysWrongDrafter())
    assert spec.probed == pytest.approx(ref.probed, abs=1e-6)
    (_key, got), = decode_all(TARGET, [row], 1)
    assert got.probed == pytest.approx(ref.probed, abs=1e-6)


def _same(got, ref) -> None:
    assert got.tokens == ref.tokens
    assert got.finished == ref.finished
    assert got.sum_logprob == pytest.approx(ref.sum_logprob, abs=1e-3)
    assert got.probed == pytest.approx(ref.probed, abs=1e-5)
    assert got.stats.tokens == ref.stats.tokens


@examples(8)
@given(rows=st.lists(ROW, min_size=1, max_size=7), capacity=st.integers(1, 4))
def test_batched_ar_greedy_equals_batch1_greedy(rows, capacity):
    jobs = _jobs(rows)
    got = dict(decode_all(TARGET, jobs, capacity))
    assert sorted(got) == list(range(len(jobs)))
    for job in jobs:
        _same(got[job.key], _batch1(TARGET, job, window(TARGET, rows[job.key][0])))


def _ngram_rows(seed: int) -> PerRowDrafters:
    pool = NgramPool(3)  # one pool for the whole batch: rows learn from rows that finished before them
    return PerRowDrafters(lambda: NgramDrafter(pool, EOT))


DRAFTERS = {
    "always-wrong": lambda seed: PerRowDrafters(AlwaysWrongDrafter),
    "always-right": lambda seed: PerRowDrafters(lambda: ModelDrafter(TARGET, share_encoder=True)),
    "other-model": lambda seed: PerRowDrafters(lambda: ModelDrafter(OTHER)),
    "random-tree": lambda seed: PerRowDrafters(lambda: RandomTreeDrafter(seed)),
    "noisy-self-tree": lambda seed: PerRowDrafters(
        lambda: NoisyTreeDrafter(ModelDrafter(TARGET, share_encoder=True), seed)),
    "ngram-pool": _ngram_rows,
    "eagle-per-row": lambda seed: PerRowDrafters(lambda: EagleDrafter(HEAD)),
    "eagle-batched": lambda seed: BatchedEagleDrafter(HEAD, 4),
    "eagle-batched-adaptive": lambda seed: BatchedEagleDrafter(HEAD, 4, ModelDraftOptions(confidence_threshold=0.4)),
    "eagle-batched-draft-vocab": lambda seed: BatchedEagleDrafter(SMALL_HEAD, 4),
    "eagle-batched-bf16": lambda seed: BatchedEagleDrafter(HEAD, 4, dtype=torch.bfloat16),
    "eagle-batched-bf16-int8": lambda seed: BatchedEagleDrafter(HEAD, 4, dtype=torch.bfloat16, int8=True),
}


@examples(4)
@given(rows=st.lists(ROW, min_size=1, max_size=6), capacity=st.integers(1, 4),
       max_draft=st.sampled_from([1, 2, 3, 5, 8]), seed=st.integers(0, 1000))
@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_batched_speculative_greedy_equals_batched_ar_greedy(name, rows, capacity, max_draft, seed):
    jobs = _jobs(rows)
    ar = dict(decode_all(TARGET, jobs, capacity))
    spec = dict(decode_all(TARGET, jobs, capacity, drafter=DRAFTERS[name](seed),
                           options=SpecOptions(max_draft=max_draft)))
    for job in jobs:
        _same(spec[job.key], ar[job.key])
        assert spec[job.key].stats.target_forwards <= ar[job.key].stats.target_forwards


@pytest.mark.parametrize("threshold,head", [(0.0, HEAD), (0.4, HEAD), (0.0, SMALL_HEAD)])
def test_batched_eagle_drafts_what_per_row_eagle_drafts(threshold, head):
    """One head forward for all rows proposes the same chains as one head per row (same acceptance);
    both run the head in float32 with float matrices (EagleDrafter may pick bfloat16 and int8 matrices on its
    own: other rounding, other drafts)."""
    jobs = _jobs([(a, [], a % 2 == 0, 25, 8 + 3 * a) for a in range(5)])
    options = ModelDraftOptions(confidence_threshold=threshold)
    one_head_a_row = PerRowDrafters(lambda: EagleDrafter(head, options, torch.float32, int8=False))
    per_row = dict(decode_all(TARGET, jobs, 3, drafter=one_head_a_row, options=SpecOptions(max_draft=5)))
    batched = dict(decode_all(TARGET, jobs, 3, drafter=BatchedEagleDrafter(head, 3, options),
                              options=SpecOptions(max_draft=5)))
    assert sum(r.stats.accepted for r in batched.values()) > 0
    for job in jobs:
        a, b = per_row[job.key].stats, batched[job.key].stats
        assert (a.drafted, a.accepted, a.verify_steps) == (b.drafted, b.accepted, b.verify_steps)
        assert per_row[job.key].tokens == batched[job.key].tokens
    with pytest.raises(ValueError, match="chains"):
        BatchedEagleDrafter(HEAD, 2, ModelDraftOptions(tree_topk=2))


class OracleDrafter(Drafter):
    """Proposes the known greedy continuation of its row, then eot, then junk: eot sits inside the chain."""

    def __init__(self, refs: dict[tuple[int, ...], list[int]]) -> None:
        self.refs, self.ref = refs, []
        self.eot_proposed = 0

    def start(self, state, prompt: list[int]) -> None:
        self.ref = self.refs[tuple(prompt)] + [EOT, 7, 8, 9]

    def propose(self, request):
        from specli.core.drafters.base import DraftProposal

        done = len(request.tokens) - request.prompt_len
        draft = self.ref[done : done + request.budget]
        self.eot_proposed += int(EOT in draft[:-1])
        return DraftProposal(draft, list(range(-1, len(draft) - 1)), [1.0] * len(draft))

    def commit(self, tokens: list[int]) -> None:
        pass


def test_eot_inside_an_accepted_prefix_ends_the_row():
    rows = [(3, [6 + i], False, 30, 2 + 3 * i) for i in range(5)]  # unique prompts, ends after 2, 5, 8, ... tokens
    jobs = _jobs(rows)
    ar = dict(decode_all(TARGET, jobs, 3))
    assert all(r.finished for r in ar.values())
    assert len({len(r.tokens) for r in ar.values()}) == 5  # rows finish at different steps
    refs = {j.job.prompt: ar[j.key].tokens for j in jobs}
    made: list[OracleDrafter] = []

    def make() -> OracleDrafter:
        made.append(OracleDrafter(refs))
        return made[-1]

    spec = dict(decode_all(TARGET, jobs, 3, drafter=PerRowDrafters(make), options=SpecOptions(max_draft=8)))
    for job in jobs:
        _same(spec[job.key], ar[job.key])
        # every draft token of the row was right: one verification per max_draft tokens, eot included
        assert spec[job.key].stats.verify_steps == -(-(len(ar[job.key].tokens) + 1) // 9)
    assert sum(d.eot_proposed for d in made) >= 3  # eot was inside (not at the end of) accepted chains


def test_rows_join_and_leave_between_steps():
    jobs = _jobs([(5, [], False, 12, 3), (6, [9], True, 12, 7), (7, [], False, 4, 30), (8, [11, 12], True, 25, 9),
                  (9, [], True, 20, 5)])
    dec = BatchDecoder(TARGET, 3)
    assert (dec.free, dec.active) == (3, 0)
    dec.add(jobs[0])
    dec.add(jobs[1])
    got = dict(dec.step())
    dec.add(jobs[2])  # joins the running rows
    with pytest.raises(ValueError, match="no free slot"):
        dec.add(jobs[3])
    queue = jobs[3:]
    while dec.active:
        got.update(dec.step())
        while queue and dec.free:
            dec.add(queue.pop(0))
    assert sorted(got) == [0, 1, 2, 3, 4]
    for job in jobs:
        _same(got[job.key], _batch1(TARGET, job, window(TARGET, 5 + job.key)))


def test_max_new_tokens_and_row_length_limits():
    w = window(TARGET, 1)
    ok = RowJob("a", w.audio_features, DecodeJob([SOT, NO_TS], tiny_rules(), EOT, 1))
    (key, res), = decode_all(TARGET, [ok], 2)
    assert key == "a" and len(res.tokens) + int(res.finished) == 1
    with pytest.raises(ValueError, match="positions of a row"):
        BatchDecoder(TARGET, 2, max_len=20).add(RowJob("b", w.audio_features, DecodeJob([SOT] * 5, None, EOT, 16)))
    with pytest.raises(ValueError, match="max_new_tokens"):
        RowJob("c", None, DecodeJob([SOT], None, EOT, 0))
    with pytest.raises(ValueError, match="prompt"):
        RowJob("c", None, DecodeJob([], None, EOT, 3))


# ------------------------------------------- sampling: each row follows its own target distribution

KINDS = {  # prompt, rules, temperature, audio seed: two rows kinds with disjoint first-token supports
    "text": ([SOT, NO_TS], tiny_rules(False), 0.6, 11),
    "timestamps": ([SOT], tiny_rules(True), 1.0, 12),
}


def _first_token_probs(kind: str) -> torch.Tensor:
    prompt, rules, temperature, audio = KINDS[kind]
    out = TARGET.score(window(TARGET, audio), torch.tensor([prompt]))
    return filter_logits(out.logits[0, -1:], [[]], rules, SamplingParams(temperature=temperature)).softmax(-1)[0]


def _first_tokens(runs: int, drafter) -> dict[str, torch.Tensor]:
    """First sampled token of ``runs`` rows of each kind, interleaved in one continuous batch, one RNG a row."""
    jobs = []
    for i in range(runs):
        for k, (kind, (prompt, rules, temperature, audio)) in enumerate(KINDS.items()):
            w = window(TARGET, audio)
            job = DecodeJob(prompt, rules, EOT, 2, sampling=SamplingParams(temperature=temperature),
                            generator=torch.Generator().manual_seed(2 * i + k))
            jobs.append(RowJob((kind, i), (w.audio_features, w.features), job))
    counts = {kind: torch.zeros(VOCAB) for kind in KINDS}
    for (kind, _i), res in decode_all(TARGET, jobs, 4, drafter=drafter, options=SpecOptions(max_draft=2)):
        counts[kind][res.tokens[0] if res.tokens else EOT] += 1
    return counts


def tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())


def test_batched_sampling_follows_each_rows_distribution(monkeypatch):
    runs = 250
    p = {kind: _first_token_probs(kind) for kind in KINDS}
    # E[TV(empirical, p)] <= 0.5 * sum sqrt(p (1 - p) / runs) (Jensen, per token), and one run moves the TV
    # by at most 1 / runs, so it exceeds its mean by 0.1 with probability <= exp(-2 runs 0.1^2) = 6.7e-3 (McDiarmid)
    bound = {kind: 0.5 * float((q * (1 - q) / runs).sqrt().sum()) + 0.1 for kind, q in p.items()}
    spec = _first_tokens(runs, PerRowDrafters(lambda: ModelDrafter(OTHER, share_encoder=True)))
    ar = _first_tokens(runs, None)
    for kind in KINDS:
        assert tv(ar[kind], p[kind]) < bound[kind]
        assert tv(spec[kind], p[kind]) < bound[kind]
    # power: rows of the two kinds are told apart (a row decoded with another row's rules would fail) ...
    assert tv(spec["text"], p["timestamps"]) > 2 * bound["timestamps"]

    # ... and a verifier that accepts every draft token samples the drafter, which the check catches
    def accept_all(filtered, proposal, greedy, u_accept, u_sample, **_kw):
        n = len(proposal)
        return torch.tensor([n]), torch.arange(n).unsqueeze(0), filtered[:, n].softmax(-1).multinomial(1)[:, 0]

    monkeypatch.setattr(speculative, "verify", accept_all)
    broken = _first_tokens(runs, PerRowDrafters(lambda: ModelDrafter(OTHER, share_encoder=True)))
    assert max(tv(broken[kind], p[kind]) - 2 * bound[kind] for kind in KINDS) > 0


@examples(4)
@given(rows=st.lists(ROW, min_size=1, max_size=6), capacity=st.integers(1, 4), limit=st.integers(1, 3))
@pytest.mark.parametrize("name", ["always-right", "eagle-batched", "ngram-pool"])
def test_max_draft_rows_drafts_only_while_few_rows_are_active(name, rows, capacity, limit):
    """SpecOptions.max_draft_rows: output still equals AR; a row admitted beside ``limit`` others never drafts,
    and with the limit at the capacity drafting is as before."""
    jobs = _jobs(rows)
    ar = dict(decode_all(TARGET, jobs, capacity))
    spec = dict(decode_all(TARGET, jobs, capacity, drafter=DRAFTERS[name](0),
                           options=SpecOptions(max_draft=4, max_draft_rows=limit)))
    for job in jobs:
        _same(spec[job.key], ar[job.key])
    if capacity <= limit:
        return
    crowded = [job.key for job in jobs[limit:capacity]]  # admitted at the start beside `limit` others
    assert all(spec[k].stats.drafted == 0 for k in crowded)


def test_max_draft_rows_lets_a_lone_row_draft():
    jobs = _jobs([(1, [], True, 20, 9)])
    (_key, alone), = decode_all(TARGET, jobs, 4, drafter=DRAFTERS["always-right"](0),
                                options=SpecOptions(max_draft=4, max_draft_rows=1))
    assert alone.stats.drafted > 0 and alone.stats.target_forwards < len(alone.tokens)
