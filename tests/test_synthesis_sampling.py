"""Speech samplers (core/sampling.py): each rule on constructed logits, and RAS's closed form against
a literal transcription of CosyVoice's sampling code run by Monte Carlo.

Monte-Carlo bound: with N draws over outcomes with probabilities P, ``E[TV] <= 1/2 sum sqrt(P(1-P)/N)``
and McDiarmid adds ``sqrt(ln(1/delta) / (2N))`` (delta = 1e-6); see test_synthesis_exactness.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from specli.core.logits import filter_logits
from specli.core.sampling import (
    RAS_COSYVOICE,
    VLLM_SPEECHSPEC_CV2,
    VLLM_SPEECHSPEC_CV3,
    SamplerOptions,
    build_sampler,
    default_options,
    nucleus_probs,
    ras_probs,
    request_generator,
    request_seed,
)

DELTA = 1e-6


def probs_of(sampler, logits, prefixes):
    return filter_logits(logits, prefixes, sampler.rules, sampler.params).double().softmax(-1)


def bound(p: torch.Tensor, n: int) -> float:
    return 0.5 * float((p * (1 - p) / n).sqrt().sum()) + math.sqrt(math.log(1 / DELTA) / (2 * n))


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a / a.sum() - b / b.sum()).abs().sum())


# ---- a literal transcription of upstream CosyVoice (cosyvoice/utils/common.py, cosyvoice/llm/llm.py);
# the only change: the random draws take an explicit generator ----

def up_nucleus_sampling(weighted_scores, top_p=0.8, top_k=25, g=None):
    prob, indices = [], []
    cum_prob = 0.0
    sorted_value, sorted_idx = weighted_scores.softmax(dim=0).sort(descending=True, stable=True)
    for i in range(len(sorted_idx)):
        if cum_prob < top_p and len(prob) < top_k:
            cum_prob += sorted_value[i]
            prob.append(sorted_value[i])
            indices.append(sorted_idx[i])
        else:
            break
    prob = torch.tensor(prob).to(weighted_scores)
    indices = torch.tensor(indices, dtype=torch.long)
    return indices[prob.multinomial(1, replacement=True, generator=g)].item()


def up_random_sampling(weighted_scores, decoded_tokens, sampling, g=None):
    return weighted_scores.softmax(dim=0).multinomial(1, replacement=True, generator=g).item()


def up_ras_sampling(weighted_scores, decoded_tokens, sampling, top_p=0.8, top_k=25, win_size=10, tau_r=0.1, g=None):
    """Current upstream: the repeated token is set to -inf (in place) before the fallback draw."""
    top_ids = up_nucleus_sampling(weighted_scores, top_p=top_p, top_k=top_k, g=g)
    rep_num = (torch.tensor(decoded_tokens[-win_size:]) == top_ids).sum().item()
    if rep_num >= win_size * tau_r:
        weighted_scores[top_ids] = -float("inf")
        top_ids = up_random_sampling(weighted_scores, decoded_tokens, sampling, g=g)
    return top_ids


def up_ras_sampling_2024(weighted_scores, decoded_tokens, sampling, top_p=0.8, top_k=25, win_size=10, tau_r=0.1,
                         g=None):
    """Older upstream: the fallback draws from the full softmax (the repeated token included)."""
    top_ids = up_nucleus_sampling(weighted_scores, top_p=top_p, top_k=top_k, g=g)
    rep_num = (torch.tensor(decoded_tokens[-win_size:]) == top_ids).sum().item()
    if rep_num >= win_size * tau_r:
        top_ids = up_random_sampling(weighted_scores, decoded_tokens, sampling, g=g)
    return top_ids


def up_sampling_ids(weighted_scores, decoded_tokens, sampling, ignore_eos, speech_token_size, g):
    """Current ``Qwen2LM.sampling_ids``: mask ``speech_token_size`` below min length, then RAS."""
    if ignore_eos is True:
        weighted_scores[speech_token_size] = -float("inf")
    return up_ras_sampling(weighted_scores, decoded_tokens, sampling, g=g)


def up_sampling_ids_retry(weighted_scores, decoded_tokens, sampling, ignore_eos, speech_token_size, g):
    """Older ``Qwen2LM.sampling_ids``: draw again while the token is a stop id (>= speech_token_size)."""
    num_trials, max_trials = 0, 100
    while True:
        top_ids = up_ras_sampling_2024(weighted_scores, decoded_tokens, sampling, g=g)
        if (not ignore_eos) or (top_ids < speech_token_size):
            break
        num_trials += 1
        if num_trials > max_trials:
            raise RuntimeError("sampling reaches max_trials and still get eos when ignore_eos is True")
    return top_ids


# Rows where every part of RAS matters. Plain: token 2 dominates and sits in the window, token 0 (in the
# nucleus) too. Below min length: the masked id 5 ("speech_token_size") dominates, so masking it changes
# the nucleus, and ids 6..9 are the other stop ids of the retry variant.
LOGITS = torch.tensor([1.2, 0.3, 2.4, 0.9, -0.5, 1.0, 0.6, -1.0, -0.2, 0.1])
LOGITS_MASKED = torch.tensor([1.2, 0.3, 1.9, 0.9, -0.5, 2.6, 0.6, -1.0, -0.2, 0.1])
WINDOW = [4, 2, 9, 0, 2]  # generated tokens (only the last 10 count)
SIZE = 5  # "speech_token_size": id masked below min length; ids >= 5 are stop ids in the retry variant
VARIANTS = {
    "current": RAS_COSYVOICE,  # mask below min length, fallback without the repeated token
    "nucleus only": SamplerOptions("ras", tau_r=2.0),  # no repetition check at all
    "full fallback": SamplerOptions("ras", ras_fallback="full"),
    "retry": SamplerOptions("ras", min_len_rule="retry"),
    "2024": SamplerOptions("ras", min_len_rule="retry", ras_fallback="full"),  # older upstream
}
CASES = {  # name: (logits, below min length, mask ids, variant, upstream draw, variants it must be told from)
    "ras": (LOGITS, False, SIZE, "current", "current", ["nucleus only", "full fallback"]),
    "ras below min length": (LOGITS_MASKED, True, SIZE, "current", "current",
                             ["nucleus only", "full fallback", "retry", "2024"]),
    "ras 2024 retry below min length": (LOGITS_MASKED, True, list(range(SIZE, 10)), "2024", "2024",
                                        ["nucleus only", "current", "full fallback", "retry"]),
}


def monte_carlo(draw, logits: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(len(logits), dtype=torch.float64)
    for _ in range(n):
        counts[draw(logits.clone().log_softmax(-1), g)] += 1  # upstream samples from log-probs
    return counts


@pytest.mark.parametrize("case", list(CASES))
def test_ras_closed_form_equals_the_upstream_procedure(case):
    logits, short, mask_ids, variant, upstream, others = CASES[case]
    n, min_len = 6000, len(WINDOW) + 1 if short else 0

    def closed(name):
        sampler = build_sampler(VARIANTS[name], min_len_mask_id=mask_ids, min_len=min_len)
        return probs_of(sampler, logits[None], [WINDOW])[0]

    def draw(scores, g):
        if upstream == "2024":
            return up_sampling_ids_retry(scores, WINDOW, 25, short, SIZE, g)
        return up_sampling_ids(scores, WINDOW, 25, short, SIZE, g)

    counts = monte_carlo(draw, logits, n, seed=len(case))
    p = closed(variant)
    assert tv(counts, p) < bound(p, n)
    for other in others:  # power: the other variants are farther than the bound
        assert tv(counts, closed(other)) > bound(p, n), f"{case}: indistinguishable from {other}"


def test_ras_closed_form_by_hand():
    """Three tokens, nucleus {0, 1}, token 0 repeated: p_RAS = N(1) e_1 + N(0) p(.)[x != 0] / (1 - p(0))."""
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    scores = p.log()[None]
    nucleus = torch.tensor([0.5, 0.3, 0.0], dtype=torch.float64) / 0.8
    expect = torch.tensor([0.0, nucleus[1], 0.0], dtype=torch.float64)
    expect += nucleus[0] * torch.tensor([0.0, 0.3, 0.2], dtype=torch.float64) / 0.5
    got = ras_probs(scores, [[0]], top_p=0.8, top_k=25, win_size=10, tau_r=0.1)[0]
    assert torch.allclose(got, expect, atol=1e-12)
    assert torch.allclose(got.sum(), torch.tensor(1.0, dtype=torch.float64))
    # out of the window (win_size 1: only the last token counts) nothing is resampled
    assert torch.allclose(ras_probs(scores, [[0, 2]], 0.8, 25, 1, 0.1)[0], nucleus)


def test_nucleus_rule_keeps_the_crossing_token_caps_at_top_k_and_breaks_ties_by_index():
    p = torch.tensor([0.1, 0.45, 0.1, 0.3, 0.05], dtype=torch.float64)
    n = nucleus_probs(p.log()[None], top_p=0.8, top_k=25)[0]
    assert (n > 0).tolist() == [True, True, False, True, False]  # 0.45, 0.3 (0.75 < 0.8), then 0.1 of id 0
    assert (nucleus_probs(p.log()[None], 0.8, 2)[0] > 0).tolist() == [False, True, False, True, False]
    assert (nucleus_probs(p.log()[None], 0.2, 25)[0] > 0).tolist() == [False, True, False, False, False]
    assert torch.allclose(n.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_min_length_masks_the_given_id_cv2_and_cv3_quirk():
    logits = torch.zeros(2, 8)
    logits[:, 5:7] = 1.5  # sos-like id 5 and eos 6, both likely
    cv3 = build_sampler(RAS_COSYVOICE, min_len_mask_id=5, min_len=2)  # sos masked; eos 6 stays allowed
    p = probs_of(cv3, logits, [[1], [1, 2]])
    assert float(p[0, 5]) == 0.0 and float(p[0, 6]) > 0.2 and float(p[1, 5]) > 0.2
    cv2 = build_sampler(RAS_COSYVOICE, min_len_mask_id=6, min_len=2)  # eos masked
    p = probs_of(cv2, logits, [[1], [1, 2]])
    assert float(p[0, 6]) == 0.0 and float(p[1, 6]) > 0.2
    logits[:, 6] = 5.0
    greedy = build_sampler(SamplerOptions("greedy"), min_len_mask_id=6, min_len=2)
    out = filter_logits(logits, [[1], [1, 2]], greedy.rules, greedy.params)
    assert out.argmax(-1).tolist() == [5, 6] and greedy.params.greedy


def test_vllm_repetition_penalty_counts_prompt_and_output_tokens():
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.5, 0.0]])
    s = build_sampler(SamplerOptions("vllm", repetition_penalty=2.0), prompt_tokens=[0, 1])
    got = filter_logits(logits, [[3, 3]], s.rules, s.params)
    expect = torch.tensor([[1.0, -4.0, 1.0, -2.0, 0.5, 0.0]]).log_softmax(-1)  # prompt 0, 1; output 3
    assert torch.allclose(got, expect, atol=1e-6)
    # temperature divides the penalised logits
    s = build_sampler(SamplerOptions("vllm", temperature=0.5, repetition_penalty=2.0), prompt_tokens=[0])
    got = filter_logits(logits, [[]], s.rules, s.params)
    assert torch.allclose(got, (torch.tensor([[1.0, -2.0, 1.0, -1.0, 0.5, 0.0]]) / 0.5).log_softmax(-1), atol=1e-6)
    assert s.params.repetition_penalty == 1.0 and s.params.temperature == 1.0  # nothing applied twice


def test_vllm_min_tokens_masks_every_stop_id_and_top_k_comes_before_top_p():
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()[None].expand(3, -1)
    s = build_sampler(SamplerOptions("vllm"), stop_ids=[0, 1], min_len=2)
    p = probs_of(s, logits, [[], [2], [2, 3]])
    assert p[:2, :2].abs().max() == 0 and float(p[2, 0]) == pytest.approx(0.4)
    # top-k 2 renormalises {0.4, 0.3} -> {0.571, 0.429}; top-p 0.5 then keeps token 0 alone
    # (top-p first would keep {0, 1})
    s = build_sampler(SamplerOptions("vllm", top_k=2, top_p=0.5))
    assert (probs_of(s, logits[:1], [[]])[0] > 0).tolist() == [True, False, False, False]
    s = build_sampler(SamplerOptions("vllm", temperature=0.0, repetition_penalty=4.0), prompt_tokens=[0])
    assert s.params.greedy and int(filter_logits(logits[:1], [[]], s.rules, s.params).argmax()) == 1


def test_stop_ids_merge_into_one_without_changing_the_distribution():
    logits = torch.randn(3, 9, generator=torch.Generator().manual_seed(0))
    prefixes = [[1], [1, 2, 1], [3, 3, 3, 4]]
    for opts in (RAS_COSYVOICE, VLLM_SPEECHSPEC_CV3, SamplerOptions("vllm", temperature=0.7, top_p=0.9)):
        plain = build_sampler(opts, prompt_tokens=[2], stop_ids=[6, 7, 8], min_len_mask_id=6, min_len=2)
        merged = build_sampler(opts, prompt_tokens=[2], stop_ids=[6, 7, 8], min_len_mask_id=6, min_len=2,
                               stop_into=7)
        a, b = probs_of(plain, logits, prefixes), probs_of(merged, logits, prefixes)
        assert torch.allclose(a[:, :6], b[:, :6], atol=1e-6)
        assert torch.allclose(a[:, 6:].sum(-1), b[:, 7], atol=1e-6) and float(b[:, [6, 8]].abs().max()) == 0.0
    g_plain = build_sampler(SamplerOptions("greedy"), stop_ids=[6, 7, 8])
    g_merged = build_sampler(SamplerOptions("greedy"), stop_ids=[6, 7, 8], stop_into=6)
    for row in logits:
        want = int(row.argmax())
        got = int(filter_logits(row[None], [[]], g_merged.rules, g_merged.params).argmax())
        assert got == (6 if want >= 6 else want)
        assert int(filter_logits(row[None], [[]], g_plain.rules, g_plain.params).argmax()) == want


def test_rules_are_pure():
    logits = torch.randn(2, 9, generator=torch.Generator().manual_seed(1))
    before = logits.clone()
    for opts in (RAS_COSYVOICE, VLLM_SPEECHSPEC_CV2, VLLM_SPEECHSPEC_CV3, SamplerOptions("greedy")):
        s = build_sampler(opts, prompt_tokens=[1], stop_ids=[6], min_len_mask_id=6, min_len=3, stop_into=6)
        first = s.rules(logits, [[1, 2], [2]])
        assert torch.equal(logits, before)
        assert torch.equal(first, s.rules(logits, [[1, 2], [2]]))


def test_options_defaults_and_validation():
    assert (RAS_COSYVOICE.top_p, RAS_COSYVOICE.top_k, RAS_COSYVOICE.win_size, RAS_COSYVOICE.tau_r) == (0.8, 25, 10, 0.1)
    assert (VLLM_SPEECHSPEC_CV2.temperature, VLLM_SPEECHSPEC_CV2.top_p, VLLM_SPEECHSPEC_CV2.top_k) == (0.8, 0.95, 50)
    cv3 = VLLM_SPEECHSPEC_CV3
    assert (cv3.top_k, cv3.repetition_penalty, cv3.top_p, cv3.temperature) == (15, 1.1, 1.0, 1.0)
    assert default_options("vllm", "cosyvoice3") == VLLM_SPEECHSPEC_CV3
    assert default_options("vllm") == VLLM_SPEECHSPEC_CV2 and default_options("ras") == RAS_COSYVOICE
    for bad in (dict(name="ras", temperature=0.7), dict(name="ras", repetition_penalty=1.1),
                dict(name="greedy", top_p=0.9), dict(name="vllm", top_p=0.0), dict(name="vllm", top_k=-1),
                dict(name="vllm", temperature=-1.0), dict(name="ras", win_size=0), dict(name="beam")):
        with pytest.raises(ValueError):
            SamplerOptions(**bad)
    with pytest.raises(ValueError):
        build_sampler(RAS_COSYVOICE, stop_ids=[6], stop_into=7)


def test_one_generator_per_request_is_independent_of_batch_order():
    assert request_seed(1234, "utt-7") == request_seed(1234, "utt-7")
    assert len({request_seed(1234, k) for k in ("utt-1", "utt-2", "utt-3")} | {request_seed(1, "utt-1")}) == 4
    a = torch.rand(4, generator=request_generator(5, "x"))
    assert torch.equal(a, torch.rand(4, generator=request_generator(5, "x")))


def test_degenerate_rows_stay_finite():
    # the repeated token holds all the mass: upstream's fallback would be undefined; it is kept
    scores = torch.tensor([[0.0, float("-inf"), float("-inf")]])
    assert ras_probs(scores, [[0]], 0.8, 25, 10, 0.1)[0].tolist() == [1.0, 0.0, 0.0]
    # nearly all the mass on a repeated token: the fallback renormalises the tiny rest exactly
    scores = torch.tensor([[25.0, 0.0, 1.0]], dtype=torch.float64)
    got = ras_probs(scores, [[0]], 0.8, 25, 10, 0.1)[0]
    assert float(got[0]) == 0.0
    assert torch.allclose(got[1:], torch.tensor([0.0, 1.0], dtype=torch.float64).softmax(-1), atol=1e-12)
    # a row whose only finite token is the masked id keeps it (upstream would raise)
    s = build_sampler(RAS_COSYVOICE, min_len_mask_id=2, min_len=5)
    p = probs_of(s, torch.tensor([[float("-inf"), float("-inf"), 1.0]]), [[]])
    assert p[0].tolist() == [0.0, 0.0, 1.0]
    # a real-sized row (CosyVoice2's 6564 outputs) is a distribution
    logits = torch.randn(4, 6564, generator=torch.Generator().manual_seed(3)) * 3
    s = build_sampler(RAS_COSYVOICE, stop_ids=[6561, 6562, 6563], min_len_mask_id=6561, min_len=2, stop_into=6561)
    top = logits.argmax(-1).tolist()
    p = probs_of(s, logits, [[], [top[1]], [top[2]] * 10, [5, top[3]]])
    assert torch.isfinite(p).all() and torch.allclose(p.sum(-1), torch.ones(4, dtype=torch.float64))
    assert float(p[0, 6561]) == 0.0  # below min length (the other stop ids are merged into it)
    assert top[2] < 6561 and float(p[2, top[2]]) == 0.0  # the only repeated token: the fallback excludes it


def test_consecutive_stop_ids_and_one_mask_id_take_the_same_values_as_index_lists():
    """The fast paths (a slice for consecutive stop ids, a column for one mask id) equal the general ones bitwise."""
    from specli.core.sampling import _StopMerge, mask_rows

    x = torch.randn(5, 40, generator=torch.Generator().manual_seed(3)) * 4
    ids = torch.arange(30, 40)
    for greedy in (True, False):
        stops = x.index_select(1, ids)  # the general path: index lists
        want = x.index_fill(1, ids, float("-inf"))
        want[:, 31] = stops.max(-1).values if greedy else stops.logsumexp(-1)
        assert torch.equal(_StopMerge(tuple(range(30, 40)), 31, greedy)(x), want)
        scattered = _StopMerge((30, 33, 39), 33, greedy)(x)  # not consecutive: the index path
        assert float(scattered[:, [30, 39]].max()) == float("-inf") and torch.equal(scattered[:, 31:33], x[:, 31:33])
    for flags in ([True] * 5, [False, True, False, True, True]):
        for ids in ((7,), (7, 9)):
            want = x.clone()
            for r, flag in enumerate(flags):
                if flag:
                    want[r, list(ids)] = float("-inf")
            assert torch.equal(mask_rows(x, flags, ids), want)
    dead = torch.full((2, 4), float("-inf"))
    dead[:, 1] = 0.0  # every finite logit on the masked id: the row is left as it is
    assert torch.equal(mask_rows(dead, [True, True], (1,)), dead)
