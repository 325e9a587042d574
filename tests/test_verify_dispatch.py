"""``verify()`` dispatch: the Triton kernels (forced with ``backend="triton"``, run on the CPU under
``TRITON_INTERPRET=1``, set in conftest) give exactly the reference's answer for chains and trees,
greedy and sampling, given the same random numbers — called directly and through the real decode
loop (``speculative_decode`` with ``SpecOptions(verify_backend=...)``), token for token.
"""

from __future__ import annotations

import pytest
import torch

from specli.asr.drafters.model import ModelDrafter, ModelDraftOptions
from specli.core.job import DecodeJob, Probe
from specli.core.logits import SamplingParams
from specli.core.speculative import SpecOptions, speculative_decode
from specli.core.tree import is_chain
from specli.core.verify import verify
from tiny_models import (EOT, NO_TS, SOT, NoisyTreeDrafter, RandomTreeDrafter, count_kernel_calls, random_verify_case,
                         tiny_rules, tiny_target, window)

kernels = pytest.importorskip("specli.core.verify.triton_kernels", reason="triton is not installed")

TARGET = tiny_target(0)
OTHER = tiny_target(1, layers=1)
SAMPLING = SamplingParams(temperature=0.9, top_k=20, top_p=0.92, repetition_penalty=1.3)


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts calls of each kernel wrapper (the real functions still run)."""
    return count_kernel_calls(monkeypatch, kernels)


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("chain", [True, False])
@pytest.mark.parametrize("with_q", [True, False])
@pytest.mark.parametrize("seed", range(5))
def test_verify_triton_backend_equals_reference(greedy, chain, with_q, seed, kernel_calls):
    g = torch.Generator().manual_seed(seed * 10 + 2 * chain + with_q)
    b, n, v = 3, int(torch.randint(1, 9, (1,), generator=g)), [50, 1100, 2600][seed % 3]
    logits, proposal = random_verify_case(g, chain or n == 1, with_q, b, n, v)
    ua, us = torch.rand(b, n, generator=g), torch.rand(b, n + 1, generator=g)
    ref = verify(logits, proposal, greedy, ua, us, backend="reference")
    got = verify(logits, proposal, greedy, ua, us, backend="triton")
    for r, k in zip(ref, got):
        assert torch.equal(r, k)
    kind = ("chain" if is_chain(proposal.parents) else "tree")
    assert kernel_calls == {f"{'greedy' if greedy else 'sample'}_{kind}": 1}


def test_auto_backend_uses_the_reference_on_cpu_tensors(kernel_calls):
    g = torch.Generator().manual_seed(0)
    logits, proposal = random_verify_case(g, False, True, 2, 5, 64)
    verify(logits, proposal, False, torch.rand(2, 5, generator=g), torch.rand(2, 6, generator=g))
    assert kernel_calls == {}


def test_unknown_backends_are_refused():
    g = torch.Generator().manual_seed(0)
    logits, proposal = random_verify_case(g, True, False, 1, 2, 10)
    with pytest.raises(ValueError, match="backend"):
        verify(logits, proposal, True, torch.zeros(1, 2), torch.zeros(1, 3), backend="cuda")
    with pytest.raises(ValueError, match="verify_backend"):
        SpecOptions(verify_backend="fast")


def test_triton_backend_on_cpu_tensors_needs_the_interpreter(monkeypatch):
    g = torch.Generator().manual_seed(0)
    logits, proposal = random_verify_case(g, True, False, 1, 2, 10)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # read at dispatch: compiled kernels cannot take CPU tensors
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        verify(logits, proposal, True, torch.zeros(1, 2), torch.zeros(1, 3), backend="triton")


DRAFTERS = {
    "chain": lambda seed: ModelDrafter(OTHER),
    "sparse-tree": lambda seed: ModelDrafter(OTHER, ModelDraftOptions(confidence_threshold=0.4, tree_topk=2,
                                                                      tree_threshold=0.9)),
    "self-sparse-tree": lambda seed: ModelDrafter(  # the target drafts itself: q == p, most nodes accepted
        TARGET, ModelDraftOptions(confidence_threshold=0.6, tree_topk=2, tree_threshold=0.99), share_encoder=True),
    "random-tree": lambda seed: RandomTreeDrafter(seed),
    "noisy-self-tree": lambda seed: NoisyTreeDrafter(  # the target itself, corrupted: long accepted paths
        ModelDrafter(TARGET, ModelDraftOptions(confidence_threshold=0.5), share_encoder=True), seed, corrupt=0.3),
}


def _decode(name: str, seed: int, sampling: SamplingParams, backend: str, timestamps: bool):
    prompt = [SOT, 7] + ([] if timestamps else [NO_TS])
    job = DecodeJob(prompt, tiny_rules(timestamps), EOT, 30, sampling=sampling,
                    generator=torch.Generator().manual_seed(seed), probe=Probe(0, 1))
    return speculative_decode(TARGET, window(TARGET, seed), job, DRAFTERS[name](seed),
                              SpecOptions(max_draft=6, verify_backend=backend))


@pytest.mark.parametrize("name", sorted(DRAFTERS))
@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("seed", [3, 11])
def test_decode_loop_with_triton_kernels_equals_reference(name, greedy, seed, kernel_calls):
    sampling = SamplingParams() if greedy else SAMPLING
    ref = _decode(name, seed, sampling, "reference", timestamps=seed % 2 == 0)
    assert kernel_calls == {}
    got = _decode(name, seed, sampling, "triton", timestamps=seed % 2 == 0)
    assert got.tokens == ref.tokens
    assert got.finished == ref.finished
    assert got.sum_logprob == pytest.approx(ref.sum_logprob, abs=1e-9)
    assert got.stats.accepted == ref.stats.accepted and got.stats.verify_steps == ref.stats.verify_steps
    if name == "self-sparse-tree" or (name == "noisy-self-tree" and greedy):
        assert got.stats.accepted >= 10  # accepted paths of several nodes, not only first-node rejections
    mode = "greedy" if greedy else "sample"
    assert kernel_calls.get(f"{mode}_chain", 0) + kernel_calls.get(f"{mode}_tree", 0) == got.stats.verify_steps
    if name != "chain":
        assert kernel_calls.get(f"{mode}_tree", 0) > 0  # trees really went through the tree kernel


def test_sampled_decode_depends_on_the_seed_so_equality_is_not_vacuous():
    a = _decode("sparse-tree", 3, SAMPLING, "triton", timestamps=False)
    job = DecodeJob([SOT, 7, NO_TS], tiny_rules(False), EOT, 30, sampling=SAMPLING,
                    generator=torch.Generator().manual_seed(4), probe=Probe(0, 1))
    b = speculative_decode(TARGET, window(TARGET, 3), job, DRAFTERS["sparse-tree"](3),
                           SpecOptions(max_draft=6, verify_backend="triton"))
    assert a.tokens != b.tokens
