"""The CUDA path (skipped without a CUDA device; ``benchmarks/gpu_check.sh`` runs it with
``TRITON_INTERPRET=0`` so the Triton kernels are compiled for the GPU).

* every verify kernel on CUDA tensors == the pure-torch reference on the CPU, given the same uniforms,
  and ``verify()`` dispatches to them on its own (``backend="auto"``);
* placement: targets, drafters (model, EAGLE head), caches, masks and positions live on the device, and
  no decode step creates a tensor on the CPU (a ``TorchFunctionMode`` watches every torch call);
* every drafter and strategy: speculative greedy == greedy on a tiny random target on CUDA (fp32 and
  fp16, each its own reference), sampled output with the kernels == with the reference;
* real weights (fp16): every shipped speculative preset's transcript == its AR preset's on CUDA.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

# SPECLI_TEST_DEVICE=cpu runs the module on the CPU as a dry run of its own logic (kernels interpreted,
# placement checks trivially true); the real check is on CUDA.
DEV = torch.device(os.environ.get("SPECLI_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(DEV.type == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device")

from conftest import EN_CLIPS, ES_CLIPS  # noqa: E402
from specli.asr.drafters.eagle_head import EagleConfig, SpeechDraftHead  # noqa: E402
from specli.asr.drafters.eagle import EagleDrafter  # noqa: E402
from specli.asr.drafters.model import ModelDrafter, ModelDraftOptions  # noqa: E402
from specli.core.drafters.ngram import NgramDrafter, NgramPool  # noqa: E402
from specli.core.drafters.recycling import RecyclingDrafter  # noqa: E402
from specli.core.greedy import greedy_decode  # noqa: E402
from specli.core.job import DecodeJob, Probe
from specli.core.logits import SamplingParams  # noqa: E402
from specli.core.speculative import SpecOptions, speculative_decode  # noqa: E402
from specli.core.verify import reference, verify  # noqa: E402
from tiny_models import (EOT, NO_TS, SOT, NoisyTreeDrafter, RandomTreeDrafter, count_kernel_calls,  # noqa: E402
                         random_verify_case, tiny_rules, tiny_target, window)

BACKEND = "auto" if DEV.type == "cuda" else "triton"  # on CUDA, verify() must pick the kernels by itself
SAMPLING = SamplingParams(temperature=0.9, top_k=20, top_p=0.92, repetition_penalty=1.3)


def _kernels():
    return pytest.importorskip("specli.core.verify.triton_kernels", reason="triton is not installed")


# ---------------------------------------------------------------- kernels on CUDA tensors


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("chain", [True, False])
@pytest.mark.parametrize("with_q", [True, False])
@pytest.mark.parametrize("seed", range(8))
def test_kernels_on_cuda_equal_the_reference(greedy, chain, with_q, seed, monkeypatch):
    calls = count_kernel_calls(monkeypatch, _kernels())
    g = torch.Generator().manual_seed(1000 + seed)
    b, n, v = 4, int(torch.randint(1, 17, (1,), generator=g)), [51865, 1500, 6561, 48][seed % 4]
    logits, proposal = random_verify_case(g, chain or n == 1, with_q, b, n, v)
    ua, us = torch.rand(b, n, generator=g), torch.rand(b, n + 1, generator=g)
    ref = verify(logits, proposal, greedy, ua, us, backend="reference")
    got = verify(logits.to(DEV), proposal, greedy, ua.to(DEV), us.to(DEV), backend=BACKEND)
    assert sum(calls.values()) == 1, "verify() on CUDA tensors did not use a Triton kernel"
    assert all(t.device.type == DEV.type for t in got)
    for r, k in zip(ref, got):
        assert torch.equal(r, k.cpu())


def test_greedy_tree_kernel_ties_and_big_vocabulary_on_cuda():
    kern = _kernels()
    logits = torch.zeros(1, 4, 51865)
    logits[0, :, 5] = 1.0
    logits[0, :, 40000] = 1.0  # a tie across vocabulary blocks: the first index wins
    parents, tokens = [-1, -1, 0], torch.tensor([[40000, 5, 5]])
    ref = reference.greedy_tree(logits, tokens, parents)
    got = kern.greedy_tree(logits.to(DEV), tokens.to(DEV), parents)
    for r, k in zip(ref, got):
        assert torch.equal(r, k.cpu())


# ---------------------------------------------------------------- placement, no CPU tensors in decode steps


class CpuTensorWatch(TorchFunctionMode):
    """Records every torch call that returns a CPU tensor while active (except the pinned host staging
    inside ``specli.core.device.host_to_device``, which exists to feed the device)."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu_results: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if sys._getframe(1).f_code.co_name == "host_to_device":
            return out
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                self.cpu_results.append(getattr(func, "__name__", repr(func)))
        return out


@pytest.fixture(scope="module")
def cuda_targets():
    return {dt: (tiny_target(0, dtype=dt, device=DEV), tiny_target(1, layers=1, dtype=dt, device=DEV))
            for dt in (torch.float32, torch.float16)}


def _head(target) -> SpeechDraftHead:
    torch.manual_seed(0)
    return SpeechDraftHead(EagleConfig.for_target(target, "tiny"), target)


def _drafters(target, other):
    return {
        "model": lambda s: ModelDrafter(other),
        "self": lambda s: ModelDrafter(target, share_encoder=True),
        "adaptive": lambda s: ModelDrafter(other, ModelDraftOptions(confidence_threshold=0.3)),
        "sparse-tree": lambda s: ModelDrafter(other, ModelDraftOptions(confidence_threshold=0.4, tree_topk=2,
                                                                       tree_threshold=0.9)),
        "self-sparse-tree": lambda s: ModelDrafter(target, ModelDraftOptions(confidence_threshold=0.6, tree_topk=2,
                                                                             tree_threshold=0.99),
                                                   share_encoder=True),
        "ngram-pool": lambda s: NgramDrafter(NgramPool(3), EOT),
        "recycling": lambda s: RecyclingDrafter(ModelDrafter(other)),
        "random-tree": lambda s: RandomTreeDrafter(s),
        "noisy-self-tree": lambda s: NoisyTreeDrafter(ModelDrafter(target, share_encoder=True), s),
        "eagle-chain": lambda s: EagleDrafter(_head(target)),
        "eagle-sparse-tree": lambda s: EagleDrafter(_head(target), ModelDraftOptions(tree_topk=2, tree_threshold=0.9)),
    }


DRAFTER_NAMES = ["model", "self", "adaptive", "sparse-tree", "self-sparse-tree", "ngram-pool", "recycling",
                 "random-tree", "noisy-self-tree", "eagle-chain", "eagle-sparse-tree"]


def test_target_drafters_and_caches_live_on_the_device(cuda_targets):
    target, other = cuda_targets[torch.float16]

    def on(t: torch.Tensor) -> bool:
        return t.device.type == DEV.type

    assert on(target.embed) and target.dtype == torch.float16
    fp32 = cuda_targets[torch.float32][0]
    packed = [lin.fast for blk in fp32.dec_blocks for lin in (blk.fc1, blk.fc2)]
    assert not any(packed) if DEV.type == "cuda" else True  # oneDNN packing is a CPU-only path
    state = window(target, 0)
    assert on(state.cache.keys) and on(state.audio_features)
    assert all(on(k) and on(v) for k, v in state.cross_kv)
    drafter = EagleDrafter(_head(target))
    assert all(on(p) for p in drafter.head.parameters())
    assert all(on(b) for b in drafter.head.buffers())
    assert on(drafter._cache.keys)


@pytest.mark.parametrize("name", [n for n in DRAFTER_NAMES if n not in ("random-tree", "noisy-self-tree")])
def test_decode_steps_create_no_cpu_tensor(cuda_targets, name):  # (test drafters draw from CPU generators)
    if DEV.type == "cpu":
        pytest.skip("meaningless on the CPU")
    target, other = cuda_targets[torch.float16]
    state = window(target, 2)
    drafter = _drafters(target, other)[name](2)
    watch = CpuTensorWatch()
    with watch:
        job = DecodeJob([SOT, NO_TS], tiny_rules(False), EOT, 20, sampling=SAMPLING,
                        generator=torch.Generator(device=DEV).manual_seed(1), probe=Probe(0, 1))
        speculative_decode(target, state, job, drafter, SpecOptions(max_draft=5))
    assert watch.cpu_results == [], f"{name}: CPU tensors made by {sorted(set(watch.cpu_results))}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", DRAFTER_NAMES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_speculative_greedy_equals_greedy_on_cuda(cuda_targets, dtype, name, seed):
    target, other = cuda_targets[dtype]
    timestamps = seed == 1
    prompt = [SOT] + ([] if timestamps else [NO_TS])
    rules = tiny_rules(timestamps)
    job = DecodeJob(prompt, rules, EOT, 40, probe=Probe(0, 1))
    ref = greedy_decode(target, window(target, seed), job)
    out = speculative_decode(target, window(target, seed), job, _drafters(target, other)[name](seed),
                             SpecOptions(max_draft=6))
    assert out.tokens == ref.tokens
    assert out.finished == ref.finished


@pytest.mark.parametrize("name", ["model", "self-sparse-tree", "random-tree", "eagle-sparse-tree"])
def test_sampled_decode_kernels_equal_reference_on_cuda(cuda_targets, name):
    target, other = cuda_targets[torch.float32]
    outs = []
    for backend in ("reference", "triton"):
        job = DecodeJob([SOT, NO_TS], tiny_rules(False), EOT, 40, sampling=SAMPLING,
                        generator=torch.Generator(device=DEV).manual_seed(7))
        outs.append(speculative_decode(target, window(target, 5), job, _drafters(target, other)[name](5),
                                       SpecOptions(max_draft=6, verify_backend=backend)))
    assert outs[0].tokens == outs[1].tokens


# ---------------------------------------------------------------- real weights, fp16, CUDA


@pytest.fixture(scope="module")
def cuda_models():
    from specli.models.whisper.loader import load_whisper

    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = load_whisper(name, "float16", device=DEV)
        return cache[name]

    return get


def _speculative_presets():
    from specli.presets import available_presets, load_preset

    return [n for n in available_presets() if load_preset(n).draft.strategy != "ar" and load_preset(n).family == "whisper"]


@pytest.mark.slow
@pytest.mark.parametrize("name", _speculative_presets())
def test_real_presets_identical_to_ar_on_cuda_fp16(cuda_models, name):
    from specli.io.audio import iter_audio_chunks
    from specli.models.speech import DecodingOptions
    from specli.asr.strategies import build_decoder
    from specli.asr.windows import TranscribeOptions, transcribe_stream
    from specli.presets import load_preset

    preset = load_preset(name)
    model = cuda_models(preset.model)
    decode = build_decoder(preset, model, "en")
    clips = {"whisper-base": [EN_CLIPS[0], ES_CLIPS[0]], "whisper-tiny.en": [EN_CLIPS[1]]}[preset.model]
    forwards = tokens = 0
    for clip in clips:
        opts = TranscribeOptions(language="es" if "/es/" in str(clip) and model.special.multilingual else None,
                                 decoding=DecodingOptions(temperatures=(0.0,)))
        ref = transcribe_stream(model, iter_audio_chunks(clip), opts)
        got = transcribe_stream(model, iter_audio_chunks(clip), opts, decode=decode)
        assert [s.tokens for s in got.segments] == [s.tokens for s in ref.segments], (name, clip.name)
        forwards += got.stats.decode.target_forwards
        tokens += got.stats.decode.tokens
    assert forwards < tokens, f"{name}: no draft token was ever accepted"


def test_interpreter_is_off_for_this_module_when_run_by_the_gpu_check():
    if os.environ.get("SPECLI_GPU_CHECK") != "1":
        pytest.skip("only under benchmarks/gpu_check.sh")
    from triton import knobs

    assert not knobs.runtime.interpret, "gpu_check runs the kernels compiled, not interpreted"


# ---------------------------------------------------------------- speech-token targets: Qwen2, CosyVoice LM


def _tiny_qwen2(dtype: torch.dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from specli.models.qwen2 import Qwen2Dims, Qwen2Target

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=97, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=96, max_position_embeddings=256,
                      rope_theta=5000.0, rms_norm_eps=1e-6)
    ref = Qwen2ForCausalLM(cfg).eval()
    return Qwen2Target(Qwen2Dims.from_hf_config(cfg.to_dict()), dict(ref.state_dict()), dtype, device=DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("drafter", ["ngram-pool", "random-tree"])
@pytest.mark.parametrize("greedy", [True, False])
def test_qwen2_target_on_the_device_lossless(dtype, drafter, greedy):
    target = _tiny_qwen2(dtype)
    assert target.embed_tokens.device.type == DEV.type and target.inv_freq.device.type == DEV.type
    prompt, eot, sampling = [5, 17, 33, 8], 2, SamplingParams() if greedy else SAMPLING
    state = target.start(64)
    assert state.cache.keys.device.type == DEV.type
    ref = greedy_decode(target, state, DecodeJob(prompt, None, eot, 30)) if greedy else None
    make = {"ngram-pool": lambda: NgramDrafter(NgramPool(2), eot), "random-tree": lambda: RandomTreeDrafter(3)}
    outs = []
    for backend in ("reference", "auto" if DEV.type == "cuda" else "triton"):
        job = DecodeJob(prompt, None, eot, 30, sampling=sampling, generator=torch.Generator(device=DEV).manual_seed(5))
        outs.append(speculative_decode(target, target.start(64), job, make[drafter](),
                                       SpecOptions(max_draft=5, verify_backend=backend)))
    if greedy:
        assert outs[0].tokens == ref.tokens
    assert outs[1].tokens == outs[0].tokens


def test_cosyvoice_lm_on_the_device_pool_equals_ar(tmp_path):
    from cosyvoice_fixtures import write_checkpoint
    from specli.core.sampling import SamplerOptions
    from specli.presets.draft import DraftSpec
    from specli.tts.synthesis import SynthesisOptions, SynthesisRequest, Synthesizer
    from specli.models.cosyvoice.lm import load_cosyvoice

    model = load_cosyvoice(str(write_checkpoint(tmp_path / "cv2", "cosyvoice2", seed=7)), device=DEV)
    assert model.lm.speech_embedding.device.type == DEV.type
    assert model.lm.qwen.embed_tokens.device.type == DEV.type
    ar = Synthesizer(model, SynthesisOptions(sampler=SamplerOptions("greedy")))
    pool = Synthesizer(model, SynthesisOptions(sampler=SamplerOptions("greedy"),
                                            draft=DraftSpec(strategy="chain", drafter="pool")))
    for i, text in enumerate(["hello there", "hello there again", "hello there"]):
        req = SynthesisRequest(f"u{i}", text)
        a, p = ar.synthesize(req), pool.synthesize(req)
        assert p.tokens == a.tokens
        pool.finish()
