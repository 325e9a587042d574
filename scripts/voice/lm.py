"""Train specli-en's speech-token LM: CosyVoice3's LM layout over a small Qwen2, text -> speech tokens.

The module is upstream's ``CosyVoice3LM`` body (``Qwen2Encoder`` = ``Qwen2ForCausalLM`` run as ``.model.model``,
``speech_embedding`` and a bias-free ``llm_decoder`` of ``speech_token_size + 200`` rows), so the saved ``llm.pt``
has the official keys (``llm.model.model.*``, ``llm.model.lm_head.weight``, ``speech_embedding.weight``,
``llm_decoder.weight``) and loads through specli's CosyVoice loader like official weights. The body is
transformers' ``Qwen2ForCausalLM`` (the reference specli's lean Qwen2 decoder is tested against).

Sequences are built by specli itself (its tokenizer and ``InputLayout``): ``[sos] + text ids of
"You are a helpful assistant.<|endofprompt|>" + text ids of the sentence + [task] + speech tokens``, exactly
what ``specli synthesize`` feeds at inference (CosyVoice3's default prompt text, tokenised apart from the text).
Teacher forcing; cross-entropy on the speech tokens and eos only (upstream's unistream target, lsm 0).

Training is resumable (``<run>/checkpoints/ckpt-*.pt``, atomic, the two latest kept), bf16 autocast on CPUs
with native bf16, AdamW with warm-up and cosine decay, batches by a token budget, held-out loss every
``--val-every`` steps, ``<run>/best.pt`` the best held-out model.

    python -m scripts.voice lm --work DIR               # <work>/train/lm, from the shipped voice's LM
    python -m scripts.voice lm --work DIR --init none --steps 20000 --dropout 0 --token-noise 0   # from scratch
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from specli.core.device import cpu_native_bf16
from specli.models.cosyvoice.layout import InputLayout, SpeechLMSpec
from specli.models.cosyvoice.text import CV3_DEFAULT_PROMPT, CosyVoiceTokenizer

from .common import checkpoint, clips, log, lr_at, restore, save, update
from .tokenizer.tokens import speech_tokens

EXTRA_ROWS = 200  # CosyVoice3: speech_embedding / llm_decoder rows past the codebook (sos, eos, task, fill, ...)


@dataclass(frozen=True)
class LMShape:
    """The small Qwen2 of specli-en (written to CosyVoice-BlankEN/config.json)."""

    hidden: int = 320  # hidden size
    layers: int = 8  # decoder layers
    heads: int = 5  # attention heads (head dim 64)
    kv_heads: int = 1  # key/value heads (GQA)
    intermediate: int = 1280  # MLP width
    max_positions: int = 4096  # RoPE positions


class VoiceLM(nn.Module):
    """``CosyVoice3LM``'s trainable parts with upstream's module names (so ``state_dict`` keys are ``llm.pt``'s)."""

    def __init__(self, qcfg: Qwen2Config, speech_rows: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.llm = nn.Module()
        self.llm.model = Qwen2ForCausalLM(qcfg)  # keys llm.model.model.*, llm.model.lm_head.weight
        self.speech_embedding = nn.Embedding(speech_rows, qcfg.hidden_size)
        self.llm_decoder = nn.Linear(qcfg.hidden_size, speech_rows, bias=False)
        self.speech_rows = speech_rows
        self.dropout = nn.Dropout(dropout)  # on the input embeddings and each residual branch (training only)
        for layer in self.llm.model.model.layers:
            layer.self_attn.register_forward_hook(self._drop_branch)
            layer.mlp.register_forward_hook(self._drop_branch)

    def _drop_branch(self, _module: nn.Module, _args: tuple, output):  # noqa: ANN001, ANN202 - a forward hook
        """Dropout on an attention / MLP output before its residual add (Qwen2 itself has none)."""
        if isinstance(output, tuple):
            return (self.dropout(output[0]), *output[1:])
        return self.dropout(output)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:  # [B, T] input-layout ids -> [B, T, H]
        speech = ids < self.speech_rows
        text = self.llm.model.model.embed_tokens(torch.where(speech, 0, ids - self.speech_rows))
        return torch.where(speech[..., None], self.speech_embedding(torch.where(speech, ids, 0)), text)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, scored: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, T, speech_rows]`` logits; with ``scored`` (``[B, T]`` bool) only those positions' ``[N, speech_rows]``:
        the decoder over the whole codebook is the largest matmul, and training scores only the speech targets."""
        embeds = self.dropout(self.embed(ids))
        hidden = self.llm.model.model(inputs_embeds=embeds, attention_mask=mask).last_hidden_state  # [B, T, H]
        return self.llm_decoder(hidden if scored is None else hidden[scored])


def qwen_config(shape: LMShape, text_vocab: int) -> Qwen2Config:
    return Qwen2Config(vocab_size=text_vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                       num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                       intermediate_size=shape.intermediate, max_position_embeddings=shape.max_positions,
                       rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
                       attention_dropout=0.0)


def build_sequences(split: str, blank: Path, spec: SpeechLMSpec, corpus: Path,
                    tokens_npz: Path) -> list[tuple[list[int], int]]:
    """``(input ids incl. the speech tokens and eos, prompt length)`` per clip of the ``corpus`` with speech tokens
    in ``tokens_npz``, as specli builds them."""
    tok = CosyVoiceTokenizer(blank, "cosyvoice3")
    lay = InputLayout(spec)
    prefix = tok.encode(CV3_DEFAULT_PROMPT)
    tokens = speech_tokens(split, tokens_npz)
    out = []
    for clip in clips(split, corpus):
        codes = tokens.get(clip.id)
        if codes is None:
            continue
        prompt = lay.prompt(tok.encode(clip.text), prefix)
        out.append(([*prompt, *map(int, codes), spec.eos], len(prompt)))
    return out


def batches(seqs: list[tuple[list[int], int]], budget: int, rng: random.Random) -> list[list[int]]:
    """Index batches of similar length, at most ``budget`` padded tokens each, in a shuffled order."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]) + rng.random())
    out, cur, longest = [], [], 0
    for i in order:
        n = len(seqs[i][0])
        if cur and max(longest, n) * (len(cur) + 1) > budget:
            out.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def collate(seqs: list[tuple[list[int], int]], idx: list[int]) -> tuple[torch.Tensor, ...]:
    """ids / attention mask / targets ``[B, T]`` (targets -100 on the prompt and padding; next-token)."""
    longest = max(len(seqs[i][0]) for i in idx)
    ids = torch.zeros(len(idx), longest, dtype=torch.long)
    mask = torch.zeros(len(idx), longest, dtype=torch.long)
    target = torch.full((len(idx), longest), -100, dtype=torch.long)
    for b, i in enumerate(idx):
        seq, plen = seqs[i]
        ids[b, : len(seq)] = torch.tensor(seq)
        mask[b, : len(seq)] = 1
        target[b, plen - 1 : len(seq) - 1] = torch.tensor(seq[plen:])  # position t predicts token t + 1
    return ids, mask, target


def corrupt(batch: tuple[torch.Tensor, ...], rate: float, codebook: int,
            gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Replace a ``rate`` share of the *input* speech tokens by random codes (targets kept): the LM learns to
    continue after a wrong token, as it must after its own sampled ones (exposure bias)."""
    ids, mask, target = batch
    if rate <= 0:
        return batch
    # [B, T] speech-token inputs: text ids sit past the speech rows, sos/task/eos past the codebook, padding has mask 0
    speech = ids < codebook
    hit = (torch.rand(ids.shape, generator=gen) < rate) & speech & mask.bool()
    noise = torch.randint(0, codebook, ids.shape, generator=gen)
    return torch.where(hit, noise, ids), mask, target


def new_model(blank: Path, codebook: int, shape: LMShape, dropout: float) -> VoiceLM:
    """A fresh LM over ``codebook`` speech codes and the text tokenizer at ``blank`` (its vocabulary padded to a
    multiple of 64 rows), as ``train`` builds it and ``--init`` weights must fit it."""
    text_vocab = len(CosyVoiceTokenizer(blank, "cosyvoice3"))
    return VoiceLM(qwen_config(shape, -(-text_vocab // 64) * 64), SpeechLMSpec("cosyvoice3", codebook).speech_rows,
                   dropout)


def loss_of(model: VoiceLM, batch: tuple[torch.Tensor, ...], bf16: bool) -> torch.Tensor:
    """Mean cross-entropy over the speech targets (``target != -100``), the decoder run on those positions only."""
    ids, mask, target = batch
    scored = target != -100  # [B, T]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(ids, mask, scored)  # [N, speech_rows]
    return F.cross_entropy(logits.float(), target[scored])


@torch.no_grad()
def held_out_loss(model: VoiceLM, seqs, budget: int, bf16: bool) -> float:
    model.eval()
    total, count = 0.0, 0
    for idx in batches(seqs, budget, random.Random(0)):
        batch = collate(seqs, idx)
        n = int((batch[2] != -100).sum())
        total += float(loss_of(model, batch, bf16)) * n
        count += n
    model.train()
    return total / max(count, 1)


def train(args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    spec = SpeechLMSpec("cosyvoice3", args.codebook)
    train_seqs = build_sequences("train", args.blank, spec, args.corpus, args.tokens)
    val_seqs = build_sequences("heldout", args.blank, spec, args.corpus, args.tokens)
    shape = LMShape(**{**asdict(SHAPE), **json.loads(args.shape or "{}")})
    model = new_model(args.blank, args.codebook, shape, args.dropout)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    step, best = restore(args.run, model, opt, args.init)  # a new run starts from the voice's llm.pt (--init)
    bf16 = args.bf16 and cpu_native_bf16()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"LM {shape} ({n_params / 1e6:.1f}M params), {len(train_seqs)} train / {len(val_seqs)} held-out sequences, "
        f"resuming at step {step}, bf16 {bf16}")
    rng = random.Random(args.seed + step)
    noise_gen = torch.Generator().manual_seed(args.seed + step)
    t0, seen = time.perf_counter(), 0
    while step < args.steps:
        for idx in batches(train_seqs, args.batch_tokens, rng):
            loss = loss_of(model, corrupt(collate(train_seqs, idx), args.token_noise, args.codebook, noise_gen), bf16)
            update(model, opt, loss, lr_at(step, args.lr, args.warmup, args.steps))
            step, seen = step + 1, seen + 1
            if step % args.log_every == 0:
                log(f"step {step}: loss {loss.item():.4f} lr {lr_at(step, args.lr, args.warmup, args.steps):.2e} "
                    f"{(time.perf_counter() - t0) / seen:.2f} s/step")
            if step % args.val_every == 0 or step == args.steps:
                val = held_out_loss(model, val_seqs, args.batch_tokens, bf16)
                log(f"step {step}: held-out loss {val:.4f} (best {min(best, val):.4f})")
                if val < best:
                    best = val
                    save(args.run / "best.pt", {"model": model.state_dict(), "step": step, "val": val,
                                                "shape": asdict(shape), "codebook": args.codebook,
                                                "text_vocab": model.llm.model.config.vocab_size})
                checkpoint(args.run, model, opt, step, best)
            if step >= args.steps:
                break


SHAPE = LMShape(hidden=256, layers=6, heads=4, kv_heads=2, intermediate=1024)  # specli-en's LM (6.7M parameters)
FROM_SCRATCH = (5e-4, 500, 500)  # (peak learning rate, warm-up steps, steps between validations) of a new LM
FINE_TUNE = (1e-4, 50, 250)  # the same from the shipped LM (re-warming to the from-scratch peak made it worse)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The LM stage's training options; defaults are specli-en's recipe (its shape; dropout and input-token noise,
    as the LM overfits). The build adds the paths (run, blank, corpus, tokens, init) and the codebook."""
    ap.add_argument("--shape", help=f'JSON LMShape overrides of {asdict(SHAPE)}, e.g. {{"layers": 8}}')
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--lr", type=float,
                    help=f"peak learning rate (default {FROM_SCRATCH[0]}; {FINE_TUNE[0]} from --init)")
    ap.add_argument("--warmup", type=int, help=f"warm-up steps (default {FROM_SCRATCH[1]}; {FINE_TUNE[1]} from --init)")
    ap.add_argument("--batch-tokens", type=int, default=6000, help="padded tokens per step")
    ap.add_argument("--val-every", type=int,
                    help=f"steps between validations (default {FROM_SCRATCH[2]}; {FINE_TUNE[2]} from --init)")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dropout", type=float, default=0.1, help="dropout on embeddings and residual branches")
    ap.add_argument("--token-noise", type=float, default=0.05,
                    help="share of input speech tokens replaced by random codes (targets kept)")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
