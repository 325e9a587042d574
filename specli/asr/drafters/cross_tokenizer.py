"""Training-free drafter across tokenizers: a Whisper model with another vocabulary drafts text.

The drafter (e.g. English-only ``whisper-tiny.en`` for multilingual ``whisper-base`` on English
audio) decodes greedily in its own vocabulary from its own encoder pass over the same features.
Its text is re-encoded into the target's tokenizer and proposed as a point-mass chain, so the
target's verification keeps the output exact whatever the drafter gets wrong.
"""

from __future__ import annotations

import torch

from specli.core.drafters.base import Drafter, DraftProposal, DraftRequest, continue_branch
from specli.asr.drafters.model import ModelDraftOptions, rescore
from specli.core.drafters.recycling import merge_chains
from specli.models.whisper.loader import WhisperModel
from specli.models.whisper.target import DecoderState
from specli.models.whisper.rules import WhisperLogitRules


class CrossTokenizerDrafter(Drafter):
    """Drafts with ``drafter`` (its own tokenizer) for a target with ``target_tokenizer``."""

    def __init__(self, drafter: WhisperModel, target: WhisperModel, language: str = "en",
                 options: ModelDraftOptions = ModelDraftOptions()) -> None:
        self.drafter = drafter
        self.target_tok = target.tokenizer
        self.target_eot = target.special.eot
        self.options = options  # adaptive length and sparse tree, judged in the drafter's vocabulary
        sp = drafter.special
        self._prompt = sp.prompt(language if sp.multilingual else None, "transcribe", timestamps=False)
        self._rules = WhisperLogitRules.for_model(sp)
        self._state: DecoderState | None = None
        self._cached: list[int] = []

    def start(self, state: DecoderState, prompt: list[int]) -> None:
        if state.features is None:
            raise ValueError("the cross-tokenizer drafter needs the window's features")
        model = self.drafter.target
        self._state = model.start(model.encode(state.features))
        self._cached = []

    def _context(self, request: DraftRequest) -> tuple[list[int], int]:
        """The drafter's token sequence for the committed text, and its prompt length."""
        text = self.target_tok.decode(request.tokens[request.prompt_len :])
        return self._prompt + self.drafter.tokenizer.encode(text), len(self._prompt)

    def _sync(self, tokens: list[int]) -> torch.Tensor:
        logits = rescore(self.drafter.target, self._state, self._cached, tokens)
        self._cached = list(tokens)
        return logits

    def propose(self, request: DraftRequest) -> DraftProposal:
        ctx, plen = self._context(request)
        logits = self._sync(ctx)
        eot, opts = self.drafter.special.eot, self.options
        new: list[int] = []
        branches: list[list[int]] = []  # drafter-token prefixes ending in an alternative
        ended = False
        while len(new) < request.budget:
            probs = self._rules(logits[None], [ctx[plen:] + new]).softmax(-1)[0]
            top = probs.topk(opts.tree_topk + 1)
            tok, p = int(top.indices[0]), float(top.values[0])
            if new and p < opts.confidence_threshold:
                break
            if opts.tree_topk and p < opts.tree_threshold:
                branches += [new + [int(a)] for a in top.indices[1:] if int(a) != eot]
            if tok == eot:
                ended = True
                break
            new.append(tok)
            logits = self._advance(tok)
        main = self._to_target(new) + ([self.target_eot] if ended else [])
        room = request.budget - len(new)
        grown = []
        for b in branches:  # SpecASR's second pass, while the tree has room
            grown.append(self._grow(ctx, plen, b) if room > 0 else b)
            room -= len(grown[-1]) - len(b) + 1
        chains = [main] + [self._to_target(b) for b in grown]
        tokens, parents = merge_chains(chains, request.budget)
        return DraftProposal(tokens, parents, [1.0] * len(tokens))

    def _advance(self, tok: int) -> torch.Tensor:
        """Score one more drafter token: the drafter's logits ``[vocab]`` after it."""
        self._cached.append(tok)
        dev = self.drafter.target.device
        return self.drafter.target.score(self._state, torch.tensor([[tok]], device=dev)).logits[0, -1]

    def _grow(self, ctx: list[int], plen: int, branch: list[int]) -> list[int]:
        """A branch (drafter tokens ending in an alternative) and up to ``branch_steps`` drafter
        tokens drafted on from it (SpecASR's second pass; stops at eot or below the confidence threshold)."""
        opts = self.options
        if not opts.branch_steps:
            return branch
        cont = continue_branch(self._rules, ctx[plen:] + branch, self._sync(ctx + branch), self._advance,
                               opts.branch_steps, opts.confidence_threshold, stop=self.drafter.special.eot)
        return branch + [t for t, _ in cont]

    def _to_target(self, drafter_tokens: list[int]) -> list[int]:
        """Drafter tokens -> text -> target tokens."""
        return self.target_tok.encode(self.drafter.tokenizer.decode(drafter_tokens)) if drafter_tokens else []

    def commit(self, tokens: list[int]) -> None:
        """Nothing to do: the next proposal re-derives the drafter's context from the text."""
