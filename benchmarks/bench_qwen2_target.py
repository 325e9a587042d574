"""Lean Qwen2 target vs transformers' Qwen2ForCausalLM: per-token decode cost, one process, ratios.

Two random configs: a tiny one and the CosyVoice LM shape (Qwen2.5-0.5B body: 24 layers, hidden 896,
14 query / 2 KV heads, intermediate 4864) with a 6761-row speech head as the vocabulary projection.
Both models get the same weights and the same inputs_embeds prefix, then decode the same tokens one
forward at a time from their own caches (transformers: its dynamic cache; specli: the static
KVCache), interleaved token by token so load drift hits both alike. Also times one 5-token chain
forward (a speculative verification). Not a test: run it by hand, e.g.

    python benchmarks/bench_qwen2_target.py --threads 2 --prefix 64 --tokens 16 --repeat 1
"""

from __future__ import annotations

import argparse
import inspect
import platform
import statistics
import time

import torch
import transformers
from transformers import Qwen2Config, Qwen2ForCausalLM

from specli.models.qwen2 import Qwen2Dims, Qwen2Target

# transformers 5 renamed past_key_values to cache (the old name is deprecated)
_CACHE_KW = "cache" if "cache" in inspect.signature(Qwen2ForCausalLM.forward).parameters else "past_key_values"


def _cache_of(out):
    return out["cache"] if "cache" in out else out["past_key_values"]


CONFIGS = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=6761),
    "0.5B-shaped": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                        intermediate_size=4864, vocab_size=6761),
}


def _models(name: str) -> tuple[Qwen2ForCausalLM, Qwen2Target]:
    torch.manual_seed(0)
    cfg = Qwen2Config(**CONFIGS[name], max_position_embeddings=4096, rope_theta=1e6, tie_word_embeddings=False)
    hf = Qwen2ForCausalLM(cfg).eval()
    lean = Qwen2Target(Qwen2Dims.from_hf_config(cfg.to_dict()), dict(hf.state_dict()))
    return hf, lean


def _measure(name: str, prefix: int, tokens: int) -> dict:
    hf, lean = _models(name)
    d = hf.config.hidden_size
    embeds = torch.randn(1, prefix, d) * 0.02
    toks = torch.randint(0, hf.config.vocab_size, (tokens,)).tolist()
    hf_t, lean_t = [], []
    with torch.inference_mode():
        out = hf(inputs_embeds=embeds, use_cache=True)
        cache = _cache_of(out)
        state = lean.start(prefix + tokens + 8)
        lean.score(state, None, embeds=embeds)
        for tok in toks:
            t0 = time.perf_counter()
            out = hf(input_ids=torch.tensor([[tok]]), **{_CACHE_KW: cache}, use_cache=True)
            cache = _cache_of(out)
            t1 = time.perf_counter()
            lean.score(state, torch.tensor([[tok]]))
            t2 = time.perf_counter()
            hf_t.append(t1 - t0)
            lean_t.append(t2 - t1)
        # one 5-token chain forward (verification of a 4-token draft), from a rolled-back state
        chain = torch.tensor([toks[:5]])
        length = state.cache.length
        lean.score(state, chain)  # warm-up of the 5-row shapes (oneDNN primitives), then timed
        state.cache.crop(length)
        t0 = time.perf_counter()
        lean.score(state, chain)
        lean_chain = time.perf_counter() - t0
        t0 = time.perf_counter()
        hf(input_ids=chain, **{_CACHE_KW: cache}, use_cache=True)
        hf_chain = time.perf_counter() - t0
    hf_ms, lean_ms = statistics.median(hf_t) * 1e3, statistics.median(lean_t) * 1e3
    return {"config": name, "hf_ms": hf_ms, "lean_ms": lean_ms, "ratio": hf_ms / lean_ms,
            "hf_chain5_ms": hf_chain * 1e3, "lean_chain5_ms": lean_chain * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--prefix", type=int, default=64, help="prompt positions before decoding")
    ap.add_argument("--tokens", type=int, default=16, help="tokens decoded one at a time")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--configs", default="tiny,0.5B-shaped")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {platform.processor() or '?'}, "
          f"{torch.get_num_threads()} threads, prefix {args.prefix}, {args.tokens} tokens, fp32")
    for name in args.configs.split(","):
        for _ in range(args.repeat):
            r = _measure(name, args.prefix, args.tokens)
            print(f"{r['config']:12s} per token: transformers {r['hf_ms']:8.2f} ms  lean {r['lean_ms']:8.2f} ms  "
                  f"ratio {r['ratio']:5.2f}x | 5-token chain: transformers {r['hf_chain5_ms']:8.2f} ms  "
                  f"lean {r['lean_chain5_ms']:8.2f} ms")


if __name__ == "__main__":
    main()
