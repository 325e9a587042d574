"""Plain beam search over the static KV cache (openai-whisper's ``BeamSearchDecoder``).

Not speculative: the ``beam_size`` hypotheses are the rows of one batched decoder state (the
cache's batch dimension), reordered after each step so row ``i`` holds hypothesis ``i``'s keys and
values. Each step extends every hypothesis by its ``beam_size + 1`` most likely tokens (under the
shared logit filter), keeps the ``beam_size`` best unfinished ones by summed log-probability and
collects finished ones until ``round(beam_size * patience)`` have ended; the winner is ranked by
log-probability over length (``MaximumLikelihoodRanker``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specli.core.job import DecodeJob, prefill
from specli.core.logits import filter_with_logprobs
from specli.core.types import BeamTarget, DecodeResult, DecodeStats, TargetState


@dataclass(frozen=True)
class BeamOptions:
    """openai-whisper's beam search settings."""

    beam_size: int = 5  # hypotheses kept per step
    patience: float | None = None  # stop after round(beam_size * patience) finished (None: 1.0)
    length_penalty: float | None = None  # ranking: None divides by length, else ((5 + n) / 6) ** alpha

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError("beam_size must be >= 1")


def beam_decode(target: BeamTarget, state: TargetState, job: DecodeJob, beam: BeamOptions = BeamOptions()
                ) -> DecodeResult:
    """Decode ``job`` by beam search (greedy rules, no sampling); same result contract as ``greedy_decode``."""
    t0 = time.perf_counter()
    stats = DecodeStats()
    dev = state.cache.device
    first = prefill(target, state, job, len(job.prompt), last=True)  # the prompt once, then copied to every row
    stats.target_forwards += 1
    beams = target.widen(state, beam.beam_size)
    logits = first.out.logits[0, -1:]  # [rows, vocab]: one distinct row before the first step
    seqs: list[tuple[int, ...]] = [()]
    sums = [0.0]
    finished: dict[tuple[int, ...], float] = {}
    max_candidates = max(1, round(beam.beam_size * (beam.patience or 1.0)))
    for _step in range(job.max_new_tokens):
        logp = filter_with_logprobs(logits, [list(s) for s in seqs], job.rules).exact()  # [rows, vocab], 1 log_softmax
        seqs, sums, sources, ended = _extend(seqs, sums, logp, beam.beam_size, job.eot)
        for seq in sorted(ended, key=ended.get, reverse=True):
            if len(finished) >= max_candidates:
                break
            finished[seq] = ended[seq]
        if len(finished) >= max_candidates or beams.cache.length + 1 > beams.cache.max_len:
            break
        beams.cache.reorder(sources)
        step = torch.tensor([[s[-1]] for s in seqs], device=dev)
        logits = target.score(beams, step).logits[:, -1]
        stats.target_forwards += 1
    best, sum_logprob, ended_by_eot = _finalize(finished, seqs, sums, beam.beam_size, beam.length_penalty)
    stats.tokens = len(best) + int(ended_by_eot)
    stats.decode_seconds = time.perf_counter() - t0
    return DecodeResult(list(best), sum_logprob, first.probed or 0.0, ended_by_eot, stats)


def _extend(seqs, sums, logp: torch.Tensor, beam_size: int, eot: int):
    """Candidates of one step: the ``beam_size`` best unfinished ones (with their source rows) and
    the finished ones (ending in eot), as openai-whisper ranks them."""
    scores: dict[tuple[int, ...], float] = {}
    sources: dict[tuple[int, ...], int] = {}
    top = logp.topk(beam_size + 1, dim=-1)
    for i, seq in enumerate(seqs):
        for lp, tok in zip(top.values[i].tolist(), top.indices[i].tolist()):
            new = (*seq, tok)
            scores[new] = sums[i] + lp
            sources[new] = i
    kept, kept_sums, kept_src, ended = [], [], [], {}
    for new in sorted(scores, key=scores.get, reverse=True):
        if new[-1] == eot:
            ended[new] = scores[new]
        else:
            kept.append(new)
            kept_sums.append(scores[new])
            kept_src.append(sources[new])
            if len(kept) == beam_size:
                break
    return kept, kept_sums, kept_src, ended


def _finalize(finished, seqs, sums, beam_size: int, length_penalty: float | None):
    """The winner's tokens (eot excluded), summed log-probability and whether it ended with eot;
    unfinished hypotheses fill in when fewer than ``beam_size`` finished (openai-whisper's ``finalize``)."""
    candidates = {seq[:-1]: (lp, True) for seq, lp in finished.items()}
    for seq, lp in sorted(zip(seqs, sums), key=lambda x: x[1], reverse=True):
        if len(candidates) >= beam_size:
            break
        candidates.setdefault(seq, (lp, False))

    def score(item) -> float:
        seq, (lp, _ended) = item
        n = len(seq)
        penalty = n if length_penalty is None else ((5 + n) / 6) ** length_penalty
        return lp / penalty if penalty else lp

    seq, (lp, ended) = max(candidates.items(), key=score)
    return seq, lp, ended
