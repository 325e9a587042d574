"""Lossless speculative decoding: a drafter proposes, the target verifies in one forward, commit.

The cache holds every committed token except the *pending* one (the last committed token). Each
step scores ``[pending] + draft`` (a chain or a tree) in one target forward, verifies the draft
against the filtered target rows, keeps the accepted path in the cache (``crop`` / ``compact``)
and emits the accepted tokens plus one target token (recovered or bonus), which becomes pending.
Greedy output equals :func:`specli.core.greedy.greedy_decode`; sampled output follows the
target's distribution. Both take the same :class:`~specli.core.job.DecodeJob`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specli.core.device import host_to_device
from specli.core.drafters.base import Drafter, DraftProposal, DraftRequest
from specli.core.goodput import Costs, GoodputController
from specli.core.job import DecodeJob, prefill, probe_at
from specli.core.logits import Filtered, LogitFilter, SamplingParams
from specli.core.tree import depths, is_chain, tree_inputs
from specli.core.types import DecodeResult, DecodeStats, Target, TargetState
from specli.core.verify import BACKENDS, Backend, verify


@dataclass(frozen=True)
class SpecOptions:
    """Speculation settings shared by every drafter (how tokens are chosen lives with the job)."""

    max_draft: int = 8  # most draft tokens (tree nodes) per target forward
    verify_backend: Backend = "auto"  # verify kernels: auto (Triton on CUDA, torch elsewhere), reference, triton
    # stop drafting for the rest of a window once its accepted draft tokens per target forward fall below
    # this, judged from the PROBE_FORWARDS-th forward on (drafting that is rarely accepted only costs); 0 = never
    stop_below: float = 0.0
    # goodput-driven draft length (specli.core.goodput): each step drafts as many tokens (0 included) as maximise
    # expected committed tokens per second under these costs (learnt online or given); None: max_draft and the
    # drafter's own stopping rule
    costs: Costs | None = None
    # batched decoding drafts only while at most this many rows are active: a row admitted beside as many others
    # never drafts, and every row decodes plainly while more are active (None: no limit). On the CPU a batched
    # forward is dear enough that plain rows beat drafted ones (docs/benchmarks/whisper-cpu)
    max_draft_rows: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.max_draft <= 64:
            raise ValueError("max_draft must be within 0..64")
        if not 0.0 <= self.stop_below < 64:
            raise ValueError("stop_below must be within [0, 64)")
        if self.max_draft_rows is not None and self.max_draft_rows < 1:
            raise ValueError("max_draft_rows must be >= 1 (or None)")
        if self.verify_backend not in BACKENDS:
            raise ValueError(f"verify_backend must be one of {BACKENDS}")


PROBE_FORWARDS = 6  # target forwards of a window before SpecOptions.stop_below judges its acceptance


def drafting_pays(stats: DecodeStats, stop_below: float) -> bool:
    """Whether a window keeps drafting: always during its first ``PROBE_FORWARDS`` forwards, then while its
    accepted draft tokens per forward stay at or above ``stop_below`` (0: always). Speed only: every
    forward is verified the same way, drafted or not."""
    if stop_below <= 0 or stats.verify_steps < PROBE_FORWARDS:
        return True
    return stats.accepted >= stop_below * stats.verify_steps


def speculative_decode(target: Target, state: TargetState, job: DecodeJob, drafter: Drafter,
                       options: SpecOptions = SpecOptions()) -> DecodeResult:
    """Decode ``job`` with ``drafter``; the same tokens as :func:`~specli.core.greedy.greedy_decode` (greedy)
    or the same distribution (sampling, from ``job.generator``)."""
    t_start = time.perf_counter()
    stats = DecodeStats()
    plen, gen = len(job.prompt), job.generator
    filt = LogitFilter(job.rules, job.sampling)
    first = prefill(target, state, job, plen - 1)  # all but the pending token, which the first step scores
    stats.target_forwards += int(first.out is not None)
    probed, hidden = first.probed, None if first.out is None else first.out.hidden
    t_draft = time.perf_counter()
    drafter.start(state, list(job.prompt))
    stats.draft_seconds += time.perf_counter() - t_draft
    tokens = list(job.prompt)
    sum_logprob, finished = 0.0, False
    ctrl = None if options.costs is None else GoodputController(options.costs)
    while not finished and len(tokens) - plen < job.max_new_tokens:
        room = draft_room(options, stats, ctrl, job.max_new_tokens - (len(tokens) - plen) - 1,
                          state.cache.max_len - state.cache.length - 2)
        t0 = time.perf_counter()
        req = DraftRequest(tokens, plen, room, state, hidden, filt, job.sampling.greedy, gen,
                           None if ctrl is None else ctrl.keep_drafting)
        proposal = drafter.propose(req) if room > 0 else DraftProposal([], [])
        t1 = time.perf_counter()
        emitted, logprobs, hidden, rows0 = _verify_step(target, state, tokens, plen, proposal, filt, job.sampling,
                                                        gen, options.verify_backend)
        if stats.verify_steps == 0:  # the first step scored the pending prompt token
            probed = probe_at(job, plen - 1, rows0) if probed is None else probed
        t2 = time.perf_counter()
        stats.target_forwards += 1
        stats.draft_seconds += t1 - t0
        stats.verify_seconds += t2 - t1
        stats.drafted += len(proposal)
        used, sum_logprob, finished = commit_emitted(tokens, emitted, logprobs, sum_logprob, plen, job.eot,
                                                     job.max_new_tokens)
        stats.tokens += used
        stats.record_step(max(depths(proposal.parents), default=0), used - 1)
        if ctrl is not None:
            learn(ctrl, proposal, used - 1, t1 - t0, t2 - t1, rows=1)
        t2 = time.perf_counter()
        drafter.commit(tokens)
        stats.draft_seconds += time.perf_counter() - t2
    stats.decode_seconds = time.perf_counter() - t_start
    return DecodeResult(tokens[plen:], sum_logprob, probed or 0.0, finished, stats)


def draft_room(options: SpecOptions, stats: DecodeStats, ctrl: GoodputController | None, left: int,
               cache_room: int) -> int:
    """Most draft tokens this step: the options' cap, the tokens left, the cache's room; 0 when drafting does not
    pay (the window's acceptance fell below ``stop_below``, or the goodput rule prefers plain decoding)."""
    if not drafting_pays(stats, options.stop_below) or (ctrl is not None and not ctrl.should_draft()):
        return 0
    return max(0, min(options.max_draft, left, cache_room))


def learn(ctrl: GoodputController, proposal: DraftProposal, accepted: int, draft_s: float, verify_s: float,
          rows: int) -> None:
    """After a verified step: calibrate acceptance on the main chain's confidences and feed the measured costs
    (a tree's nodes past the chain are the tree's own business)."""
    chain = chain_of(proposal)
    ctrl.record(chain, min(accepted, len(chain)))
    ctrl.costs.record_draft(draft_s, len(proposal))
    ctrl.costs.record_verify(rows, len(proposal) + 1, verify_s)


def chain_of(proposal: DraftProposal) -> list[float]:
    """Confidences of the proposal's chain: its first nodes, each the previous one's child."""
    n = 0
    while n < len(proposal.parents) and proposal.parents[n] == n - 1:
        n += 1
    return list(proposal.confidence[:n])


def commit_emitted(tokens: list[int], emitted: list[int], logprobs: list[float], sum_logprob: float, plen: int,
                   eot: int, max_new_tokens: int) -> tuple[int, float, bool]:
    """Append a step's emitted tokens to ``tokens`` until eot or the length limit: how many were used
    (eot included), the running sum of log-probabilities, and whether eot was reached."""
    used = 0
    for tok, lp in zip(emitted, logprobs):
        used += 1
        sum_logprob += lp
        if tok == eot:
            return used, sum_logprob, True
        tokens.append(tok)
        if len(tokens) - plen == max_new_tokens:
            break
    return used, sum_logprob, False


def _verify_step(target, state, tokens, plen, proposal: DraftProposal, filt, sampling: SamplingParams, gen,
                 backend: Backend):
    """One target forward over ``[pending] + proposal``; returns emitted tokens and their log-probs."""
    start, dev = state.cache.length, state.cache.device
    scored = host_to_device([[tokens[-1], *proposal.tokens]], torch.long, dev)
    if is_chain(proposal.parents):  # the causal default: a target may compute a chain as it computes AR steps
        out = target.score(state, scored)
    else:
        mask, positions = tree_inputs(proposal.parents, start, dev)
        out = target.score(state, scored, positions=positions, tree_mask=mask)
    kept, emitted, logprobs = accept_draft(out.logits[0], tokens[plen:], proposal, filt, sampling, gen, backend)
    state.cache.compact(start, [start] + [start + 1 + i for i in kept])
    return emitted, logprobs, out.hidden.select([0] + [i + 1 for i in kept]), out.logits[0, 0]


def accept_draft(logits: torch.Tensor,  # [n+1, vocab] raw target logits of [pending] + proposal
                 sampled: list[int], proposal: DraftProposal, filt, sampling: SamplingParams,
                 gen: torch.Generator | None, backend: Backend = "auto") -> tuple[list[int], list[int], list[float]]:
    """Verify one row's draft: accepted node indices, emitted tokens (accepted + the target's next token)
    and their log-probabilities. ``sampled`` are the row's tokens after the prompt; ``filt`` its filter."""
    n, dev = len(proposal), logits.device
    scored = _filtered(filt, logits, _row_prefixes(sampled, proposal), sampling)  # [n+1, vocab]
    if sampling.greedy:  # greedy verification draws nothing
        u_accept, u_sample = torch.zeros(1, n, device=dev), torch.zeros(1, n + 1, device=dev)
    else:  # drawn where the generator lives (the target's device unless the caller passed another)
        where = gen.device if gen is not None else dev
        u_accept = torch.rand(1, n, generator=gen, dtype=torch.float64, device=where).float().to(dev)
        u_sample = torch.rand(1, n + 1, generator=gen, dtype=torch.float64, device=where).float().to(dev)
    length, path, nxt = verify(scored.logits[None], proposal, sampling.greedy, u_accept, u_sample, backend=backend)
    kept, nxt_tok, logprobs = _read_back(scored, proposal, length, path, nxt)
    return kept, [proposal.tokens[i] for i in kept] + [nxt_tok], logprobs


def _filtered(filt, logits: torch.Tensor, prefixes: list[list[int]], sampling: SamplingParams) -> Filtered:
    """``filt``'s rows and their log-probabilities: one log_softmax through a :class:`LogitFilter`, which shares the
    rules' own, else a second one over the filter's result."""
    if isinstance(filt, LogitFilter):
        return filt.with_logprobs(logits, prefixes)
    return Filtered.of(filt(logits, prefixes), sampling)


def _read_back(scored: Filtered, proposal: DraftProposal, length, path, nxt) -> tuple[list[int], int, list[float]]:
    """The step's one device-to-host readback: accepted nodes, next token, and the log-probabilities of the emitted
    tokens (each accepted node's token at its parent's row, the next token at the row after the path), read from
    every node's and every row's candidates since the path is not known before the readback."""
    n, dev = len(proposal), scored.logits.device
    rows = [p + 1 for p in proposal.parents] + list(range(n + 1))
    picked = scored.pick(host_to_device(rows, torch.long, dev),
                         torch.cat([host_to_device(proposal.tokens, torch.long, dev), nxt.expand(n + 1)]))
    packed = torch.cat([length.double(), path[0].double(), nxt.double(), picked]).tolist()
    kept = [int(i) for i in packed[1 : 1 + int(packed[0])]]
    nxt_tok, host, m = int(packed[1 + n]), packed[2 + n :], 2 * n + 1
    used = kept + [n + (kept[-1] + 1 if kept else 0)]  # the candidates emitted: accepted nodes, then the next token
    tokens = list(proposal.tokens) + [nxt_tok] * (n + 1)
    sub = [host[i] for i in used] + ([host[m + i] for i in used] if scored.stale is not None else [])
    return kept, nxt_tok, scored.read(sub, [rows[i] for i in used], [tokens[i] for i in used])


def _row_prefixes(sampled: list[int], proposal: DraftProposal) -> list[list[int]]:
    """Sampled prefix seen by each scored row: the root row, then each node after its own path."""
    rows = [sampled]
    for i in range(len(proposal)):
        parent = proposal.parents[i]
        rows.append(rows[parent + 1] + [proposal.tokens[i]])
    return rows
