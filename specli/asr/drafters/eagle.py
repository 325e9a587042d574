"""The EAGLE-ASR drafter: drafts with a trained :class:`~specli.asr.drafters.eagle_head.SpeechDraftHead`.

:class:`EagleDrafter` runs a packed copy of the head (``packed_for_inference``: the target's oneDNN layout) in
the target's dtype, or in bfloat16 under a float32 target on a CPU with native bf16 (a step is the head's
matrices streamed from memory), cross-attention K/V once per window, the step's index tensors preallocated
(``benchmarks/profile_draft_step.py``). A chain drafter drafts for a batch through
:class:`~specli.asr.drafters.eagle_batched.BatchedEagleDrafter` (its ``batched`` hook).
"""

from __future__ import annotations

import torch

from specli.asr.drafters.eagle_batched import BatchedEagleDrafter
from specli.asr.drafters.eagle_head import SpeechDraftHead, packed_for_inference
from specli.core.device import cpu_native_bf16
from specli.core.drafters.base import EMPTY, Drafter, DraftProposal, DraftRequest, ModelDraftOptions, draft_chain
from specli.core.kv_cache import KVCache
from specli.core.logits import DraftVocab
from specli.models.whisper.target import DecoderState


class EagleDrafter(Drafter):
    """Drafts a chain with a :class:`SpeechDraftHead`; adaptive length and sparse tree as ModelDrafter.

    Runs a packed copy of the head in ``dtype``; None picks it from the target's dtype (read from the
    window's encoder output at :meth:`start`): the target's, except bfloat16 under a float32 target
    on a CPU with native bf16 (a step streams the head's matrices from memory: half the bytes; the
    drafter's precision never changes the lossless output). With ``int8`` (None: on the CPU) the
    head's matrices are int8 weight-only (``layers.Int8Linear``), activations still in that dtype.
    It filters inside the head's draft vocabulary (``self.vocab``; None when it is the whole
    vocabulary) and reuses preallocated index tensors, so a step costs the head's matrices and
    little else.
    """

    def __init__(self, head: SpeechDraftHead, options: ModelDraftOptions = ModelDraftOptions(),
                 dtype: torch.dtype | None = None, int8: bool | None = None) -> None:
        self._trained = head
        self._dtype = dtype  # the head's inference dtype; None: chosen from the target's (_head_dtype)
        # the head's matrices int8 weight-only; None: on the CPU (a draft step streams its matrices from memory)
        self._int8 = head.embed.device.type == "cpu" if int8 is None else int8
        self._packed: dict[torch.dtype, SpeechDraftHead] = {}
        self.options = options
        cfg = head.cfg
        self._device = head.embed.device  # the target's device: the head, its cache and its inputs live there
        self.vocab = None if head.vocab_ids.numel() == cfg.vocab else DraftVocab(head.vocab_ids, cfg.vocab)
        self._use(self._head_dtype(torch.float32))
        self._cross: tuple[torch.Tensor, torch.Tensor] | None = None
        self._tok = torch.zeros((1, 1), dtype=torch.long, device=self._device)  # [1, 1] the step's input token
        self._pos = torch.zeros((1, 1), dtype=torch.long, device=self._device)  # [1, 1] and its decoder position

    def batched(self, capacity: int) -> BatchedEagleDrafter | None:
        """A chain drafter drafts every row of a batch in one head forward (trees cannot batch yet: None)."""
        if self.options.tree_topk:
            return None
        return BatchedEagleDrafter(self._trained, capacity, self.options, self.head.ln_rec.weight.dtype, self._int8)

    @property
    def trained(self) -> SpeechDraftHead:
        """The head this drafter was built from (it drafts with packed copies of it, ``self.head``)."""
        return self._trained

    def _head_dtype(self, target_dtype: torch.dtype) -> torch.dtype:
        """The head's inference dtype under a target computing in ``target_dtype``."""
        if self._dtype is not None:
            return self._dtype
        if target_dtype == torch.float32 and self._device.type == "cpu" and cpu_native_bf16():
            return torch.bfloat16
        return target_dtype

    def _use(self, dtype: torch.dtype) -> None:
        """Run the head (and its self-attention cache) in ``dtype``; packed copies are kept per dtype."""
        if dtype not in self._packed:
            self._packed[dtype] = packed_for_inference(self._trained, dtype, self._int8)
        self.head = self._packed[dtype]
        cfg = self.head.cfg
        self._cache = KVCache(1, 1, cfg.heads, cfg.max_steps, cfg.d_model // cfg.heads, dtype, self._device)

    @torch.inference_mode()
    def start(self, state: DecoderState, prompt: list[int]) -> None:
        dtype = self._head_dtype(state.audio_features.dtype)
        if dtype != self.head.ln_rec.weight.dtype and dtype.is_floating_point:
            self._use(dtype)
        # once per window, in the head's dtype (the projection's own values; layers.cross_attention accumulates in
        # float32 over bf16); contiguous: SDPA over strided K/V views was ~2x slower for one query row
        self._cross = tuple(t.contiguous() for t in self.head.cross_kv(state.audio_features))

    def _step(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One head step for a single draft ``x [1, 1, d]``: (hidden [1, 1, d], draft-vocabulary logits [Vd])."""
        n = self._cache.length
        past = self._cache.view(0, n) if n else None
        out, k, v = self.head.block(x, past, self._cross)
        self._cache.write(0, n, k, v)
        self._cache.length = n + 1
        return out, self.head.logits(out)[0, -1]

    def _input(self, tok: int, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The preallocated ``[1, 1]`` token and position tensors, set to ``tok`` and ``pos``."""
        return self._tok.fill_(tok), self._pos.fill_(pos)

    @torch.inference_mode()
    def propose(self, request: DraftRequest) -> DraftProposal:
        if request.hidden is None or request.budget < 1 or self._cross is None:
            return EMPTY
        head = self.head
        pos = len(request.tokens) - 1  # decoder position of the pending token
        hid = request.hidden
        x = head.first_input(hid.low[:, -1:], hid.mid[:, -1:], hid.last[:, -1:], *self._input(request.tokens[-1], pos))
        self._cache.length = 0
        outs: list[torch.Tensor] = []  # the head's output of each step; the latest is the next step's input

        def step(x: torch.Tensor) -> torch.Tensor:
            out, logits = self._step(x)
            outs.append(out)
            return logits

        def advance(tok: int) -> torch.Tensor:  # the j-th draft token sits at pos + j, after j head steps
            return step(head.next_input(outs[-1], *self._input(tok, pos + self._cache.length)))

        def rewind(n: int) -> None:  # sparse tree, second pass: back to after the chain's first n tokens
            del outs[n + 1 :]
            self._cache.length = n + 1

        return draft_chain(request, min(request.budget, head.cfg.max_steps), step(x), advance, self.options,
                           rewind=rewind, vocab=self.vocab)

    def commit(self, tokens: list[int]) -> None:
        """Nothing to keep: every proposal starts from the target's latest hidden state."""
