"""Where CosyVoice synthesis time goes: LLM / flow / vocoder seconds per second of audio (random weights).

Shapes are the published ones, weights random (timing does not depend on them):

- LLM: the lean Qwen2 target at the Qwen2.5-0.5B shape (24 layers, hidden 896, 14 / 2 heads,
  intermediate 4864, 6761-row speech head) decoding 25 tokens per second of audio, one forward a token
  (plain autoregressive decoding, what speculative decoding accelerates), after a text + prompt prefix;
- flow: CosyVoice3 ``FlowCV3`` (DiT 1024 x 22, 16 heads; 10 Euler steps, CFG batch of 2) or CosyVoice2
  ``FlowCV2`` (6 + 4 conformer blocks of 512, U-Net 256) on the same tokens (+ the prompt frames);
- vocoder: HiFT at base 512 channels (causal for CosyVoice3), 480 samples per mel frame.

Not a test; run it by hand, e.g.

    python benchmarks/bench_synthesis_stages.py --seconds 2 --threads 2 --kind cosyvoice3
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from specli.tts.acoustic.flow_cv2 import FlowCV2, FlowCV2Config
from specli.tts.acoustic.flow_cv3 import FlowCV3, FlowCV3Config
from specli.tts.acoustic.hift import HiFT, HiFTConfig
from specli.models.qwen2 import Qwen2Dims, Qwen2Target

TOKENS_PER_SECOND = 25
QWEN_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                intermediate_size=4864, vocab_size=6761)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_llm(tokens: int, prefix: int, device: torch.device) -> float:
    """Seconds to decode ``tokens`` one at a time after a ``prefix``-long prompt (prefill not counted)."""
    torch.manual_seed(0)
    cfg = Qwen2Config(**QWEN_05B, max_position_embeddings=4096, rope_theta=1e6, tie_word_embeddings=False)
    hf = Qwen2ForCausalLM(cfg).eval()
    lean = Qwen2Target(Qwen2Dims.from_hf_config(cfg.to_dict()), dict(hf.state_dict()), device=device)
    del hf
    ids = torch.randint(0, 6561, (tokens,), device=device)
    with torch.inference_mode():
        state = lean.start(prefix + tokens + 8)
        lean.score(state, None, embeds=torch.randn(1, prefix, cfg.hidden_size, device=device) * 0.02)
        lean.score(state, ids[None, :1])  # warm-up step
        state.cache.crop(prefix)
        _sync(device)
        t0 = time.perf_counter()
        for i in range(tokens):
            lean.score(state, ids[None, i:i + 1])
        _sync(device)
    return time.perf_counter() - t0


def time_flow(kind: str, tokens: int, prompt_tokens: int, device: torch.device) -> tuple[float, torch.Tensor]:
    """Seconds of one offline flow call and its mel ``[1, 80, 2 tokens]``."""
    torch.manual_seed(0)
    flow = (FlowCV3(FlowCV3Config()) if kind == "cosyvoice3" else FlowCV2(FlowCV2Config())).eval().to(device)
    ids = torch.randint(0, 6561, (1, tokens))
    ptok = torch.randint(0, 6561, (1, prompt_tokens))
    pmel = torch.randn(1, 2 * prompt_tokens, 80) - 5
    emb = torch.randn(1, 192)
    flow.inference(ids[:, :8], ptok[:, :2], pmel[:, :4], emb)  # warm-up (small)
    _sync(device)
    t0 = time.perf_counter()
    mel = flow.inference(ids, ptok, pmel, emb)
    _sync(device)
    return time.perf_counter() - t0, mel


def time_vocoder(kind: str, mel: torch.Tensor, device: torch.device) -> tuple[float, int]:
    torch.manual_seed(0)
    hift = HiFT(HiFTConfig.for_kind(kind)).eval().requires_grad_(False).to(device)  # type: ignore[arg-type]
    if kind == "cosyvoice3":
        hift.f0_predictor.double()  # as load_hift does (upstream runs CV3's F0 predictor in float64)
    gen = torch.Generator(device="cpu").manual_seed(0)
    hift.vocode(mel[:, :, :16], gen)  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    audio = hift.vocode(mel, gen)
    _sync(device)
    return time.perf_counter() - t0, audio.shape[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=["cosyvoice2", "cosyvoice3"], default="cosyvoice3")
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds of generated audio")
    ap.add_argument("--prompt-seconds", type=float, default=0.0, help="seconds of voice prompt (flow + LLM prefix)")
    ap.add_argument("--text-tokens", type=int, default=20, help="text tokens in the LLM prefix")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--skip-llm", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    tokens = max(8, round(args.seconds * TOKENS_PER_SECOND))
    prompt = round(args.prompt_seconds * TOKENS_PER_SECOND)
    seconds = {}
    if not args.skip_llm:
        seconds["llm"] = time_llm(tokens, args.text_tokens + prompt + 2, device)
    seconds["flow"], mel = time_flow(args.kind, tokens, prompt, device)
    seconds["vocoder"], samples = time_vocoder(args.kind, mel, device)
    audio_s = samples / 24000
    report = {
        "kind": args.kind, "device": str(device), "threads": torch.get_num_threads(), "cpu": platform.processor(),
        "torch": torch.__version__, "tokens": tokens, "prompt_tokens": prompt, "audio_seconds": round(audio_s, 3),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "seconds_per_audio_second": {k: round(v / audio_s, 3) for k, v in seconds.items()},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
