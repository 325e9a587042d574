"""Cost of one draft block (DSpark, DFlash, EAGLE-3) relative to one target step, on random weights.

Targets are random Qwen2 decoders with a CosyVoice3-sized speech head (6761 rows): ``tiny`` (the test
fixture's shape: 2 layers, hidden 32) and ``0.5b`` (CosyVoice2/3's Qwen2.5-0.5B shape: 24 layers,
hidden 896, 14/2 heads, MLP 4864). Drafters use the published recipes' shapes: DSpark 3 layers, block 8,
Markov rank 256, confidence head; DFlash 5 layers, block 4 (3 drafts); EAGLE-3 one layer, 7 steps.
Each drafter proposes under the vLLM sampler's rules (CosyVoice3 settings), sampling, after a context of
``--context`` tokens with 4 newly committed rows (the context-cache update is included).

    python benchmarks/speech_drafter_cost.py --config tiny --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial

import torch

from specli.core.drafters.base import DraftRequest
from specli.core.drafters.llm.dflash import BlockDrafter, new_dflash
from specli.core.drafters.llm.dspark import new_dspark
from specli.core.drafters.llm.eagle3 import Eagle3Drafter, new_eagle3
from specli.core.drafters.llm.base import attach_aux_layers
from specli.core.logits import filter_logits
from specli.core.sampling import build_sampler, default_options
from specli.models.layers import Linear
from specli.models.qwen2 import Qwen2Dims, Qwen2Target

SHAPES = {
    "tiny": dict(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64),
    "0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864),
}
VOCAB = 6761  # CosyVoice3 speech rows


def random_target(shape: dict, seed: int = 0) -> Qwen2Target:
    g = torch.Generator().manual_seed(seed)
    h, hd = shape["hidden"], shape["hidden"] // shape["heads"]
    dims = Qwen2Dims(VOCAB, h, shape["layers"], shape["heads"], shape["kv_heads"], hd, shape["intermediate"],
                     1e6, 1e-6, 32768, False)
    rnd = lambda *s: torch.randn(*s, generator=g) * 0.02  # noqa: E731
    w = {"model.embed_tokens.weight": rnd(VOCAB, h), "model.norm.weight": torch.ones(h)}
    kv = shape["kv_heads"] * hd
    for i in range(shape["layers"]):
        p = f"model.layers.{i}."
        w |= {p + "self_attn.q_proj.weight": rnd(h, h), p + "self_attn.q_proj.bias": rnd(h),
              p + "self_attn.k_proj.weight": rnd(kv, h), p + "self_attn.k_proj.bias": rnd(kv),
              p + "self_attn.v_proj.weight": rnd(kv, h), p + "self_attn.v_proj.bias": rnd(kv),
              p + "self_attn.o_proj.weight": rnd(h, h), p + "mlp.gate_proj.weight": rnd(shape["intermediate"], h),
              p + "mlp.up_proj.weight": rnd(shape["intermediate"], h),
              p + "mlp.down_proj.weight": rnd(h, shape["intermediate"]),
              p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h)}
    return Qwen2Target(dims, w, head=Linear(rnd(VOCAB, h), None))


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = random_target(SHAPES[args.config])
    parts = target.draft_parts()
    rules, params = build_sampler(default_options("vllm", "cosyvoice3"), prompt_tokens=[1, 2, 3],
                                  stop_ids=list(range(6561, VOCAB)), min_len=0, stop_into=6562)
    filt = partial(filter_logits, rules=rules, params=params)
    seq = torch.randint(0, 6561, (1, args.context + 1), generator=torch.Generator().manual_seed(1)).tolist()[0]
    report = {"config": args.config, "threads": args.threads, "context": args.context}
    for kind, module, drafter_cls in (
        ("dspark", new_dspark(parts, layers=3, block_size=8, markov_rank=256), BlockDrafter),
        ("dflash", new_dflash(parts, layers=5, block_size=4), BlockDrafter),
        ("eagle3", new_eagle3(parts, unroll=7), Eagle3Drafter),
    ):
        target.aux_layers = ()
        attach_aux_layers(target, module.config)
        state = target.start(args.context + 64)
        with torch.inference_mode():
            hidden = target.score(state, torch.tensor([seq[:-1]])).hidden
        length = state.cache.length
        step = lambda: (target.score(state, torch.tensor([[seq[-1]]])), state.cache.crop(length))  # noqa: E731
        verify = lambda: (target.score(state, torch.tensor([seq[-9:]])), state.cache.crop(length))  # noqa: E731
        drafter = drafter_cls(module)
        drafter.start(state, seq)
        gen = torch.Generator().manual_seed(0)
        drafter.propose(DraftRequest(seq, 4, 8, state, hidden, filt, False, gen))  # full context once
        last = hidden.select(list(range(hidden.last.shape[1] - 4, hidden.last.shape[1])))

        def block() -> None:
            drafter.commit(seq[:-4])  # crop 4 rows back: each proposal writes 4 newly committed rows
            drafter.propose(DraftRequest(seq, 4, 8, state, last, filt, False, gen))

        with torch.inference_mode():
            t_step, t_verify, t_block = (timed(f, args.repeats) for f in (step, verify, block))
        drafts = len(drafter.propose(DraftRequest(seq, 4, 8, state, last, filt, False, gen)))
        report[kind] = {"target_step_ms": round(t_step, 3), "target_verify9_ms": round(t_verify, 3),
                        "draft_block_ms": round(t_block, 3), "drafts": drafts,
                        "block_over_step": round(t_block / t_step, 3)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
