"""Lean audio-LLM decoder vs transformers' ``generate`` per token, at the real layer shapes (random weights).

Two text models, built with a few layers so they fit and run on a CPU:

- ``qwen2-audio-7b``: Qwen2-Audio-7B's language model (``Qwen2ForCausalLM``: hidden 4096, 32 query and 32 KV
  heads, MLP 11008, vocabulary 156032, untied head);
- ``qwen3-omni-30b-a3b``: the Qwen3-Omni-30B-A3B thinker's text model (hidden 2048, 32 query / 4 KV heads of 128,
  qk-norm, every block a sparse MoE of 128 experts of width 768, top-8, vocabulary 152064). transformers has no
  text-only class for the thinker; ``Qwen3MoeForCausalLM`` is the same block (after the prefill the thinker's
  M-RoPE is 1-D RoPE at position + rope_delta, see tests/test_qwen3_omni.py), so it stands in for it.

Both sides get the same weights (specli's ``Qwen2Target`` is built from the transformers model's state dict) and
the same random ``inputs_embeds`` prompt. transformers: ``generate(do_sample=False)`` of ``1`` and ``1 + n`` new
tokens; its per-token cost is the difference over ``n`` (the prefill cancels). specli: the same greedy loop over
the lean decoder's static cache (``score`` of one token, argmax). Both produce the same tokens (checked). The
runs alternate, ``--repeat`` times, medians reported. With two depths (``--layers 1,3``) the per-layer cost is the
slope and the per-token cost at the real depth (32 and 48 layers) is extrapolated: the shallow run + the
missing layers x the slope. Not a test: run it by hand, e.g.

    python benchmarks/bench_audio_llm_decoder.py --threads 2 --layers 1,3 --dtypes bfloat16,float32 \\
        --out docs/benchmarks/audio-llm/decoder.json
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers

from specli.models.qwen2 import Qwen2Dims, Qwen2Target

SHAPES = {
    "qwen2-audio-7b": ("qwen2", 32, dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32,
                                         intermediate_size=11008, vocab_size=156032, rope_theta=10000.0,
                                         max_position_embeddings=8192, tie_word_embeddings=False)),
    "qwen3-omni-30b-a3b": ("qwen3_moe", 48, dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=4,
                                                 head_dim=128, moe_intermediate_size=768, intermediate_size=768,
                                                 num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                                                 decoder_sparse_step=1, mlp_only_layers=[], vocab_size=152064,
                                                 rope_theta=1000000.0, max_position_embeddings=32768,
                                                 tie_word_embeddings=False)),
}


def build(name: str, layers: int, dtype: torch.dtype) -> tuple[torch.nn.Module, Qwen2Target]:
    """The transformers model of ``name``'s shape at ``layers`` blocks, random weights, and the lean decoder over
    the same tensors."""
    kind, _, shape = SHAPES[name]
    torch.manual_seed(0)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**shape, num_hidden_layers=layers)
        cls = transformers.Qwen2ForCausalLM
    else:
        cfg = transformers.Qwen3MoeConfig(**shape, num_hidden_layers=layers)
        cls = transformers.Qwen3MoeForCausalLM
    with torch.device("meta"):
        hf = cls(cfg)
    hf = hf.to_empty(device="cpu").to(dtype)
    hf.model.rotary_emb = type(hf.model.rotary_emb)(config=cfg)  # its inv_freq buffer is computed, not loaded
    with torch.no_grad():  # random weights: normal(0, 0.02) like the initializer, norms at one
        for pname, p in hf.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in pname else torch.randn_like(p) * 0.02)
    hf.eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    lean = Qwen2Target(Qwen2Dims.from_hf_config(cfg.to_dict()), dict(hf.state_dict()), dtype)
    return hf, lean


def hf_generate(hf: torch.nn.Module, embeds: torch.Tensor, new: int) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    out = hf.generate(inputs_embeds=embeds, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    return time.perf_counter() - t0, out[0, -new:].tolist()


def lean_generate(lean: Qwen2Target, embeds: torch.Tensor, new: int) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    state = lean.start(embeds.shape[1] + new + 1)
    logits = lean.score(state, None, embeds=embeds).logits[0, -1]  # [vocab]
    tokens = [int(logits.argmax())]
    while len(tokens) < new:
        logits = lean.score(state, torch.tensor([[tokens[-1]]])).logits[0, -1]
        tokens.append(int(logits.argmax()))
    return time.perf_counter() - t0, tokens


def measure(name: str, layers: int, dtype: torch.dtype, prefix: int, new: int, repeat: int) -> dict:
    hf, lean = build(name, layers, dtype)
    embeds = torch.randn(1, prefix, hf.config.hidden_size, dtype=dtype) * 0.02
    systems = (("transformers", hf_generate, hf), ("specli", lean_generate, lean))
    per: dict[str, list[float]] = {key: [] for key, _, _ in systems}
    tokens: dict[str, list[int]] = {}
    with torch.inference_mode():
        for _, fn, model in systems:
            fn(model, embeds, 2)  # warm-up (oneDNN primitives, caches)
        for _ in range(repeat):
            for key, fn, model in systems:
                t1, _ = fn(model, embeds, 1)
                tn, tokens[key] = fn(model, embeds, 1 + new)
                per[key].append((tn - t1) / new * 1e3)
    same = tokens["transformers"] == tokens["specli"]
    del hf, lean, systems
    gc.collect()
    hf_ms, lean_ms = statistics.median(per["transformers"]), statistics.median(per["specli"])
    return {"shape": name, "layers": layers, "dtype": str(dtype).removeprefix("torch."), "transformers_ms": hf_ms,
            "specli_ms": lean_ms, "ratio": hf_ms / lean_ms, "same_tokens": same,
            "runs_ms": {k: [round(v, 2) for v in vs] for k, vs in per.items()}}


def extrapolate(rows: list[dict]) -> list[dict]:
    """Per-layer cost (slope between the two depths) and the per-token cost at the real depth."""
    out = []
    for name, dtype in {(r["shape"], r["dtype"]) for r in rows}:
        pts = sorted((r for r in rows if r["shape"] == name and r["dtype"] == dtype), key=lambda r: r["layers"])
        if len(pts) < 2:
            continue
        lo, hi, depth = pts[0], pts[-1], SHAPES[name][1]
        row = {"shape": name, "dtype": dtype, "depth": depth}
        for key in ("transformers", "specli"):
            layer = (hi[f"{key}_ms"] - lo[f"{key}_ms"]) / (hi["layers"] - lo["layers"])
            row[f"{key}_layer_ms"] = layer
            row[f"{key}_full_ms"] = lo[f"{key}_ms"] + (depth - lo["layers"]) * layer
        row["ratio_full"] = row["transformers_full_ms"] / row["specli_full_ms"]
        out.append(row)
    return sorted(out, key=lambda r: (r["shape"], r["dtype"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--layers", default="1,3", help="comma-separated depths (two give the per-layer slope)")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--prefix", type=int, default=96, help="prompt positions (random inputs_embeds)")
    ap.add_argument("--tokens", type=int, default=8, help="new tokens timed after the first")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    head = {"torch": torch.__version__, "transformers": transformers.__version__,
            "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "prefix": args.prefix, "tokens": args.tokens, "repeat": args.repeat}
    print(json.dumps(head))
    rows = []
    for name in args.shapes.split(","):
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            for layers in (int(n) for n in args.layers.split(",")):
                r = measure(name, layers, dtype, args.prefix, args.tokens, args.repeat)
                rows.append(r)
                print(f"{name:20s} {r['dtype']:8s} {layers} layer(s): transformers {r['transformers_ms']:8.1f} "
                      f"ms/token  specli {r['specli_ms']:8.1f}  ratio {r['ratio']:5.2f}x  same tokens "
                      f"{r['same_tokens']}", flush=True)
    full = extrapolate(rows)
    for r in full:
        print(f"{r['shape']:20s} {r['dtype']:8s} at {r['depth']} layers: transformers {r['transformers_full_ms']:8.1f} "
              f"ms/token  specli {r['specli_full_ms']:8.1f}  ratio {r['ratio_full']:5.2f}x  (per layer "
              f"{r['transformers_layer_ms']:.1f} vs {r['specli_layer_ms']:.1f} ms)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": head, "rows": rows, "full_depth": full}, indent=1) + "\n")


if __name__ == "__main__":
    main()
