"""DFlash: a block-parallel, non-causal drafter over the target's auxiliary hidden states.

Architecture (z-lab ``dflash/model.py``, speculators ``models/dflash``): the auxiliary states of the
committed positions are concatenated, projected (``fc``: ``n * H -> H``) and normed (``hidden_norm``)
into *context* rows; each draft layer (Qwen3: q/k norms) takes its keys/values from ``[k(context);
k(block)]`` and its queries from the block only, without a causal mask. The block is ``[pending
token, mask x (B - 1)]`` at positions ``P .. P + B - 1``, embedded with the **target's** embedding;
after the final norm the **target's** head (rows of the draft vocabulary) gives logits. Slot ``k``
predicts the token at ``P + k`` (DFlash: B - 1 drafts) or, with ``sample_from_anchor`` (DSpark), the
token at ``P + k + 1`` (B drafts).

Inference keeps the context K/V of every layer in a draft cache indexed by position; each proposal
first writes the rows of the newly committed positions (the target's hidden states handed over in
``DraftRequest.hidden``) and the cache is cropped to the committed length, so rejected drafts never
leave anything behind. Each slot's distribution is the request's own logit filter over the slot's
logits (with the earlier drafts in its prefix), so ``q`` is exactly what the draft was drawn from.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from specli.core.device import host_to_device
from specli.core.drafters.base import (EMPTY, Drafter, DraftProposal, DraftRequest,
                                        ModelDraftOptions, draft_token, sparse_tree)
from specli.core.drafters.llm.base import (
    DraftLayer,
    DraftTrainOutput,
    RMSNorm,
    SpeechDraftConfig,
    SpeechDraftModule,
    TargetParts,
    anchor_positions,
    default_aux_layers,
    init_linear,
    rope,
)
from specli.core.drafters.tree_search import DynamicTreeOptions, TreeNodes, add_children
from specli.core.kv_cache import KVCache


class BlockDraftModule(SpeechDraftModule):
    """The DFlash backbone (also DSpark's): fc + hidden_norm, non-causal Qwen3 layers, norm, target head."""

    def __init__(self, config: SpeechDraftConfig, parts: TargetParts, draft_ids: torch.Tensor | None = None) -> None:
        super().__init__(config, parts, draft_ids)
        h = config.hidden
        self.fc = nn.Linear(config.context_width, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_eps)
        self.layers = nn.ModuleList(DraftLayer(config) for _ in range(config.layers))
        self.norm = RMSNorm(h, config.rms_eps)
        self.to(parts.device)

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """Context rows ``[B, T, H]`` of concatenated auxiliary states ``[B, T, n_aux * H_t]``."""
        return self.hidden_norm(self.fc(features.float()))

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope(positions, self.config.head_dim, self.config.rope_theta)

    def block_hidden(self, ctx_kv: list[tuple[torch.Tensor, torch.Tensor]], tokens: torch.Tensor,
                     positions: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Normed block states ``[B, n, H]`` of block input ids ``tokens [B, n]`` at ``positions [B, n]``
        over each layer's context K/V ``[B, H_kv, P, D]`` (``mask [B, n, P + n]``; None: all visible)."""
        x = self.embed(tokens)
        cos, sin = self._rope(positions)
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x, _, _ = layer(x, x, k, v, mask, cos, sin)
        return self.norm(x)

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys/values ``[B, H_kv, T, D]`` of context rows ``ctx [B, T, H]``."""
        cos, sin = self._rope(positions)
        return [layer.kv(ctx, cos, sin) for layer in self.layers]

    def block_tokens(self, first: torch.Tensor) -> torch.Tensor:
        """``[first, mask x (B - 1)]`` for each entry of ``first [...]`` -> ``[..., B]``."""
        rest = torch.full((*first.shape, self.config.block_size - 1), self.config.mask_token_id,
                          dtype=torch.long, device=first.device)
        return torch.cat([first[..., None].long(), rest], -1)

    def forward_train(self, context: torch.Tensor, input_ids: torch.Tensor,
                      anchors: torch.Tensor | None = None) -> DraftTrainOutput:
        """Blocks at ``anchors [B, A]``: slot 0 holds ``input_ids[anchor]``, the others the mask token; a
        block sees the context rows before its anchor and its own block."""
        if anchors is None:
            raise ValueError("block drafters train on anchors [B, A]")
        h, pos = self._train_hidden(context, input_ids, anchors)
        return DraftTrainOutput(self.head(h), pos)

    def _train_hidden(self, context, input_ids, anchors) -> tuple[torch.Tensor, torch.Tensor]:
        """Normed block states ``[B, A, S, H]`` and the predicted positions ``[B, A, S]``."""
        b, t = input_ids.shape
        a, s = anchors.shape[1], self.config.block_size
        dev = input_ids.device
        ctx = self.context(context)
        kv = self.context_kv(ctx, torch.arange(t, device=dev).expand(b, t))
        first = input_ids.gather(1, anchors.clamp(0, t - 1))
        tokens = self.block_tokens(first).view(b, a * s)
        slot_pos = (anchors[..., None] + torch.arange(s, device=dev)).view(b, a * s)
        ctx_vis = torch.arange(t, device=dev)[None, None, :] < anchors.repeat_interleave(s, 1)[..., None]
        blk = torch.arange(a, device=dev).repeat_interleave(s)
        own = (blk[:, None] == blk[None, :]).expand(b, -1, -1)
        mask = torch.cat([ctx_vis, own], -1)  # [B, A*S, T + A*S]
        h = self.block_hidden(kv, tokens, slot_pos, mask).view(b, a, s, -1)
        offset = 1 if self.config.sample_from_anchor else 0
        pos = anchor_positions(anchors, s, offset, t)
        if not self.config.sample_from_anchor:
            pos[..., 0] = -1  # DFlash: slot 0 holds the known token
        return h, pos

    # -- inference hooks (DSpark overrides) ----------------------------------------------------------
    def slot_logits(self, base: torch.Tensor, hidden: torch.Tensor, slot: int, prev: int) -> torch.Tensor:
        """Draft-vocabulary logits ``[Vd]`` of ``slot`` given the token before it (``prev``)."""
        return base[slot]

    def slot_confidence(self, hidden: torch.Tensor, slot: int, prev: int) -> float | None:
        """Predicted acceptance probability of ``slot`` (None: no confidence head)."""
        return None

    def slot_rows(self, base: torch.Tensor, slot: int, prev: torch.Tensor,
                  table: torch.Tensor | None = None) -> torch.Tensor:
        """Draft-vocabulary logits ``[m, Vd]`` of ``slot`` after each of ``m`` previous tokens ``prev [m]``
        (a dynamic tree's level: one row per frontier node; ``table``: :meth:`slot_table`'s). DFlash's slots
        ignore the previous token."""
        return base[slot].expand(prev.shape[0], -1)

    def slot_table(self) -> torch.Tensor | None:
        """What :meth:`slot_rows` may gather its previous-token terms from (DSpark's Markov table); None here."""
        return None


class DFlashModule(BlockDraftModule):
    """DFlash: slot 0 is the pending token, slots 1..B-1 are drafts (independent q per slot)."""


def new_block_config(kind: str, parts: TargetParts, layers: int, block_size: int, draft_vocab: int = 0,
                     aux_layers: tuple[int, ...] | None = None, convention: str | None = None,
                     markov_rank: int = 0, confidence_head: bool = False, head_bias: bool | None = None,
                     ) -> SpeechDraftConfig:
    """A fresh DFlash / DSpark / EAGLE-3 config shaped like ``parts``' target layers."""
    if aux_layers is None:
        aux_layers, conv = default_aux_layers(kind, parts.layers, layers if kind == "dflash" else 3)
        convention = convention or conv
    return SpeechDraftConfig(
        kind=kind, hidden=parts.hidden, layers=1 if kind == "eagle3" else layers, heads=parts.heads,
        kv_heads=parts.kv_heads, head_dim=parts.head_dim, intermediate=parts.intermediate, target_vocab=parts.vocab,
        draft_vocab=draft_vocab or parts.vocab, aux_layers=tuple(aux_layers), aux_convention=convention or "input",
        block_size=block_size, mask_token_id=parts.mask_token_id, sample_from_anchor=kind == "dspark",
        markov_rank=markov_rank, confidence_head=confidence_head, qk_norm=kind != "eagle3", rms_eps=parts.rms_eps,
        rope_theta=parts.rope_theta, max_positions=parts.max_positions,
        head_bias=parts.head_bias is not None if head_bias is None else head_bias)


def new_dflash(parts: TargetParts, layers: int = 5, block_size: int = 4, draft_vocab_ids: torch.Tensor | None = None,
               seed: int = 0, **kw) -> DFlashModule:
    """A fresh DFlash module for ``parts`` (randomly initialised; published recipe: block 4)."""
    vd = 0 if draft_vocab_ids is None else draft_vocab_ids.numel()
    mod = DFlashModule(new_block_config("dflash", parts, layers, block_size, vd, **kw), parts, draft_vocab_ids)
    init_linear(mod, seed=seed)
    return mod


class ContextCache:
    """Each draft layer's context K/V by position, in step with the committed tokens."""

    def __init__(self, module: BlockDraftModule, max_len: int) -> None:
        cfg = module.config
        self.module = module
        self.kv = KVCache(cfg.layers, 1, cfg.kv_heads, max_len, cfg.head_dim, torch.float32, module.parts.device)

    def sync(self, request: DraftRequest) -> int:
        """Write the rows of the newly committed positions; return the pending token's position ``P``."""
        pos = len(request.tokens) - 1
        hid = request.hidden
        if hid is not None:
            aux = hid.pick(self.module.config.target_layers())
            feats = torch.cat([a.float() for a in aux], -1)  # [1, m, n_aux * H]
            m = feats.shape[1]
            start = pos - m
            if start < 0:
                raise ValueError("more hidden rows than committed positions")
            positions = torch.arange(start, pos, device=feats.device)[None]
            for i, (k, v) in enumerate(self.module.context_kv(self.module.context(feats), positions)):
                self.kv.write(i, start, k, v)
            self.kv.length = pos
        if self.kv.length != pos:
            raise ValueError(f"draft context holds {self.kv.length} positions, {pos} are committed")
        return pos

    def layers_kv(self, pos: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [self.kv.view(i, pos) for i in range(self.module.config.layers)]


class BlockDrafter(Drafter):
    """Proposes with a DFlash / DSpark module: one block forward, then the slots in order.

    ``options.confidence_threshold`` (adaptive strategy) stops the chain when the predicted survival
    (DSpark's confidence head: the running product of its per-slot acceptance predictions; otherwise
    the drafter probability of the slot's token) drops below it; ``tree_topk`` adds sparse-tree
    alternatives. Truncation only shortens proposals, so it never changes the output.
    """

    def __init__(self, module: BlockDraftModule, options: ModelDraftOptions = ModelDraftOptions(),
                 tree: DynamicTreeOptions | None = None, table: torch.Tensor | None = None) -> None:
        self.module = module.eval()
        self.options = options
        self.tree = tree  # an EAGLE-2 dynamic tree over the block's slots instead of a chain (None: chain)
        # the tree levels' previous-token terms (module.slot_table, fixed weights at inference; forks share it)
        self._table = table if table is not None or tree is None else module.slot_table()
        self._ctx: ContextCache | None = None

    def fork(self) -> BlockDrafter:
        """A drafter for another sequence over the same module (its context cache its own)."""
        return BlockDrafter(self.module, self.options, self.tree, self._table)

    def start(self, state, prompt: list[int]) -> None:
        self._ctx = ContextCache(self.module, state.cache.max_len + self.module.config.block_size)

    @torch.inference_mode()
    def propose(self, request: DraftRequest) -> DraftProposal:
        if request.budget < 1 or self._ctx is None:
            return EMPTY
        mod, dev = self.module, self.module.parts.device
        pos = self._ctx.sync(request)
        cfg = mod.config
        tokens = mod.block_tokens(torch.tensor([request.tokens[-1]], device=dev))  # [1, B]
        positions = torch.arange(pos, pos + cfg.block_size, device=dev)[None]
        hidden = mod.block_hidden(self._ctx.layers_kv(pos), tokens, positions)[0]  # [B, H]
        base = mod.head(hidden)  # [B, Vd]
        first = 0 if cfg.sample_from_anchor else 1
        if self.tree is not None:
            return self._dynamic_tree(request, base, first, min(self.tree.depth, cfg.drafts_per_block))
        return self._chain(request, base, hidden, first, min(request.budget, cfg.drafts_per_block))

    def _dynamic_tree(self, request: DraftRequest, base: torch.Tensor, first: int, depth: int) -> DraftProposal:
        """An EAGLE-2 tree (``core.drafters.tree_search``) over the block's slots: level ``j`` reads slot
        ``first + j`` once for the whole frontier (DSpark: plus each frontier token's Markov row)."""
        mod, opts = self.module, self.tree
        nodes = TreeNodes()
        frontier, prev = [-1], [request.tokens[-1]]
        for level in range(depth):
            rows = mod.slot_rows(base, first + level, host_to_device(prev, torch.long, base.device), self._table)
            children = add_children(request, nodes, frontier, mod.scatter_full(rows), opts)
            if not children:
                break
            frontier = nodes.frontier(children, opts.topk)
            prev = [nodes.tokens[i] for i in frontier]
        return nodes.best(min(opts.total, request.budget)) if nodes.tokens else EMPTY

    def _chain(self, request: DraftRequest, base, hidden, first: int, n: int) -> DraftProposal:
        mod, opts = self.module, self.options
        sampled = request.tokens[request.prompt_len :]
        draft, conf, q_rows, alts = [], [], [], []
        prev, survival = request.tokens[-1], 1.0
        for k in range(n):
            slot = first + k
            full = mod.scatter_full(mod.slot_logits(base, hidden, slot, prev))
            probs = request.filter(full[None], [sampled + draft]).softmax(-1)[0]
            if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0:
                break
            tok = draft_token(probs, request)
            p = float(probs[tok])
            c = mod.slot_confidence(hidden, slot, prev)
            survival *= p if c is None else c
            if draft and (survival < opts.confidence_threshold or not math.isfinite(p) or p <= 0):
                break
            draft.append(tok)
            conf.append(p)
            q_rows.append(None if request.greedy else probs)
            alts.append(probs.topk(opts.tree_topk + 1).indices.tolist() if opts.tree_topk else [])
            prev = tok
            if not request.more(conf):
                break
        if not draft:
            return EMPTY
        return sparse_tree(draft, conf, q_rows, alts, request.budget, opts)

    def commit(self, tokens: list[int]) -> None:
        """Crop the draft cache to the committed context (everything but the pending token)."""
        if self._ctx is not None and self._ctx.kv.length > len(tokens) - 1:
            self._ctx.kv.crop(len(tokens) - 1)
