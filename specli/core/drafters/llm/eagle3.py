"""EAGLE-3 for decoder-only targets: one Llama-style draft layer over fused auxiliary states.

Row ``t`` of the draft layer reads ``[embed(x_t); g_{t-1}]`` (``2H`` wide; ``input_layernorm`` on the
embedding, ``hidden_norm`` on the hidden half, residual = the hidden half), where ``g_{t-1} = fc(
[aux_1; aux_2; aux_3] at t - 1)`` (``fc: 3H -> H``) is the target's fused state that predicted ``x_t``.
Attention is causal over the draft layer's own cache of committed rows. Drafting from the pending
token at position ``P``: step 0 reads ``[embed(x_P); g_{P-1}]``; step ``j`` reads ``[embed(d_j);
o_{P+j-1}]`` (its own previous output); ``norm`` then the target's head (draft-vocabulary rows) give
the logits, which the request's logit filter turns into ``q``. Training unrolls the same steps
(test-time training, :meth:`Eagle3Module.forward_train`): step ``j`` of the row at position ``r``
sees the step-0 rows up to ``r - j`` and its own chain's earlier steps.

Row 0: specli's own drafters keep a row ``[embed(x_0); 0]`` (``config.eagle_zero_row``). SpecForge / SGLang
have none (their row ``t`` is ``[embed(x_{t+1}); g_t]`` at position ``t``, one less than here: RoPE is relative,
so only the missing row matters); with ``eagle_zero_row`` False position 0 is cached but never attended (nor
trained: anchor 0 gets no target).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from specli.core.drafters.base import (EMPTY, Drafter, DraftProposal, DraftRequest,
                                        ModelDraftOptions, draft_token, sparse_tree)
from specli.core.device import host_to_device
from specli.core.drafters.llm.dflash import new_block_config
from specli.core.drafters.llm.base import (
    DraftLayer,
    DraftTrainOutput,
    RMSNorm,
    SpeechDraftConfig,
    SpeechDraftModule,
    TargetParts,
    init_linear,
    rope,
)
from specli.core.drafters.tree_search import DynamicTreeOptions, TreeNodes, add_children
from specli.core.kv_cache import KVCache

MAX_STEPS = 24  # most draft steps per proposal


class Eagle3Module(SpeechDraftModule):
    """fc (3H -> H), one draft layer (2H input), norm; the target's embedding and head rows frozen."""

    def __init__(self, config: SpeechDraftConfig, parts: TargetParts, draft_ids: torch.Tensor | None = None) -> None:
        super().__init__(config, parts, draft_ids)
        self.fc = nn.Linear(config.context_width, config.hidden, bias=False)
        self.layers = nn.ModuleList([DraftLayer(config, eagle=True)])
        self.norm = RMSNorm(config.hidden, config.rms_eps)
        self.to(parts.device)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """``g = fc(features)``: ``[..., 3 * H_t] -> [..., H]``."""
        return self.fc(features.float())

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             k_pre: torch.Tensor | None, v_pre: torch.Tensor | None, mask: torch.Tensor | None):
        """Rows ``[embed(tokens); hidden]`` (``[B, n]`` ids, ``[B, n, H]``) -> (output ``[B, n, H]``, k, v)."""
        x = torch.cat([self.embed(tokens), hidden], -1)
        cos, sin = rope(positions, self.config.head_dim, self.config.rope_theta)
        return self.layers[0](x, hidden, k_pre, v_pre, mask, cos, sin)

    def forward_train(self, context: torch.Tensor, input_ids: torch.Tensor,
                      anchors: torch.Tensor | None = None) -> DraftTrainOutput:
        """Test-time-training unroll of ``config.block_size`` steps for every anchor position.

        Returns ``logits [B, T, S, Vd]``: anchor ``a`` (the pending token's position), step ``j``
        predicts the token at ``a + j + 1`` (``positions``; -1 past the end). ``anchors`` is ignored.
        """
        b, t = input_ids.shape
        s, dev = self.config.block_size, input_ids.device
        g = self.fuse(context)
        hidden = torch.cat([g.new_zeros(b, 1, g.shape[-1]), g[:, :-1]], 1)  # row r reads g_{r-1}
        positions = torch.arange(t, device=dev).expand(b, t)
        rows = torch.arange(t, device=dev)
        skip_row0 = not self.config.eagle_zero_row  # SpecForge: position 0 is no key (row 0 sees itself alone)
        ks, vs, outs = [], [], []
        for j in range(s):
            masks = [rows[None, :] <= (rows - j)[:, None]]  # step-0 keys up to the anchor r - j
            if skip_row0:
                masks[0] = masks[0] & ((rows[None, :] > 0) | (rows[:, None] == 0))
            masks += [rows[None, :] == (rows - j + i)[:, None] for i in range(1, j + 1)]
            mask = torch.cat(masks, -1)[None]  # [1, T, (j + 1) * T]
            k_pre = torch.cat(ks, 2) if ks else None
            v_pre = torch.cat(vs, 2) if vs else None
            out, k, v = self.step(input_ids, hidden, positions, k_pre, v_pre, mask)
            ks.append(k)
            vs.append(v)
            outs.append(self.head(self.norm(out)))  # [B, T, Vd]: row r = anchor r - j
            hidden = torch.cat([out.new_zeros(b, 1, out.shape[-1]), out[:, :-1]], 1)
        logits = torch.stack(outs, 2)  # [B, T(row), S, Vd]
        idx = (rows[:, None] + torch.arange(s, device=dev)).clamp(max=t - 1)  # row of anchor a at step j
        per_anchor = logits[:, idx, torch.arange(s, device=dev)]  # [B, T(anchor), S, Vd]
        pos = rows[:, None] + torch.arange(s, device=dev) + 1
        pos = torch.where(pos < t, pos, torch.full_like(pos, -1))
        if skip_row0:
            pos[0] = -1  # anchor 0 (x_0 with no target state) is not a SpecForge row
        pos = pos.expand(b, t, s)
        return DraftTrainOutput(per_anchor, pos.contiguous())


def new_eagle3(parts: TargetParts, unroll: int = 7, draft_vocab_ids: torch.Tensor | None = None, seed: int = 0,
               **kw) -> Eagle3Module:
    """A fresh EAGLE-3 module (TTT unroll ``unroll``, stored as ``block_size``)."""
    vd = 0 if draft_vocab_ids is None else draft_vocab_ids.numel()
    mod = Eagle3Module(new_block_config("eagle3", parts, 1, unroll, vd, **kw), parts, draft_vocab_ids)
    init_linear(mod, seed=seed)
    return mod


class Eagle3Drafter(Drafter):
    """Autoregressive draft steps with an :class:`Eagle3Module`: a chain (adaptive length, sparse tree) or an
    EAGLE-2 dynamic tree (``tree``: each level one draft-layer forward over the frontier, under a tree mask)."""

    def __init__(self, module: Eagle3Module, options: ModelDraftOptions = ModelDraftOptions(),
                 tree: DynamicTreeOptions | None = None) -> None:
        self.module = module.eval()
        self.options = options
        self.tree = tree  # an EAGLE-2 dynamic tree instead of a chain (None: chain)
        self._kv: KVCache | None = None
        self._g: torch.Tensor | None = None  # [max_len, H] fused target state of each committed position

    def fork(self) -> Eagle3Drafter:
        """A drafter for another sequence over the same module (its caches its own)."""
        return Eagle3Drafter(self.module, self.options, self.tree)

    def start(self, state, prompt: list[int]) -> None:
        cfg, dev = self.module.config, self.module.parts.device
        rows = MAX_STEPS if self.tree is None else max(MAX_STEPS, self.tree.slots)  # draft rows past the context
        n = state.cache.max_len + rows + 2
        self._kv = KVCache(1, 1, cfg.kv_heads, n, cfg.head_dim, torch.float32, dev)
        self._g = torch.zeros(n, cfg.hidden, device=dev)

    def _states(self, request: DraftRequest) -> int:
        """Write the fused target states of newly committed positions; return the pending position ``P``."""
        mod, pos, hid = self.module, len(request.tokens) - 1, request.hidden
        if hid is not None:
            aux = hid.pick(mod.config.target_layers())  # [1, m, H] each
            m = aux[0].shape[1]
            self._g[pos - m : pos] = mod.fuse(torch.cat([a.float() for a in aux], -1))[0]
        if self._kv.length > pos:
            self._kv.crop(pos)
        return pos

    def _root(self, request: DraftRequest, pos: int, hide_row0: bool) -> torch.Tensor:
        """One forward over the rows of the newly committed positions and the pending token's row (``P``: token
        ``x_P``, state ``g_{P-1}``, both final, so the row stays cached); returns that row's output ``[1, 1, H]``,
        step 0 of a proposal. Only the pending row's attention matters (the others keep just their K/V)."""
        dev, start = self._g.device, self._kv.length
        toks = host_to_device([request.tokens[start : pos + 1]], torch.long, dev)
        prev = torch.cat([self._g.new_zeros(1, self._g.shape[1]), self._g[:pos]])[start : pos + 1][None]
        mask = torch.ones(pos + 1 - start, pos + 1, dtype=torch.bool, device=dev).tril(start)  # causal
        if hide_row0:
            mask[-1, 0] = False
        return self._append(toks, prev, torch.arange(start, pos + 1, device=dev)[None], mask[None])[:, -1:]

    def _append(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        """Draft-layer rows ``[embed(tokens); hidden]`` (``[1, m]``, ``[1, m, H]``) over the cached rows, their K/V
        appended to the cache; ``mask [1, m, n + m]`` (None: all visible). Returns their outputs ``[1, m, H]``."""
        n = self._kv.length
        k_pre, v_pre = self._kv.view(0, n)
        out, k, v = self.module.step(tokens, hidden, positions, k_pre, v_pre, mask)
        self._kv.write(0, n, k, v)
        self._kv.length = n + tokens.shape[1]
        return out

    @torch.inference_mode()
    def propose(self, request: DraftRequest) -> DraftProposal:
        if request.budget < 1 or self._kv is None:
            return EMPTY
        pos = self._states(request)
        hide_row0 = not self.module.config.eagle_zero_row and pos > 0  # SpecForge / SGLang: no key at position 0
        out = self._root(request, pos, hide_row0)
        if self.tree is not None:
            proposal = self._dynamic_tree(request, pos, out, hide_row0)
        else:
            proposal = self._chain(request, pos, out, hide_row0)
        self._kv.crop(pos + 1)
        return proposal

    def _chain(self, request: DraftRequest, pos: int, out: torch.Tensor, hide_row0: bool) -> DraftProposal:
        mod, opts, dev = self.module, self.options, self._g.device
        sampled = request.tokens[request.prompt_len :]
        draft, conf, q_rows, alts = [], [], [], []
        survival = 1.0
        for j in range(min(request.budget, MAX_STEPS)):
            if j:  # step j reads the last draft and step j - 1's output
                mask = None
                if hide_row0:
                    mask = torch.ones(1, 1, self._kv.length + 1, dtype=torch.bool, device=dev)
                    mask[..., 0] = False
                out = self._append(torch.tensor([[draft[-1]]], device=dev), out, torch.tensor([[pos + j]], device=dev),
                                   mask)
            full = mod.scatter_full(mod.head(mod.norm(out))[0, 0])
            probs = request.filter(full[None], [sampled + draft]).softmax(-1)[0]
            if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0:
                break
            tok = draft_token(probs, request)
            p = float(probs[tok])
            survival *= p
            if draft and (survival < opts.confidence_threshold or not math.isfinite(p) or p <= 0):
                break
            draft += [tok]
            conf.append(p)
            q_rows.append(None if request.greedy else probs)
            alts.append(probs.topk(opts.tree_topk + 1).indices.tolist() if opts.tree_topk else [])
            if not request.more(conf):
                break
        return sparse_tree(draft, conf, q_rows, alts, request.budget, opts) if draft else EMPTY

    def _dynamic_tree(self, request: DraftRequest, pos: int, out: torch.Tensor, hide_row0: bool) -> DraftProposal:
        """An EAGLE-2 tree (``core.drafters.tree_search``): level 0 reads the pending row's output ``out``; level
        ``j`` is one draft-layer forward over the frontier's rows at position ``pos + j``, each row reading its
        parent's output and seeing the context (through ``pos``) plus its own ancestors' draft rows (appended to
        the cache; the caller crops them)."""
        mod, opts, dev = self.module, self.tree, self._g.device
        nodes = TreeNodes()
        frontier, tokens, hidden = [-1], [], out  # the rows of this level: their nodes, input tokens and states
        seen: list[list[int]] = [[]]  # each row's ancestors' draft-row cache slots (its own row excluded)
        for level in range(min(opts.depth, MAX_STEPS)):
            n, m = self._kv.length, len(frontier)  # this level's rows go to cache slots n .. n + m - 1
            if level:
                mask = torch.zeros(1, m, n + m, dtype=torch.bool, device=dev)
                mask[0, :, : pos + 1] = True
                if hide_row0:
                    mask[0, :, 0] = False
                for r, slots in enumerate(seen):
                    mask[0, r, slots + [n + r]] = True
                out = self._append(host_to_device([tokens], torch.long, dev), hidden,
                                   torch.full((1, m), pos + level, device=dev), mask)
            children = add_children(request, nodes, frontier, mod.scatter_full(mod.head(mod.norm(out))[0]), opts)
            if not children:
                break
            nxt = nodes.frontier(children, opts.topk)
            rows = [frontier.index(nodes.parents[c]) for c in nxt]  # each new row's parent row in this level
            frontier, tokens = nxt, [nodes.tokens[c] for c in nxt]
            seen = [seen[r] + [n + r] if level else [] for r in rows]
            hidden = out[:, rows]  # [1, m', H]: the parent's output is the child's hidden input
        return nodes.best(min(opts.total, request.budget)) if nodes.tokens else EMPTY

    def commit(self, tokens: list[int]) -> None:
        """Crop the draft layer's cache to the committed context (the pending token's row may stay: it is final)."""
        if self._kv is not None and self._kv.length > len(tokens) - 1:
            self._kv.crop(len(tokens) - 1)
