"""Ragged batched decoding with continuous batching: plain (AR) or speculative, greedy or sampled.

Up to ``capacity`` rows decode together in one preallocated target state (a
:class:`~specli.core.kv_cache.RaggedKVCache` with one length per row, plus each slot's context:
Whisper's encoder output and cross-attention K/V). A row is admitted into the first free slot
(``target.admit`` writes its context, one batch-1 forward prefills all of its prompt but the last
token), then every :meth:`BatchDecoder.step` is ONE target forward over the active rows ``[0, B)``:

* each row scores ``[pending] + its draft`` (``[B, K+1]``; a row with fewer draft tokens is padded
  with its pending token at its own position and masked, and its padding K/V is never kept);
* each row's logits go through the one logit filter with that row's rules, sampling parameters and
  generator, and are verified on their own (:func:`~specli.core.speculative.accept_draft`, the
  same code as batch-1 speculative decoding); greedy rows without a draft (every row of batched plain
  decoding) are filtered and chosen together instead, ``[B, vocab]`` per set of equal rules, with one readback
  for all of them (the same row-wise operations as batch 1); eot inside an accepted prefix ends the row;
* a row keeps its accepted path in the cache (its own length moves; rejected K/V stays, masked);
* finished rows leave: the last active row is copied into the hole (one row's cache and context,
  once), so the active rows stay ``[0, B)`` and no step gathers rows.

Without a drafter every row proposes nothing and a step is batched plain decoding. Greedy output of a
row equals :func:`~specli.core.greedy.greedy_decode` of that row at batch 1 except where batched
matrix products flip a near-tie between the top two logits (tests/test_batched.py documents where).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from specli.core.device import host_to_device
from specli.core.drafters.base import EMPTY, DraftProposal, DraftRequest
from specli.core.drafters.base import BatchDrafter
from specli.core.job import DecodeJob, Probe, prefill, probe_at
from specli.core.logits import LogitFilter
from specli.core.goodput import GoodputController
from specli.core.speculative import SpecOptions, accept_draft, chain_of, commit_emitted, draft_room
from specli.core.tree import depths, tree_inputs
from specli.core.types import BatchTarget, DecodeResult, DecodeStats, HiddenStates


@dataclass(frozen=True)
class RowJob:
    """One sequence to decode inside a batch: a :class:`~specli.core.job.DecodeJob` and where it belongs."""

    key: Hashable  # the caller's id, returned with the result
    context: Any  # what target.admit takes (Whisper: encoder output [1, A, d]; decoder-only LM: None)
    job: DecodeJob  # prompt, rules, eot, length limit, sampling, generator, probe


@dataclass
class _Row:
    """A row in flight: its job, committed tokens and counters."""

    row: RowJob
    tokens: list[int]  # prompt + sampled, the pending token last
    filt: LogitFilter  # filter_logits with this row's rules and sampling parameters
    gen: torch.Generator | None
    stats: DecodeStats = field(default_factory=DecodeStats)
    hidden: HiddenStates | None = None  # target states of the row's last verified positions [1, m, d]
    sum_logprob: float = 0.0
    probed: float | None = None  # the job's probe, once read
    finished: bool = False
    ctrl: GoodputController | None = None  # this row's goodput draft-length rule (SpecOptions.costs)
    plain: bool = False  # decodes without drafts from now on (SpecOptions.max_draft_rows): no proposals, no commits
    t_start: float = field(default_factory=time.perf_counter)

    @property
    def job(self) -> DecodeJob:
        return self.row.job

    @property
    def sampled(self) -> int:
        return len(self.tokens) - len(self.job.prompt)


class BatchDecoder:
    """Continuous batching over a target that implements :class:`~specli.core.types.BatchTarget`.

    ``add`` admits rows into free slots, ``step`` runs one batched forward and returns the rows that
    finished. ``drafter`` (a :class:`~specli.core.drafters.base.BatchDrafter`) makes it
    speculative; ``options.max_draft`` bounds each row's draft. Stats are per row: ``target_forwards``
    counts the forwards the row took part in; the batch's draft / verify time is split evenly over
    the rows of each step, so the rows' times add up to the wall time.
    """

    def __init__(self, target: BatchTarget, capacity: int, max_len: int | None = None, *,
                 drafter: BatchDrafter | None = None, options: SpecOptions = SpecOptions()) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.target, self.drafter, self.options = target, drafter, options
        spare = options.max_draft + 1 if drafter is not None else 1
        self.state = target.start_batch(capacity, max_len, spare)
        self.capacity = capacity
        self.rows: list[_Row] = []  # row b lives in slot b

    @property
    def free(self) -> int:
        """Slots available for :meth:`add`."""
        return self.capacity - len(self.rows)

    @property
    def active(self) -> int:
        """Rows decoding now."""
        return len(self.rows)

    @torch.inference_mode()
    def add(self, row_job: RowJob) -> None:
        """Admit ``row_job`` into the next free slot and prefill its prompt (all but the last token)."""
        cache, job = self.state.cache, row_job.job
        if not self.free:
            raise ValueError("no free slot")
        if len(job.prompt) + job.max_new_tokens > cache.max_len:
            raise ValueError(f"prompt ({len(job.prompt)}) + max_new_tokens ({job.max_new_tokens}) exceed the "
                             f"{cache.max_len} positions of a row")
        row = _Row(row_job, list(job.prompt), LogitFilter(job.rules, job.sampling), job.generator)
        if self.options.costs is not None:
            row.ctrl = GoodputController(self.options.costs)
        slot = len(self.rows)
        row.plain = not self._may_draft(slot + 1)
        self.target.admit(self.state, slot, row_job.context)
        view = self.target.row_state(self.state, slot, row_job.context)
        first = prefill(self.target, view, job, len(job.prompt) - 1)
        if first.out is not None:
            cache.set_length(slot, view.cache.length)
            row.stats.target_forwards += 1
            row.hidden, row.probed = first.out.hidden, first.probed
        if self.drafter is not None:
            t0 = time.perf_counter()
            self.drafter.admit(slot, view, list(job.prompt))
            row.stats.draft_seconds += time.perf_counter() - t0
        self.rows.append(row)

    @torch.inference_mode()
    def step(self) -> list[tuple[Hashable, DecodeResult]]:
        """One batched target forward over the active rows; returns the rows that finished."""
        if not self.rows:
            return []
        t0 = time.perf_counter()
        proposals = self._propose()
        t1 = time.perf_counter()
        out = self.target.score(self.state, *_batch_inputs(self.rows, proposals, self.state.cache.lengths,
                                                           self.state.cache.device))
        plain = [b for b, (row, p) in enumerate(zip(self.rows, proposals)) if not len(p) and row.job.sampling.greedy]
        if plain:
            self._accept_plain(plain, out)
        for b, (row, proposal) in enumerate(zip(self.rows, proposals)):
            if b not in plain:
                self._accept(b, row, proposal, out)
        t2 = time.perf_counter()
        if self.drafter is not None:
            for b, row in enumerate(self.rows):
                if not row.finished and not row.plain:
                    self.drafter.commit(b, row.tokens)
        t3 = time.perf_counter()
        share, widest = 1.0 / len(self.rows), max(len(p) for p in proposals)
        for row, proposal in zip(self.rows, proposals):
            row.stats.target_forwards += 1
            row.stats.drafted += len(proposal)
            row.stats.draft_seconds += (t1 - t0 + t3 - t2) * share
            row.stats.verify_seconds += (t2 - t1) * share
        if self.options.costs is not None:
            self.options.costs.record_draft(t1 - t0 + t3 - t2, sum(len(p) for p in proposals))
            self.options.costs.record_verify(len(self.rows), widest + 1, t2 - t1)
        return self._release()

    def _propose(self) -> list[DraftProposal]:
        """Each active row's draft (empty without a drafter or without room)."""
        if self.drafter is None:
            return [EMPTY] * len(self.rows)
        if not self._may_draft(len(self.rows)):
            for row in self.rows:
                row.plain = True  # its drafter state stops following it: it never drafts again
        if all(row.plain for row in self.rows):
            return [EMPTY] * len(self.rows)
        requests: list[DraftRequest | None] = []
        for b, row in enumerate(self.rows):
            job = row.job
            if row.plain:
                requests.append(None)
                continue
            if row.ctrl is not None:
                row.ctrl.rows = len(self.rows)  # a forward scores every active row
            room = draft_room(self.options, row.stats, row.ctrl, job.max_new_tokens - row.sampled - 1,
                              self.state.cache.max_len - self.state.cache.lengths[b] - 2)
            view = self.target.row_state(self.state, b, row.row.context)
            keep = None if row.ctrl is None else row.ctrl.keep_drafting
            requests.append(None if room < 1 else DraftRequest(row.tokens, len(job.prompt), room, view, row.hidden,
                                                               row.filt, job.sampling.greedy, row.gen, keep))
        return self.drafter.propose(requests)

    def _may_draft(self, rows: int) -> bool:
        """Whether a step over ``rows`` active rows may draft (SpecOptions.max_draft_rows)."""
        limit = self.options.max_draft_rows
        return self.drafter is not None and (limit is None or rows <= limit)

    def _accept(self, b: int, row: _Row, proposal: DraftProposal, out) -> None:
        """Verify row ``b``'s draft against its rows of ``out`` and commit what it accepts."""
        n, plen = len(proposal), len(row.job.prompt)
        kept, emitted, logprobs = accept_draft(out.logits[b, : n + 1], row.tokens[plen:], proposal, row.filt,
                                               row.job.sampling, row.gen, self.options.verify_backend)
        if row.stats.verify_steps == 0 and row.probed is None:  # the first step scored the pending prompt token
            row.probed = probe_at(row.job, plen - 1, out.logits[b, 0])
        self._commit(b, row, proposal, out, kept, emitted, logprobs)

    def _accept_plain(self, plain: list[int], out) -> None:
        """Greedy rows ``plain`` without a draft: chosen together (:func:`greedy_rows`), then committed."""
        first = out.logits[:, 0]  # [B, vocab] the pending token's row of each batch row
        logits = first if len(plain) == first.shape[0] else \
            first.index_select(0, host_to_device(plain, torch.long, first.device))  # [m, vocab]
        rows = [self.rows[b] for b in plain]
        probes = [(i, row.job.probe) for i, (b, row) in enumerate(zip(plain, rows)) if self._probe_now(b)]
        tokens, logprobs, probed = greedy_rows(logits, [row.filt for row in rows],
                                               [row.tokens[len(row.job.prompt):] for row in rows], probes)
        for b, row, tok, lp in zip(plain, rows, tokens, logprobs):
            self._commit(b, row, EMPTY, out, [], [tok], [lp])
        for (i, _probe), value in zip(probes, probed):
            rows[i].probed = value

    def _probe_now(self, b: int) -> bool:
        """Whether row ``b``'s probe reads the pending prompt token that its first step scores."""
        row = self.rows[b]
        probe = row.job.probe
        return row.stats.verify_steps == 0 and row.probed is None and probe is not None and \
            probe.index == len(row.job.prompt) - 1

    def _commit(self, b: int, row: _Row, proposal: DraftProposal, out, kept: list[int], emitted: list[int],
                logprobs: list[float]) -> None:
        """Row ``b`` keeps its accepted path (cache, drafter states) and emits ``emitted``."""
        job, cache = row.job, self.state.cache
        plen, start = len(job.prompt), cache.lengths[b]
        cache.keep(b, start, [start] + [start + 1 + i for i in kept])
        if self.drafter is not None and not row.plain:
            rows = [0] + [i + 1 for i in kept]
            h = out.hidden
            row.hidden = HiddenStates(h.low[b : b + 1, rows], h.mid[b : b + 1, rows], h.last[b : b + 1, rows],
                                      tuple(a[b : b + 1, rows] for a in h.aux), h.aux_ids)
        used, row.sum_logprob, row.finished = commit_emitted(row.tokens, emitted, logprobs, row.sum_logprob, plen,
                                                      job.eot, job.max_new_tokens)
        row.stats.tokens += used
        row.stats.record_step(max(depths(proposal.parents), default=0), used - 1)
        if row.ctrl is not None:
            chain = chain_of(proposal)
            row.ctrl.record(chain, min(used - 1, len(chain)))

    def _release(self) -> list[tuple[Hashable, DecodeResult]]:
        """Results of the finished rows; the last active rows move into their slots."""
        done = [b for b, row in enumerate(self.rows) if row.finished or row.sampled >= row.job.max_new_tokens]
        results = []
        for b in reversed(done):  # highest slot first: the row moved into a hole is never a finished one
            row = self.rows[b]
            row.stats.decode_seconds = time.perf_counter() - row.t_start
            results.append((row.row.key, DecodeResult(row.tokens[len(row.job.prompt):], row.sum_logprob,
                                                      row.probed or 0.0, row.finished, row.stats)))
            if self.drafter is not None:
                self.drafter.finish(b)
            last = len(self.rows) - 1
            if b != last:
                self.target.move(self.state, last, b)
                if self.drafter is not None:
                    self.drafter.move(last, b)
                self.rows[b] = self.rows[last]
            self.rows.pop()
        return results[::-1]


def greedy_rows(logits: torch.Tensor,  # [m, vocab] raw logits of m rows, each its sequence's next token
                filters: list[LogitFilter],  # each row's filter (greedy parameters)
                prefixes: list[list[int]],  # each row's sampled tokens
                probes: Sequence[tuple[int, Probe]] = (),  # (row, probe) pairs to read on those rows' raw logits
                ) -> tuple[list[int], list[float], list[float]]:
    """Each row's greedy token and its log-probability, and the probes' values, with ONE readback: rows with equal
    filters are filtered together (``[k, vocab]``, one log_softmax), every operation row-wise, so each row's result
    equals batch 1's (:func:`~specli.core.speculative.accept_draft` of that row without a draft) bit for bit."""
    groups: list[tuple[LogitFilter, list[int]]] = []  # equal pure filters give equal rows
    for i, filt in enumerate(filters):
        group = next((g for g in groups if g[0] is filt or g[0] == filt), None)
        if group is None:
            groups.append((filt, [i]))
        else:
            group[1].append(i)
    dev, scored = logits.device, []
    for filt, rows in groups:
        part = logits if len(rows) == logits.shape[0] else logits.index_select(0, host_to_device(rows, torch.long, dev))
        f = filt.with_logprobs(part, [prefixes[i] for i in rows])
        scored.append((rows, f, f.logits.argmax(-1)))  # [k] each row's greedy token
    packed = torch.cat([c.double() for _r, _f, c in scored]
                       + [f.pick(torch.arange(len(r), device=dev), c) for r, f, c in scored]
                       + [probe.value(logits[i]).double()[None] for i, probe in probes]).tolist()  # the readback
    tokens, logprobs = [0] * len(filters), [0.0] * len(filters)
    at = k = 0
    for rows, f, _c in scored:
        got = [int(t) for t in packed[k : k + len(rows)]]
        at_lp = len(filters) + at
        width = len(rows) * (1 if f.stale is None else 2)
        for i, tok, lp in zip(rows, got, f.read(packed[at_lp : at_lp + width], list(range(len(rows))), got)):
            tokens[i], logprobs[i] = tok, lp
        at, k = at + width, k + len(rows)
    return tokens, logprobs, packed[len(filters) + at :]


def _batch_inputs(rows: list[_Row], proposals: list[DraftProposal], lengths: list[int], device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Tokens ``[B, K+1]``, positions ``[B, K+1]`` and tree mask ``[B, K+1, K+1]`` of one step.

    Row ``b`` scores ``[pending] + its draft`` at its own positions; its padding repeats the pending
    token at the pending position and sees only itself. Without drafts: ``[B, 1]`` tokens, positions
    and mask None (the cache's defaults).
    """
    k = max(len(p) for p in proposals)
    if k == 0:
        return host_to_device([[row.tokens[-1]] for row in rows], torch.long, device), None, None
    tokens, positions, masks = [], [], []
    eye = torch.eye(k + 1, dtype=torch.bool, device=device)
    for row, proposal, start in zip(rows, proposals, lengths):
        pad = k - len(proposal)
        tokens.append([row.tokens[-1], *proposal.tokens] + [row.tokens[-1]] * pad)
        mask, pos = tree_inputs(proposal.parents, start, device)  # [1, n+1, n+1], [1, n+1]
        masks.append(F.pad(mask, (0, pad, 0, pad)) | eye)
        positions.append(F.pad(pos, (0, pad), value=start))
    return host_to_device(tokens, torch.long, device), torch.cat(positions), torch.cat(masks)


def decode_all(target: BatchTarget, jobs: Iterable[RowJob], capacity: int, max_len: int | None = None, *,
               drafter: BatchDrafter | None = None, options: SpecOptions = SpecOptions()
               ) -> Iterator[tuple[Hashable, DecodeResult]]:
    """Decode every job, ``capacity`` rows at a time: jobs join as slots free up; results come as rows finish."""
    decoder = BatchDecoder(target, capacity, max_len, drafter=drafter, options=options)
    pending = iter(jobs)
    while True:
        while decoder.free and (job := next(pending, None)) is not None:
            decoder.add(job)
        if not decoder.active:
            return
        yield from decoder.step()
