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
from dataclasses import replace

import torch

from specli.core.kv_cache import KVCache
from specli.core.logits import filter_logits
from specli.models.whisper.target import DecoderState
from specli.core.types import DecodeResult, DecodeStats, LogitRules, Target


def beam_decode(
    target: Target,
    state: DecoderState,
    prompt: list[int],
    rules: LogitRules,
    eot: int,
    max_new_tokens: int,
    no_speech: int | None = None,
    sot_index: int = 0,
    *,
    beam_size: int = 5,
    patience: float | None = None,
    length_penalty: float | None = None,
) -> DecodeResult:
    """Decode one window by beam search; same result contract as ``greedy_decode``."""
    t0 = time.perf_counter()
    stats = DecodeStats()
    dev = state.cache.device
    out = target.score(state, torch.tensor([prompt], device=dev))  # the prompt once, then copied to every row
    stats.target_forwards += 1
    no_speech_prob = float(out.logits[0, sot_index].softmax(-1)[no_speech]) if no_speech is not None else 0.0
    beams = widen(state, beam_size)
    logits = out.logits[0, -1:]  # [rows, vocab]: one distinct row before the first step
    seqs: list[tuple[int, ...]] = [()]
    sums = [0.0]
    finished: dict[tuple[int, ...], float] = {}
    max_candidates = max(1, round(beam_size * (patience or 1.0)))
    for _step in range(max_new_tokens):
        logp = torch.log_softmax(filter_logits(logits, [list(s) for s in seqs], rules), -1)  # [rows, vocab]
        seqs, sums, sources, ended = _extend(seqs, sums, logp, beam_size, eot)
        for seq in sorted(ended, key=ended.get, reverse=True):
            if len(finished) >= max_candidates:
                break
            finished[seq] = ended[seq]
        if len(finished) >= max_candidates or beams.cache.length + 1 > beams.cache.max_len:
            break
        _reorder(beams.cache, sources)
        step = torch.tensor([[s[-1]] for s in seqs], device=dev)
        logits = target.score(beams, step).logits[:, -1]
        stats.target_forwards += 1
    best, sum_logprob, ended_by_eot = _finalize(finished, seqs, sums, beam_size, length_penalty)
    stats.tokens = len(best) + int(ended_by_eot)
    stats.decode_seconds = time.perf_counter() - t0
    return DecodeResult(list(best), sum_logprob, no_speech_prob, ended_by_eot, stats)


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


def widen(state: DecoderState, rows: int) -> DecoderState:
    """A ``rows``-row copy of a one-row state: the cache's filled slots copied to every row, the
    encoder output and cross-attention K/V broadcast (views, no copy)."""
    c = state.cache
    layers, _b, heads, max_len, head_dim = c.keys.shape
    cache = KVCache(layers, rows, heads, max_len, head_dim, c.keys.dtype, c.device)
    cache.keys[:, :, :, : c.length] = c.keys[:, :1, :, : c.length]
    cache.values[:, :, :, : c.length] = c.values[:, :1, :, : c.length]
    cache.length = c.length
    cross = tuple((k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in state.cross_kv)
    feats = state.audio_features.expand(rows, -1, -1)
    return replace(state, audio_features=feats, cross_kv=cross, cache=cache, features=None)


@torch.inference_mode()
def _reorder(cache: KVCache, sources: list[int]) -> None:
    """Row ``i`` of the cache takes the filled slots of row ``sources[i]``."""
    n = cache.length
    idx = torch.tensor(sources, dtype=torch.long, device=cache.device)
    cache.keys[:, :, :, :n] = cache.keys[:, :, :, :n].index_select(1, idx)
    cache.values[:, :, :, :n] = cache.values[:, :, :, :n].index_select(1, idx)
