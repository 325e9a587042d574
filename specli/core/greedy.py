"""Plain autoregressive decoding (greedy, or sampling through the same logit filter).

Greedy decoding here is the reference every speculative strategy must reproduce token for token.
"""

from __future__ import annotations

import time

import torch

from specli.core.job import DecodeJob, prefill, probe_at
from specli.core.logits import choose, filter_with_logprobs
from specli.core.types import DecodeResult, DecodeStats, Target, TargetState


def greedy_decode(target: Target, state: TargetState, job: DecodeJob) -> DecodeResult:
    """Decode ``job``, one target forward a token, from the filtered logits."""
    t0 = time.perf_counter()
    stats = DecodeStats()
    dev = state.cache.device
    # all but the last prompt token in one forward, then that token alone, exactly as the speculative and batched
    # paths score a prompt: a prefill of n or n + 1 rows tiles its attention and matmuls differently, and in half
    # precision that changes the prompt's cached K/V in the last bits (and so, rarely, a greedy token)
    plen = len(job.prompt)
    first = prefill(target, state, job, plen - 1)
    out = target.score(state, torch.tensor([[job.prompt[-1]]], device=dev))
    stats.target_forwards += 1 + int(first.out is not None)
    logits = out.logits[0, -1:]  # [1, vocab]
    probed = first.probed if first.probed is not None else probe_at(job, plen - 1, out.logits[0, -1])
    sampling, generator = job.sampling, job.generator
    sampled: list[int] = []
    sum_logprob, finished = 0.0, False
    where = generator.device if generator is not None else dev  # random numbers are drawn where the generator lives
    row0 = torch.zeros(1, dtype=torch.long, device=dev)  # [1] the one scored row
    while len(sampled) < job.max_new_tokens:
        scored = filter_with_logprobs(logits, [sampled], job.rules, sampling)  # one log_softmax a step
        u = None if sampling.greedy else torch.rand(1, generator=generator, dtype=torch.float64,
                                                    device=where).float().to(dev)
        chosen = choose(scored.logits, sampling, u)  # [1]
        host = torch.cat([chosen.double(), scored.pick(row0, chosen)]).tolist()  # one readback a step
        token = int(host[0])
        sum_logprob += scored.read(host[1:], [0], [token])[0]
        stats.tokens += 1
        stats.record_step(0, 0)  # a token-producing step with no draft (tau = tokens / steps = 1)
        if token == job.eot:
            finished = True
            break
        sampled.append(token)
        if len(sampled) == job.max_new_tokens:
            break
        logits = target.score(state, torch.tensor([[token]], device=dev)).logits[0]
        stats.target_forwards += 1
    stats.decode_seconds = time.perf_counter() - t0
    return DecodeResult(sampled, sum_logprob, probed or 0.0, finished, stats)

