"""Train specli-en's flow: CosyVoice3's DiT + conditional flow matching, speech tokens -> 80-bin mel (22.05 kHz, hop 256).

The model is specli's own :class:`~specli.tts.acoustic.flow_cv3.FlowCV3` (the module inference runs, with
upstream's key names, so ``flow.pt`` loads through the official loader), trained as upstream's
``CausalMaskedDiffWithDiT.forward`` + ``CausalConditionalCFM.compute_loss``
(``cosyvoice/flow/flow.py``, ``flow_matching.py``):

* tokens -> ``input_embedding`` -> pre-lookahead -> each repeated ``token_mel_ratio`` (4) times = ``mu``;
* the x-vector is zeros (one speaker): ``spk_embed_affine_layer`` contributes its bias;
* condition: per utterance with p = 0.5 nothing, else a random prefix of the target mel of up to 30 % of it;
* ``t ~ U(0, 1)``, ``y = (1 - (1 - s) t) z + t x1``, target velocity ``u = x1 - (1 - s) z`` (s = 1e-6);
* classifier-free guidance dropout 0.2 (mu, x-vector and condition zeroed together);
* chunk-causal attention (streaming) with p = ``--streaming`` (upstream 0.5), else full;
* loss: MSE over every unpadded frame (the prompt prefix included), as upstream.

Mels are jik876's (``HifiGan.mel``: what the vocoder was trained on) of the clip zero-padded to a multiple of
``4 * 256`` samples, so a clip of n speech tokens has exactly 4 n frames; they are cached under ``<run>/mels``.

    python scripts/voice/train_flow.py --run /work/voice/train/flow --codebook 1024 --steps 30000
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torch.nn.functional as F
from common import clips, log, lr_at, save, wav_path
from voicetokens import speech_tokens

from specli.core.device import cpu_native_bf16
from specli.io.atomic import write_atomic_with
from specli.tts.acoustic.cfm import CFMSettings
from specli.tts.acoustic.features import prompt_mel
from specli.tts.acoustic.flow_cv3 import DiTConfig, FlowCV3, FlowCV3Config

RATIO = 4  # mel frames per speech token
HOP = 256  # samples per mel frame at 22.05 kHz
SIGMA_MIN = 1e-6
CFG_DROPOUT = 0.2


def flow_config(codebook: int, dim: int, depth: int, heads: int, lookahead: int) -> FlowCV3Config:
    dit = DiTConfig(dim=dim, depth=depth, heads=heads, dim_head=64, ff_mult=2, static_chunk_size=25 * RATIO)
    return FlowCV3Config(vocab_size=codebook, token_mel_ratio=RATIO, lookahead_channels=lookahead, dit=dit,
                         cfm=CFMSettings())


def clip_mel(clip_id: str) -> np.ndarray:
    """jik876's log-mel ``[4 n, 80]`` of the clip zero-padded to a multiple of 4 * 256 samples."""
    audio, rate = sf.read(wav_path(clip_id), dtype="float32")
    if rate != 22050:
        raise ValueError(f"{clip_id}: {rate} Hz, expected 22050")
    audio = np.pad(audio, (0, -len(audio) % (RATIO * HOP)))
    return prompt_mel(audio, 8000.0, n_fft=1024, hop=HOP, sample_rate=22050)[0].T.numpy()


def pairs(split: str, cache: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(tokens [n], mel [4 n, 80] float16)`` of every tokenised clip (mels cached in ``cache``)."""
    tokens = speech_tokens(split)
    cache.mkdir(parents=True, exist_ok=True)
    out = []
    for clip in clips(split):
        codes = tokens.get(clip.id)
        if codes is None:
            continue
        path = cache / f"{clip.id}.npy"
        if not path.is_file():
            mel = clip_mel(clip.id).astype(np.float16)
            write_atomic_with(path, lambda fh, m=mel: np.save(fh, m))
        mel = np.load(path)
        n = min(len(codes), mel.shape[0] // RATIO)
        out.append((np.asarray(codes[:n], dtype=np.int64), mel[: RATIO * n]))
    return out


def collate(data, idx: list[int], crop: int, rng: random.Random) -> tuple[torch.Tensor, ...]:
    """tokens [B, N], mel [B, 80, 4N], mask [B, 1, 4N], cond [B, 80, 4N]; utterances cut to ``crop`` tokens."""
    cuts = []
    for i in idx:
        codes, mel = data[i]
        start = rng.randint(0, max(0, len(codes) - crop))
        cuts.append((codes[start : start + crop], mel[RATIO * start : RATIO * (start + crop)]))
    n = max(len(c) for c, _ in cuts)
    tokens = torch.zeros(len(idx), n, dtype=torch.long)
    mel = torch.zeros(len(idx), 80, RATIO * n)
    mask = torch.zeros(len(idx), 1, RATIO * n)
    cond = torch.zeros(len(idx), 80, RATIO * n)
    for b, (codes, m) in enumerate(cuts):
        tokens[b, : len(codes)] = torch.from_numpy(codes)
        mel[b, :, : m.shape[0]] = torch.from_numpy(m.astype(np.float32)).T
        mask[b, :, : m.shape[0]] = 1
        if rng.random() >= 0.5:  # upstream: half the utterances get a prompt prefix of up to 30 %
            k = rng.randint(0, int(0.3 * m.shape[0]))
            cond[b, :, :k] = mel[b, :, :k]
    return tokens, mel, mask, cond


def cfm_loss(flow: FlowCV3, batch: tuple[torch.Tensor, ...], streaming: bool, gen: torch.Generator,
             bf16: bool) -> torch.Tensor:
    tokens, x1, mask, cond = batch
    b = tokens.shape[0]
    token_mask = mask[:, :, ::RATIO].transpose(1, 2)  # [B, N, 1]
    spks = flow.spk_embed_affine_layer(torch.zeros(b, flow.cfg.spk_embed_dim))  # one speaker: zeros
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        emb = flow.input_embedding(tokens) * token_mask
        mu = flow.pre_lookahead_layer(emb).repeat_interleave(RATIO, dim=1).transpose(1, 2)  # [B, 80, T]
        t = torch.rand(b, 1, 1, generator=gen)
        z = torch.randn(x1.shape, generator=gen)
        y = (1 - (1 - SIGMA_MIN) * t) * z + t * x1
        u = x1 - (1 - SIGMA_MIN) * z
        keep = (torch.rand(b, generator=gen) > CFG_DROPOUT).float()
        pred = flow.decoder.estimator(y, mask, mu * keep[:, None, None], t.flatten(), spks * keep[:, None],
                                      cond * keep[:, None, None], streaming=streaming)
    return F.mse_loss(pred.float() * mask, u * mask, reduction="sum") / (mask.sum() * u.shape[1])


@torch.no_grad()
def held_out_loss(flow: FlowCV3, data, crop: int, batch: int, bf16: bool) -> float:
    """CFM loss on held-out clips with fixed noise and times (comparable across checkpoints)."""
    flow.eval()
    rng, gen, losses = random.Random(0), torch.Generator().manual_seed(0), []
    for i in range(0, len(data), batch):
        losses.append(float(cfm_loss(flow, collate(data, list(range(i, min(i + batch, len(data)))), crop, rng),
                                     False, gen, bf16)))
    flow.train()
    return sum(losses) / max(len(losses), 1)


def train(args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    cfg = flow_config(args.codebook, args.dim, args.depth, args.heads, args.lookahead)
    flow = FlowCV3(cfg).train()
    opt = torch.optim.AdamW(flow.parameters(), lr=args.lr, weight_decay=0.0)
    found = sorted((args.run / "checkpoints").glob("ckpt-*.pt"))
    step, best = 0, float("inf")
    if found:
        state = torch.load(found[-1], weights_only=False)
        flow.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        step, best = state["step"], state["best"]
    elif args.init is not None:  # a new run starts from the committed voice (float16 flow.pt, official keys)
        flow.load_state_dict({k: v.float() for k, v in torch.load(args.init, weights_only=True).items()})
        log(f"initialised from {args.init}")
    train_data, val_data = pairs("train", args.run / "mels"), pairs("heldout", args.run / "mels")
    bf16 = args.bf16 and cpu_native_bf16()
    log(f"flow {asdict(cfg.dit)} ({sum(p.numel() for p in flow.parameters()) / 1e6:.1f}M params), "
        f"{len(train_data)} train / {len(val_data)} held-out clips, resuming at step {step}, bf16 {bf16}")
    rng, gen = random.Random(args.seed + step), torch.Generator().manual_seed(args.seed + step)
    t0, seen = time.perf_counter(), 0
    while step < args.steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.lr, args.warmup, args.steps)
        idx = [rng.randrange(len(train_data)) for _ in range(args.batch)]
        loss = cfm_loss(flow, collate(train_data, idx, args.crop, rng), rng.random() < args.streaming, gen, bf16)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(flow.parameters(), 1.0)
        opt.step()
        step, seen = step + 1, seen + 1
        if step % args.log_every == 0:
            log(f"step {step}: loss {float(loss):.4f} {(time.perf_counter() - t0) / seen:.2f} s/step")
        if step % args.val_every == 0 or step == args.steps:
            val = held_out_loss(flow, val_data, args.crop, args.batch, bf16)
            log(f"step {step}: held-out CFM loss {val:.4f} (best {min(best, val):.4f})")
            if val < best:
                best = val
                save(args.run / "best.pt", {"model": flow.state_dict(), "step": step, "val": val,
                                            "config": json.loads(json.dumps(asdict(cfg)))})
            save(args.run / "checkpoints" / f"ckpt-{step:08d}.pt",
                 {"model": flow.state_dict(), "optim": opt.state_dict(), "step": step, "best": best})
            for old in sorted((args.run / "checkpoints").glob("ckpt-*.pt"))[:-2]:
                old.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="run directory (checkpoints, best.pt, mels); resumes")
    ap.add_argument("--codebook", type=int, required=True, help="speech codebook size (the flow's vocab_size)")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lookahead", type=int, default=256, help="pre-lookahead conv channels")
    ap.add_argument("--init", type=Path, help="flow.pt to start a new run from (e.g. the shipped voice's)")
    ap.add_argument("--steps", type=int, default=30000)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--crop", type=int, default=96, help="tokens per training utterance at most (4.5 s)")
    ap.add_argument("--streaming", type=float, default=0.5, help="probability of chunk-causal attention")
    ap.add_argument("--val-every", type=int, default=1000)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    train(ap.parse_args())


if __name__ == "__main__":
    main()
