"""Train specli-en's flow: CosyVoice3's DiT, speech tokens -> 80-bin mel (22.05 kHz, hop 256), as a conditional
flow (CFM), a one-step decoder (regression from t = 0), or a mix of both.

The model is specli's own :class:`~specli.tts.acoustic.flow_cv3.FlowCV3` (the module inference runs, with
upstream's key names, so ``flow.pt`` loads through the official loader), trained as upstream's
``CausalMaskedDiffWithDiT.forward`` + ``CausalConditionalCFM.compute_loss``
(``cosyvoice/flow/flow.py``, ``flow_matching.py``):

* tokens -> ``input_embedding`` -> pre-lookahead -> each repeated ``token_mel_ratio`` (4) times = ``mu``;
* the x-vector is zeros (one speaker): ``spk_embed_affine_layer`` contributes its bias;
* condition: per utterance with p = ``--prompt-prob`` (upstream 0.5) a random prefix of the target mel of up to
  30 % of it, else nothing;
* ``t ~ U(0, 1)``, ``y = (1 - (1 - s) t) z + t x1``, target velocity ``u = x1 - (1 - s) z`` (s = 1e-6);
* classifier-free guidance dropout ``--cfg-dropout`` (upstream 0.2: mu, x-vector and condition zeroed together);
* chunk-causal attention (streaming) with p = ``--streaming`` (upstream 0.5), else full;
* loss: MSE over every unpadded frame (the prompt prefix included), as upstream.

``--objective regress`` trains the same DiT as a deterministic decoder: every row at ``t = 0``, where the
velocity a CFM learns is ``E[x1 | tokens] - z``, so one Euler step (``dt = 1``: the cosine grid of 1 step is
[0, 1]) from the noise gives ``x1_hat = z + v(z, 0)``, and the loss is the L1 (``--reg-loss l2``: MSE) of
``x1_hat - x1``. ``--objective mix`` draws each row at ``t = 0`` with the regression loss with p = ``--reg-frac``
(default 0.7), else a uniform-t CFM row as above, so the multi-step path stays trained. specli-en's defaults
match its inference: no streaming, no prompt, no CFG dropout, whole clips (``--crop`` only bounds them), batches
of clips of similar length. Validation logs the held-out CFM loss (fixed noise and times) beside the L1 of the
one-step estimate from the inference's fixed noise buffer on whole held-out clips (what ``n_timesteps: 1``,
``inference_cfg_rate: 0`` decode); ``best.pt`` is chosen on the latter unless ``--objective cfm``. ``--ema 0.999``
keeps an exponential moving average of the weights (in the checkpoints, so a resumed run keeps it): validation then
scores the average and ``best.pt`` holds it (the average of a noisy batch-8 descent sits lower than its last step).
``--depth`` above the blocks of ``--init`` grows it (:func:`grown`: each block followed by copies of itself whose
adaLN-Zero gates are zero, so training starts from the init's exact function).

Mels are jik876's (``HifiGan.mel``: what the vocoder was trained on) of the clip zero-padded to a multiple of
``4 * 256`` samples, so a clip of n speech tokens has exactly 4 n frames; they are cached under ``<run>/mels``.

    python -m scripts.voice flow --work DIR                     # <work>/train/flow, from the shipped voice's flow
    python -m scripts.voice flow --work DIR --run mix --objective mix --steps 8000 --allow-missing
    python -m scripts.voice flow --work DIR --run deep --depth 12     # the shipped 6 blocks grown to 12
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from specli.core.device import cpu_native_bf16
from specli.io.atomic import write_atomic_with
from specli.tts.acoustic.cfm import CFMSettings, fixed_noise
from specli.tts.acoustic.features import prompt_mel
from specli.tts.acoustic.flow_cv3 import DiTConfig, FlowCV3, FlowCV3Config

from .common import Ema, checkpoint, clips, log, lr_at, restore, save, update, wav_path
from .tokenizer.tokens import speech_tokens

RATIO = 4  # mel frames per speech token
HOP = 256  # samples per mel frame at 22.05 kHz
SIGMA_MIN = 1e-6
OBJECTIVES = {"cfm": 0.0, "regress": 1.0}  # share of rows regressed from t = 0 (mix: --reg-frac)


@dataclass(frozen=True)
class Recipe:
    """What a training step does with a batch (upstream's CFM: reg_frac 0, prompt 0.5, CFG dropout 0.2)."""

    reg_frac: float = 0.0  # share of rows at t = 0 with the one-step regression loss; the rest uniform-t CFM
    reg_loss: str = "l1"  # the regression rows' loss on x1_hat - x1: l1 or l2
    prompt_prob: float = 0.0  # share of utterances with a prompt prefix (<= 30 % of the mel) as condition
    cfg_dropout: float = 0.0  # share of rows with mu, x-vector and condition zeroed (classifier-free guidance)

    def __post_init__(self) -> None:
        if not all(0.0 <= x <= 1.0 for x in (self.reg_frac, self.prompt_prob, self.cfg_dropout)):
            raise ValueError("reg_frac, prompt_prob and cfg_dropout are probabilities")
        if self.reg_loss not in ("l1", "l2"):
            raise ValueError(f"reg_loss {self.reg_loss!r}: l1 or l2")


def flow_config(codebook: int, dim: int, depth: int, heads: int, lookahead: int) -> FlowCV3Config:
    dit = DiTConfig(dim=dim, depth=depth, heads=heads, dim_head=64, ff_mult=2, static_chunk_size=25 * RATIO)
    return FlowCV3Config(vocab_size=codebook, token_mel_ratio=RATIO, lookahead_channels=lookahead, dit=dit,
                         cfm=CFMSettings())


BLOCKS = "decoder.estimator.transformer_blocks."  # the DiT's blocks: <BLOCKS><i>.<parameter>
ADALN = "attn_norm.linear."  # a block's adaLN-Zero modulation: shift, scale and gate of attention and feed-forward


def dit_depth(state: dict[str, torch.Tensor]) -> int:
    """How many DiT blocks the flow state dict ``state`` has."""
    return len({k[len(BLOCKS):].split(".")[0] for k in state if k.startswith(BLOCKS)})


def grown(state: dict[str, torch.Tensor], depth: int) -> dict[str, torch.Tensor]:
    """``state`` with ``depth`` DiT blocks: block i at i * r, followed by r - 1 copies of it (r = depth / the blocks
    ``state`` has) whose adaLN-Zero modulation is zero. A zero modulation zeroes both gates, so each copy is the
    identity and the grown flow computes exactly the function of ``state``; training then opens the copies (their
    weights start as the block's own, not random). Deeper at a fixed width: the one-step L1 of specli-en's 6-block
    flow stood still on more data while a 12-block growth of it kept falling (docs/benchmarks/voice/tokenizer/)."""
    have = dit_depth(state)
    if not have:
        raise ValueError(f"--init has no DiT blocks ({BLOCKS}*): not a flow's weights")
    if depth % have:
        raise ValueError(f"--depth {depth} is not a multiple of the {have} DiT blocks of --init")
    ratio, out = depth // have, {}
    for key, value in state.items():
        if not key.startswith(BLOCKS):
            out[key] = value
            continue
        index, rest = key[len(BLOCKS):].split(".", 1)
        for copy in range(ratio):
            zero = copy > 0 and rest.startswith(ADALN)
            out[f"{BLOCKS}{int(index) * ratio + copy}.{rest}"] = torch.zeros_like(value) if zero else value.clone()
    return out


def clip_mel(wav: Path) -> np.ndarray:
    """jik876's log-mel ``[4 n, 80]`` of the clip ``wav`` zero-padded to a multiple of 4 * 256 samples."""
    audio, rate = sf.read(wav, dtype="float32")
    if rate != 22050:
        raise ValueError(f"{wav}: {rate} Hz, expected 22050")
    audio = np.pad(audio, (0, -len(audio) % (RATIO * HOP)))
    return prompt_mel(audio, 8000.0, n_fft=1024, hop=HOP, sample_rate=22050)[0].T.numpy()


def pairs(split: str, cache: Path, corpus: Path, tokens_npz: Path, allow_missing: bool = False,
          ids: list[str] | None = None) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """``(tokens [n], mel [4 n, 80] float16)`` of every clip of the committed speech tokens' (``tokens_npz``)
    ``split`` (mels of the ``corpus`` wavs cached in ``cache``), in id order (only ``ids``, in their order, when
    given), and how many were left out because the corpus has no wav of them yet (only with ``allow_missing``: a
    corpus still being built)."""
    tokens = speech_tokens(split, tokens_npz)
    cache.mkdir(parents=True, exist_ok=True)
    out, missing = [], 0
    for cid in sorted(tokens) if ids is None else ids:
        codes, path = tokens[cid], cache / f"{cid}.npy"
        if not path.is_file():
            wav = wav_path(cid, corpus)
            if not wav.is_file():
                if not allow_missing:
                    raise SystemExit(f"{wav} missing: build the corpus (python -m scripts.voice corpus), or pass "
                                     "--allow-missing to train on the clips there so far")
                missing += 1
                continue
            mel = clip_mel(wav).astype(np.float16)
            write_atomic_with(path, lambda fh, m=mel: np.save(fh, m))
        mel = np.load(path)
        n = min(len(codes), mel.shape[0] // RATIO)
        out.append((np.asarray(codes[:n], dtype=np.int64), mel[: RATIO * n]))
    return out, missing


def collate(data, idx: list[int], crop: int, rng: random.Random, prompt_prob: float = 0.0) -> tuple[torch.Tensor, ...]:
    """tokens [B, N], mel [B, 80, 4N], mask [B, 1, 4N], cond [B, 80, 4N]; utterances cut to ``crop`` tokens, a
    prompt prefix of up to 30 % of the mel as condition with p = ``prompt_prob`` (upstream 0.5)."""
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
        if prompt_prob > 0 and rng.random() < prompt_prob:
            k = rng.randint(0, int(0.3 * m.shape[0]))
            cond[b, :, :k] = mel[b, :, :k]
    return tokens, mel, mask, cond


def similar_lengths(order: list[int], batch: int, rng: random.Random) -> list[int]:
    """``batch`` clips adjacent in ``order`` (indices sorted by length): little padding in a whole-clip batch."""
    start = rng.randrange(max(1, len(order) - batch + 1))
    return order[start : start + batch]


def conditions(flow: FlowCV3, tokens: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``mu [B, 80, T]`` of the tokens (padding zeroed, as inference pads) and the one speaker's ``spks [B, 80]``."""
    token_mask = mask[:, :, ::RATIO].transpose(1, 2)  # [B, N, 1]
    emb = flow.input_embedding(tokens) * token_mask
    mu = flow.pre_lookahead_layer(emb).repeat_interleave(RATIO, dim=1).transpose(1, 2)
    spks = flow.spk_embed_affine_layer(torch.zeros(tokens.shape[0], flow.cfg.spk_embed_dim))  # one speaker: zeros
    return mu, spks


def flow_loss(flow: FlowCV3, batch: tuple[torch.Tensor, ...], recipe: Recipe, streaming: bool,
              gen: torch.Generator, bf16: bool) -> torch.Tensor:
    """The recipe's loss on a batch: per row either the one-step regression from t = 0 (p = ``reg_frac``) or a
    uniform-t CFM velocity MSE; summed over unpadded frames and bins, divided by their count."""
    tokens, x1, mask, cond = batch
    b = tokens.shape[0]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        mu, spks = conditions(flow, tokens, mask)
        one_step = (torch.rand(b, generator=gen) < recipe.reg_frac)[:, None, None]  # [B, 1, 1]
        t = torch.where(one_step, 0.0, torch.rand(b, 1, 1, generator=gen))
        z = torch.randn(x1.shape, generator=gen)
        y = (1 - (1 - SIGMA_MIN) * t) * z + t * x1
        u = x1 - (1 - SIGMA_MIN) * z
        keep = (torch.rand(b, generator=gen) >= recipe.cfg_dropout).float()
        pred = flow.decoder.estimator(y, mask, mu * keep[:, None, None], t.flatten(), spks * keep[:, None],
                                      cond * keep[:, None, None], streaming=streaming)
    pred = pred.float()
    one_err = z + pred - x1  # [B, 80, T]: the one-step Euler output (dt = 1) minus the mel
    reg = one_err.abs() if recipe.reg_loss == "l1" else one_err.square()
    err = torch.where(one_step, reg, (pred - u).square())
    return (err * mask).sum() / (mask.sum() * u.shape[1])


@torch.no_grad()
def held_out(flow: FlowCV3, data, batch: int, bf16: bool) -> dict[str, float]:
    """``cfm``: the CFM loss with fixed noise and times; ``l1``: mean |x1_hat - mel| of the one-step estimate
    from the inference's fixed noise (cosine grid, 1 step, no CFG), over every frame of whole clips."""
    was_training = flow.training
    flow.eval()
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    cfm_sum = l1_sum = frames = 0.0
    for i in range(0, len(data), batch):
        tokens, x1, mask, cond = collate(data, list(range(i, min(i + batch, len(data)))), 10**9, rng)
        n = float(mask.sum())
        cfm_sum += n * float(flow_loss(flow, (tokens, x1, mask, cond), Recipe(), False, gen, bf16))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            mu, spks = conditions(flow, tokens, mask)
            z = fixed_noise(x1.shape[2], "cpu", torch.float32).expand(x1.shape[0], -1, -1)
            v = flow.decoder.estimator(z, mask, mu, torch.zeros(x1.shape[0]), spks, torch.zeros_like(x1))
        l1_sum += float(((z + v.float() - x1).abs() * mask).sum()) / 80
        frames += n
    flow.train(was_training)
    return {"cfm": cfm_sum / frames, "l1": l1_sum / frames}


def validation_ids(args: argparse.Namespace) -> list[str]:
    """The held-out clips validation scores: ``--val-clips`` from the ``--val-first``-th in the corpus's file
    order. Its default (200) keeps them out of the sentences the round trip decides on (file order 0-99 ship,
    100-199 selection: ``benchmarks/voice_roundtrip.py --first``)."""
    ids = [c.id for c in clips("heldout", args.corpus)][args.val_first : args.val_first + args.val_clips]
    if len(ids) < args.val_clips:
        raise SystemExit(f"error: the corpus has no {args.val_clips} held-out clips from the {args.val_first}-th")
    return ids


def recipe_of(args: argparse.Namespace) -> Recipe:
    frac = args.reg_frac if args.objective == "mix" else OBJECTIVES[args.objective]
    return Recipe(frac, args.reg_loss, args.prompt_prob, args.cfg_dropout)


def train(args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    cfg = flow_config(args.codebook, args.dim, args.depth, args.heads, args.lookahead)
    recipe, metric = recipe_of(args), "cfm" if args.objective == "cfm" else "l1"
    flow = FlowCV3(cfg).train()
    opt = torch.optim.AdamW(flow.parameters(), lr=args.lr, weight_decay=0.0)
    ema = Ema(flow, args.ema) if args.ema else None
    step, best = restore(args.run, flow, opt, args.init, ema)  # a new run starts from the voice's flow.pt (--init)
    judged = ema.model if ema else flow  # what validation scores and best.pt keeps
    train_data, missing = pairs("train", args.run / "mels", args.corpus, args.tokens, args.allow_missing)
    val_data = pairs("heldout", args.run / "mels", args.corpus, args.tokens, ids=validation_ids(args))[0]
    order = sorted(range(len(train_data)), key=lambda i: len(train_data[i][0]))
    bf16 = args.bf16 and cpu_native_bf16()
    log(f"flow {asdict(cfg.dit)} ({sum(p.numel() for p in flow.parameters()) / 1e6:.1f}M params), "
        f"{len(train_data)} train ({missing} without a wav yet) / {len(val_data)} held-out clips, "
        f"{args.objective} {asdict(recipe)}, "
        f"resuming at step {step}, bf16 {bf16}, EMA {args.ema or 'off'}")
    rng, gen = random.Random(args.seed + step), torch.Generator().manual_seed(args.seed + step)
    t0, seen = time.perf_counter(), 0
    while step < args.steps:
        idx = (similar_lengths(order, args.batch, rng) if args.by_length
               else [rng.randrange(len(train_data)) for _ in range(args.batch)])
        batch = collate(train_data, idx, args.crop, rng, recipe.prompt_prob)
        loss = flow_loss(flow, batch, recipe, rng.random() < args.streaming, gen, bf16)
        update(flow, opt, loss, lr_at(step, args.lr, args.warmup, args.steps))
        if ema:
            ema.update(flow)
        step, seen = step + 1, seen + 1
        if step % args.log_every == 0:
            log(f"step {step}: loss {loss.item():.4f} {(time.perf_counter() - t0) / seen:.2f} s/step")
        if step % args.val_every == 0 or step == args.steps:
            val = held_out(judged, val_data, args.batch, bf16)
            log(f"step {step}: held-out CFM loss {val['cfm']:.4f}, one-step L1 {val['l1']:.4f} "
                f"{'of the average ' if ema else ''}(best {metric} {min(best, val[metric]):.4f})")
            if val[metric] < best:
                best = val[metric]
                save(args.run / "best.pt", {"model": judged.state_dict(), "step": step, "val": best, "metric": metric,
                                            "held_out": val, "recipe": asdict(recipe), "ema": args.ema,
                                            "config": json.loads(json.dumps(asdict(cfg)))})
            checkpoint(args.run, flow, opt, step, best, ema)
            if missing:  # a corpus still being built: take in the clips spoken since
                train_data, missing = pairs("train", args.run / "mels", args.corpus, args.tokens, True)
                order = sorted(range(len(train_data)), key=lambda i: len(train_data[i][0]))
                log(f"step {step}: {len(train_data)} train clips ({missing} without a wav yet)")


FROM_SCRATCH = (3e-4, 1000)  # (peak learning rate, warm-up steps) of a new flow
FINE_TUNE = (1e-4, 100)  # the same from the shipped flow (re-warming to the from-scratch peak made it worse)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The flow stage's training options; defaults are specli-en's recipe (its shape, the mix objective, its
    inference's conditions). The build adds the paths (run, corpus, tokens, init) and the codebook."""
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--depth", type=int, default=6,
                    help="DiT blocks; more than --init has (a multiple): grown from it, the same function at the start")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lookahead", type=int, default=256, help="pre-lookahead conv channels")
    ap.add_argument("--steps", type=int, default=8000)
    ap.add_argument("--lr", type=float,
                    help=f"peak learning rate (default {FROM_SCRATCH[0]}; {FINE_TUNE[0]} from --init)")
    ap.add_argument("--warmup", type=int, help=f"warm-up steps (default {FROM_SCRATCH[1]}; {FINE_TUNE[1]} from --init)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--crop", type=int, default=256,
                    help="tokens per training utterance at most (256 = 11.9 s: every corpus clip whole)")
    ap.add_argument("--by-length", action=argparse.BooleanOptionalAction, default=True,
                    help="batch clips of similar length (less padding) instead of uniformly drawn ones")
    ap.add_argument("--objective", choices=("cfm", "regress", "mix"), default="mix",
                    help="cfm: flow matching; regress: one-step decoder from t = 0; mix: both, per row")
    ap.add_argument("--reg-frac", type=float, default=0.7, help="mix: share of rows regressed from t = 0")
    ap.add_argument("--reg-loss", choices=("l1", "l2"), default="l1", help="the regression rows' loss")
    ap.add_argument("--prompt-prob", type=float, default=0.0,
                    help="share of utterances conditioned on a prefix of their mel (upstream 0.5; specli-en: none)")
    ap.add_argument("--cfg-dropout", type=float, default=0.0,
                    help="classifier-free guidance dropout (upstream 0.2; specli-en decodes without CFG)")
    ap.add_argument("--streaming", type=float, default=0.0,
                    help="probability of chunk-causal attention (upstream 0.5; specli never streams)")
    ap.add_argument("--val-every", type=int, default=250)
    ap.add_argument("--val-clips", type=int, default=100, help="held-out clips validated")
    ap.add_argument("--val-first", type=int, default=200,
                    help="the first validated clip in held-out file order (0-199: the round trip's sentences)")
    ap.add_argument("--allow-missing", action="store_true",
                    help="train on the clips whose wav exists while the corpus is built; more join at each validation")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--ema", type=float, default=0.0,
                    help="keep an exponential moving average of the weights with this decay (e.g. 0.999); validation "
                    "scores it and best.pt keeps it (0: off, the raw weights)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
