"""Train a DSpark / DFlash / EAGLE-3 drafter for a CosyVoice LM or an audio LLM on ``specli distill data`` shards.

What training reads of the target is a :class:`DraftTarget` (:func:`cosyvoice_target`; audio LLMs:
:func:`specli.distill.audio_lm_data.audio_lm_target`, whose family recipe sets the layer ids, their layer-output
convention and the block / unroll).

Each step takes ``batch`` on-policy sequences (:mod:`specli.distill.speech_data`), the drafter's
auxiliary layers gathered from the stored ones, and runs the drafter's teacher-forced
:meth:`~specli.core.drafters.llm.base.SpeechDraftModule.forward_train`. The target's
distribution for the token at position ``t`` is ``head(last[t - 1])`` (the target's own head, its
bias included: CosyVoice2's ``llm_decoder`` has one, which the published recipes dropped); only
generated positions (eos included) are trained on. Published recipes (SpeechSpec / speculators):

* **DSpark**: 3 layers, block 8 (slot ``k`` predicts ``anchor + k + 1``), draft vocabulary 8192,
  Markov rank 256, loss ``0.1 CE + 0.9 TV``; the confidence head is trained with BCE towards
  ``1 - TV(q, p)`` (its target detached);
* **DFlash**: block 4 (slot 0 is the known token), KL loss with slot weights ``exp(-(k - 1) / 4)``;
* **EAGLE-3**: one layer, test-time-training unroll 7, KL loss with step weights ``0.8 ** k``.

The draft vocabulary is the ``draft_vocab`` speech tokens the target generated most often in the
data, plus every stop id (capped at the target's vocabulary: the whole vocabulary for a small one).
Epochs, step budget, learning-rate schedule and checkpoints (module, config, optimizer, position, under
``OUT/checkpoints``; a rerun resumes from the latest) are :mod:`specli.distill.loop`'s. With
validation sequences, acceptance (tokens per target forward, bonus included) is measured by real
:func:`~specli.core.speculative.speculative_decode` with the drafter at the data's deployment
sampler, and the drafter saved in ``OUT`` (speculators format) is the best validated one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

from specli.distill import losses
from specli.distill.loop import Progress, Trainee, TrainSummary, read_checkpoint, restored_optimizer, train_loop
from specli.distill.speech_data import use_aux_layers
from specli.core.drafters.llm.dflash import BlockDrafter, DFlashModule, new_dflash
from specli.core.drafters.llm.dspark import DSparkModule, new_dspark
from specli.asr.drafters.eagle_head import draft_vocabulary
from specli.core.drafters.llm.eagle3 import Eagle3Drafter, Eagle3Module, new_eagle3
from specli.core.drafters.llm.base import SpeechDraftConfig, SpeechDraftModule, TargetParts
from specli.core.sampling import SamplerOptions, build_sampler, request_generator
from specli.core.job import DecodeJob
from specli.core.types import DraftableTarget
from specli.core.speculative import SpecOptions, speculative_decode
from specli.models.cosyvoice.lm import CosyVoiceModel
from specli.core.types import DecodeStats, accumulate
from specli.errors import SpecliError
from specli.core.drafters.llm.speculators import save_speculators

DrafterKind = Literal["dspark", "dflash", "eagle3"]
# kind -> (draft layers, block size / unroll, slot offset: depth of slot 0)
RECIPES: dict[str, tuple[int, int, int]] = {"dspark": (3, 8, 1), "dflash": (5, 4, 0), "eagle3": (1, 7, 1)}
MODULES = {"dspark": DSparkModule, "dflash": DFlashModule, "eagle3": Eagle3Module}


@dataclass(frozen=True)
class SpeechTrainOptions:
    """How a speech drafter is trained (defaults: the published recipes)."""

    drafter: DrafterKind = "dspark"  # dspark / dflash / eagle3
    layers: int = 0  # draft layers (0 = recipe: dspark 3, dflash 5; eagle3 is always 1)
    block: int = 0  # block size / EAGLE-3 unroll (0 = recipe: dspark 8, dflash 4, eagle3 7)
    draft_vocab: int = 8192  # draft vocabulary rows, most generated first + stop ids (capped at the target's)
    markov_rank: int = 256  # dspark: Markov head rank (0 = none)
    ce_weight: float = 0.1  # dspark: weight of the cross-entropy of the sampled token
    tv_weight: float = 0.9  # dspark: weight of TV(q, p)
    confidence_weight: float = 1.0  # dspark: weight of the confidence head's BCE (0 = no confidence head)
    kl_decay: float = 4.0  # dflash: slot weight exp(-(k - 1) / kl_decay)
    step_decay: float = 0.8  # eagle3: step weight step_decay ** k
    epochs: int = 10  # passes over the training sequences
    steps: int = 0  # stop after this many optimizer steps in all (0 = no limit)
    lr: float = 3e-4  # AdamW peak learning rate
    warmup: int = 20  # optimizer steps of linear warm-up (then cosine to lr / 10 at ``steps`` if given)
    batch: int = 4  # sequences per optimizer step
    anchors: int = 64  # block drafters: anchors sampled per sequence per step
    checkpoint_every: int = 100  # optimizer steps between checkpoints
    val_sequences: int = 16  # held-out sequences decoded for the acceptance (0 = none)
    val_every: int = 1  # validate after every N-th epoch (and after the last one)
    val_max_draft: int = 0  # max_draft of the validation decode (0 = the drafter's block)
    seed: int = 0  # seed of initialisation, sequence order and anchor sampling
    clip: float = 1.0  # gradient-norm clipping

    def __post_init__(self) -> None:
        if self.drafter not in RECIPES:
            raise ValueError(f"unknown drafter {self.drafter!r} (dspark, dflash, eagle3)")
        ints = (self.layers, self.block, self.draft_vocab, self.markov_rank, self.steps, self.val_sequences,
                self.val_max_draft, self.warmup)
        if min(ints) < 0 or self.block == 1:
            raise ValueError("layers, block, draft_vocab, markov_rank, steps, warmup, val_* must be >= 0; block >= 2")
        if min(self.epochs, self.batch, self.anchors, self.checkpoint_every, self.val_every) < 1:
            raise ValueError("epochs, batch, anchors, checkpoint_every and val_every must be >= 1")
        if min(self.ce_weight, self.tv_weight, self.confidence_weight) < 0 or self.ce_weight + self.tv_weight <= 0:
            raise ValueError("loss weights must be >= 0 (ce + tv > 0)")
        if self.lr <= 0 or self.kl_decay <= 0 or not 0 < self.step_decay <= 1 or self.clip <= 0:
            raise ValueError("lr, kl_decay and clip must be > 0; step_decay within (0, 1]")

    def recipe(self) -> tuple[int, int]:
        """(draft layers, block size / unroll) after the recipe defaults."""
        layers, block, _ = RECIPES[self.drafter]
        return self.layers or layers, self.block or block


@dataclass(frozen=True)
class SpeechBatch:
    """``B`` padded sequences and the anchors sampled in them."""

    context: torch.Tensor  # [B, T, n_aux * H] the drafter's auxiliary features
    last: torch.Tensor  # [B, T, H] the target's final normed states
    input_ids: torch.Tensor  # [B, T] input-layout ids (padding: eos)
    plen: torch.Tensor  # [B] prompt lengths (positions >= plen are generated tokens)
    length: torch.Tensor  # [B] sequence lengths
    anchors: torch.Tensor  # [B, A] anchor positions
    anchor_ok: torch.Tensor  # [B, A] False for padding anchors (repeats in short sequences)


Validate = Callable[[SpeechDraftModule, list[dict], int], DecodeStats]  # module, held-out records, max_draft


@dataclass(frozen=True)
class DraftTarget:
    """What drafter training reads of a target (a CosyVoice LM: :func:`cosyvoice_target`; an audio LLM:
    :mod:`specli.distill.audio_lm_data`)."""

    target: DraftableTarget  # a CosyVoice LM, an audio-LLM target (what a drafter reads of it)
    pad_id: int  # id padding the batches (the stop token)
    first_special: int  # ids from here on are always in a reduced draft vocabulary (stop / special tokens)
    recipe: Callable[[str, int], tuple[tuple[int, ...], str]] | None = None  # (kind, depth) -> aux ids, convention
    blocks: dict[str, int] = field(default_factory=dict)  # the family's block size / unroll by kind
    validate: Validate | None = None  # acceptance of held-out records by real speculative decoding (None: none)


def cosyvoice_target(model: CosyVoiceModel, sampler: SamplerOptions = SamplerOptions("ras"),
                     seed: int = 0) -> DraftTarget:
    """A CosyVoice LM's training view: eos pads, stop ids always drafted, validation at ``sampler``."""
    spec = model.spec
    return DraftTarget(model.lm, spec.eos, spec.speech_token_size,
                       validate=lambda module, recs, max_draft: validate(module, model, recs, sampler, seed,
                                                                         max_draft))


def as_draft_target(model: CosyVoiceModel | DraftTarget) -> DraftTarget:
    return model if isinstance(model, DraftTarget) else cosyvoice_target(model)


def new_module(kind: str, model: CosyVoiceModel | DraftTarget, records: list[dict],
               options: SpeechTrainOptions) -> SpeechDraftModule:
    """A fresh drafter for ``model`` with the recipe's sizes (the family's layer ids and block when it has them)
    and a draft vocabulary from ``records``."""
    dt = as_draft_target(model)
    parts = dt.target.draft_parts()
    layers, block = options.recipe()
    block = options.block or dt.blocks.get(kind, block)
    kw = {}
    if dt.recipe is not None:
        aux, convention = dt.recipe(kind, parts.layers)
        kw = {"aux_layers": aux, "convention": convention}
    ids = None
    if options.draft_vocab and options.draft_vocab < parts.vocab:
        counts = torch.zeros(parts.vocab, dtype=torch.long)
        for r in records:
            counts += torch.bincount(r["tokens"][int(r["plen"]):].clamp(max=parts.vocab - 1), minlength=parts.vocab)
        first = dt.first_special
        ids = draft_vocabulary(counts, max(options.draft_vocab, parts.vocab - first + 1), first)
        ids = ids.to(parts.device)
    if kind == "dspark":
        return new_dspark(parts, layers, block, options.markov_rank, options.confidence_weight > 0, ids,
                          seed=options.seed, **kw)
    if kind == "dflash":
        return new_dflash(parts, layers, block, ids, seed=options.seed, **kw)
    return new_eagle3(parts, block, ids, seed=options.seed, **kw)


def layer_index(stored: list[int], module: SpeechDraftModule) -> list[int]:
    """Indices into a record's ``aux`` of the layers ``module`` reads (target numbering)."""
    need = module.config.target_layers()
    missing = [i for i in need if i not in stored]
    if missing:
        raise SpecliError(f"the data stores target layers {stored}, the drafter reads {list(need)} "
                          f"(missing {missing}): regenerate with `distill data --aux-layers ...`")
    return [stored.index(i) for i in need]


def sample_anchors(records: list[dict], count: int, gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` anchors per record among positions ``plen - 1 .. T - 2`` (the token after the anchor
    is generated); fewer when the sequence is short (the rest marked False). [B, A] each."""
    rows, oks = [], []
    for r in records:
        lo, hi = int(r["plen"]) - 1, len(r["tokens"]) - 1  # anchors lo .. hi - 1
        n = max(hi - lo, 0)
        pick = torch.randperm(n, generator=gen)[:count].sort().values + lo if n else torch.zeros(0, dtype=torch.long)
        ok = torch.ones(count, dtype=torch.bool)
        ok[len(pick):] = False
        rows.append(torch.cat([pick, pick.new_full((count - len(pick),), max(lo, 0))]))
        oks.append(ok)
    a = min(count, max(int(o.sum()) for o in oks))
    return torch.stack(rows)[:, :a], torch.stack(oks)[:, :a]


def make_batch(records: list[dict], index: list[int], anchors: int, pad_id: int, device: torch.device,
               gen: torch.Generator | None = None) -> SpeechBatch:
    """Pad ``records`` into one batch with the auxiliary layers ``index`` concatenated."""
    b, t = len(records), max(len(r["tokens"]) for r in records)
    h = records[0]["last"].shape[-1]
    context = torch.zeros(b, t, len(index) * h, device=device)
    last = torch.zeros(b, t, h, device=device)
    ids = torch.full((b, t), pad_id, dtype=torch.long, device=device)
    for i, r in enumerate(records):
        n = len(r["tokens"])
        context[i, :n] = r["aux"][:, index].float().reshape(n, -1).to(device)
        last[i, :n] = r["last"].float().to(device)
        ids[i, :n] = r["tokens"].to(device)
    plen = torch.tensor([int(r["plen"]) for r in records], device=device)
    length = torch.tensor([len(r["tokens"]) for r in records], device=device)
    a, ok = sample_anchors(records, anchors, gen)
    return SpeechBatch(context, last, ids, plen, length, a.to(device), ok.to(device))


def target_logits(parts: TargetParts, last: torch.Tensor) -> torch.Tensor:
    """The target's logits ``[..., V]`` of its final normed states ``last [..., H]``: its own head, the
    bias included (CosyVoice2's ``llm_decoder``)."""
    with torch.no_grad():
        bias = None if parts.head_bias is None else parts.head_bias.float()
        return F.linear(last.float(), parts.head_weight.float(), bias)


def batch_loss(module: SpeechDraftModule, batch: SpeechBatch, options: SpeechTrainOptions
               ) -> tuple[torch.Tensor, dict[str, float]]:
    """The recipe's loss of one batch and its parts (floats)."""
    kind, cfg = options.drafter, module.config
    out = module.forward_train(batch.context, batch.input_ids, batch.anchors)
    pos = out.positions  # [B, A, S]
    b = pos.shape[0]
    depth = (torch.arange(pos.shape[-1], device=pos.device) + RECIPES[kind][2]).expand_as(pos)  # [B, A, S]
    # a generated token (eos included), predicted from an anchor inference drafts from (plen - 1 on)
    valid = (pos >= batch.plen[:, None, None]) & (pos < batch.length[:, None, None])
    valid &= pos - depth >= batch.plen[:, None, None] - 1
    if kind != "eagle3":
        valid &= batch.anchor_ok[..., None]
    if not bool(valid.any()):
        raise ValueError("no generated token to predict in this batch")
    safe = pos.clamp(min=1)
    rows = batch.last[torch.arange(b, device=pos.device)[:, None, None], safe - 1][valid]  # [N, H]
    labels = batch.input_ids.gather(1, safe.view(b, -1)).view_as(pos)[valid]  # [N]
    draft = out.logits[valid]  # [N, Vd]
    target = target_logits(module.parts, rows)  # [N, V]
    d2t, t2d = losses.vocab_maps(module.draft_ids, cfg.target_vocab)
    depth = depth[valid]  # [N]
    if kind == "dspark":
        loss, logs = losses.dspark_loss(draft[None], target[None], labels[None], d2t, t2d,
                                        torch.ones_like(labels, dtype=torch.bool)[None],
                                        options.ce_weight, options.tv_weight)
        if out.confidence is not None and options.confidence_weight > 0:
            bce = losses.confidence_bce(out.confidence[valid], draft, target, d2t)
            loss = loss + options.confidence_weight * bce
            logs["bce"] = float(bce.detach())
        return loss, logs
    if kind == "dflash":
        w = torch.exp(-(depth.float() - 1) / options.kl_decay) * (depth > 0)
    else:
        w = options.step_decay ** (depth.float() - 1)
    kl = losses.weighted_kl(draft[None], target[None], d2t, w)
    return kl, {"kl": float(kl.detach())}


def drafter_for(module: SpeechDraftModule):
    """The runtime drafter of a trained module (chain, no truncation)."""
    return Eagle3Drafter(module) if module.config.kind == "eagle3" else BlockDrafter(module)


def validate(module: SpeechDraftModule, model: CosyVoiceModel, records: list[dict], sampler: SamplerOptions,
             seed: int = 0, max_draft: int = 0) -> DecodeStats:
    """Decode each held-out record's prompt again with real speculative decoding (``module`` drafting,
    the data's sampler and per-request generator); the summed stats (``acceptance_length``)."""
    was_training = module.training
    use_aux_layers(model, module.config.target_layers())
    spec, lm = model.spec, model.lm
    drafter = drafter_for(module)
    limit = max_draft or module.config.drafts_per_block
    stats = DecodeStats()
    for r in records:
        prompt = r["tokens"][: int(r["plen"])].tolist()
        min_len, max_len = int(r["min_len"]), int(r["max_len"])
        rules, params = build_sampler(sampler, prompt_tokens=r["prompt_speech"].tolist(),
                                      stop_ids=list(spec.stop_ids), min_len_mask_id=spec.min_length_mask_id,
                                      min_len=min_len, stop_into=spec.eos)
        state = lm.start(len(prompt) + max_len + 2)
        gen = request_generator(seed, r["id"], state.cache.device)
        job = DecodeJob(tuple(prompt), rules, spec.eos, max_len, sampling=params, generator=gen)
        res = speculative_decode(lm, state, job, drafter, SpecOptions(max_draft=min(limit, 64)))
        accumulate(stats, res.stats)
    module.train(was_training)
    return stats


def _info(options: SpeechTrainOptions, step: int, loss: float, val: float | None, n: int, manifest: dict) -> dict:
    info = {k: v for k, v in asdict(options).items()}
    info.update(steps_done=step, last_loss=loss, val_acceptance=val, train_sequences=n,
                sampler=manifest.get("sampler"), data_model=manifest.get("model"))
    return info


def _restore(state: dict | None, model: DraftTarget, records: list[dict], options: SpeechTrainOptions,
             where: Path) -> SpeechDraftModule:
    """The module of the checkpoint ``state`` (refused if another kind), else a new one."""
    if state is None:
        return new_module(options.drafter, model, records, options)
    cfg = SpeechDraftConfig(**json.loads(state["config"]))
    if cfg.kind != options.drafter:
        raise SpecliError(f"{where}: checkpoints of a {cfg.kind} drafter, not {options.drafter}")
    module = MODULES[cfg.kind](cfg, model.target.draft_parts(), state["module"]["draft_ids"])
    module.load_state_dict(state["module"])
    return module


def _entries(module: SpeechDraftModule) -> dict:
    cfg = asdict(module.config)
    cfg.pop("extra", None)
    return {"module": module.state_dict(), "config": json.dumps(cfg)}


def _trainee(module: SpeechDraftModule, opt: torch.optim.Optimizer, model: DraftTarget, out: Path,
             records: list[dict], val_set: list[dict], manifest: dict, options: SpeechTrainOptions) -> Trainee:
    """The loop's view of a speech drafter: the recipe's loss, validation (the target's: CosyVoice at the data's
    sampler), speculators-format save into ``out``."""
    index = layer_index([int(i) for i in manifest.get("aux_layers", [])], module)

    def loss(idx: list[int], gen: torch.Generator) -> tuple[torch.Tensor, str]:
        batch = make_batch([records[j] for j in idx], index, options.anchors, model.pad_id, module.parts.device, gen)
        total, logs = batch_loss(module, batch, options)
        return total, ", ".join(f"{k} {v:.3f}" for k, v in logs.items())

    def check() -> tuple[float, str]:
        stats = model.validate(module, val_set, options.val_max_draft)
        rates = ", ".join(f"{a / max(n, 1):.2f}" for a, n in zip(stats.position_accepts, stats.position_attempts))
        return stats.acceptance_length, f"on {len(val_set)} sequence(s) (per position {rates})"

    def save(step: int, last_loss: float, val: float | None) -> None:
        save_speculators(module, out, _info(options, step, last_loss, val, len(records), manifest))

    validates = bool(val_set) and model.validate is not None
    return Trainee(module, opt, len(records), loss, check if validates else None, save, lambda: _entries(module))


def train_speech(
    records: list[dict], model: CosyVoiceModel | DraftTarget, out: Path,
    options: SpeechTrainOptions = SpeechTrainOptions(), val_records: list[dict] | None = None,
    manifest: dict | None = None, progress: Progress | None = None,
) -> TrainSummary:
    """Train (or resume training) a drafter for ``model`` on ``records`` (only their generated tokens are
    predicted); save it under ``out``. A CosyVoice model validates at the data's sampler."""
    manifest = manifest or {}
    if not isinstance(model, DraftTarget):
        sampler = SamplerOptions(**manifest["sampler"]) if "sampler" in manifest else SamplerOptions("ras")
        model = cosyvoice_target(model, sampler, int(manifest.get("seed", 0)))
    records = [r for r in records if len(r["tokens"]) > int(r["plen"])]
    if not records:
        raise ValueError("no training sequence has a generated token")
    state = read_checkpoint(out)
    module = _restore(state, model, records, options, out / "checkpoints").train()
    opt = restored_optimizer(module, options.lr, state, weight_decay=0.0)
    val_set = (val_records or [])[: options.val_sequences]
    trainee = _trainee(module, opt, model, out, records, val_set, manifest, options)
    return train_loop(trainee, options, out, state, progress)
