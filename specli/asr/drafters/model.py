"""Training-free drafter: an independent (smaller) Whisper model with the target's tokenizer.

The drafter keeps its own KV cache in step with the committed tokens (rolling back with ``crop``
after a rejection) and drafts with the same logit filter as the target. Two SpecASR options:

* adaptive length: stop drafting when the drafter's probability of its token falls below
  ``confidence_threshold`` (the first token is always drafted), capped by the request's budget;
* two-pass sparse tree: after drafting the chain, the drafter's next-best tokens at the
  low-confidence positions only (``tree_topk`` alternatives each) become branches, and the drafter
  drafts ``branch_steps`` tokens on from each (rolling its cache back to the branch point).
"""

from __future__ import annotations

import torch

from specli.core.drafters.base import Drafter, DraftProposal, DraftRequest, ModelDraftOptions, draft_chain
from specli.models.whisper.target import DecoderState, WhisperTarget


class ModelDrafter(Drafter):
    """Drafts with ``model``; shares the target's encoder output when ``model`` is the target."""

    def __init__(
        self, model: WhisperTarget, options: ModelDraftOptions = ModelDraftOptions(), share_encoder: bool = False
    ) -> None:
        self.model = model
        self.options = options
        self.share_encoder = share_encoder  # read the target's encoder output instead of encoding
        self._state: DecoderState | None = None
        self._cached: list[int] = []  # tokens whose K/V are in the drafter's cache

    def start(self, state: DecoderState, prompt: list[int]) -> None:
        if self.share_encoder:
            audio = state.audio_features
        elif state.features is None:
            raise ValueError("an independent drafter model needs the window's features")
        else:
            audio = self.model.encode(state.features)
        self._state = self.model.start(audio)
        self._cached = []

    def _sync(self, tokens: list[int]) -> torch.Tensor:
        """Bring the cache to ``tokens``; return the logits ``[vocab]`` after the last token."""
        logits = rescore(self.model, self._state, self._cached, tokens)
        self._cached = list(tokens)
        return logits

    def propose(self, request: DraftRequest) -> DraftProposal:
        def advance(tok: int) -> torch.Tensor:
            self._cached.append(tok)
            return self.model.score(self._state, torch.tensor([[tok]], device=self.model.device)).logits[0, -1]

        def rewind(n: int) -> None:  # back to the committed tokens + the chain's first n draft tokens
            self._state.cache.crop(len(request.tokens) + n)
            self._cached = self._cached[: len(request.tokens) + n]

        return draft_chain(request, request.budget, self._sync(request.tokens), advance, self.options,
                           rewind=rewind)

    def commit(self, tokens: list[int]) -> None:
        keep = shared_prefix(self._cached, tokens)
        self._state.cache.crop(keep)
        self._cached = self._cached[:keep]


def shared_prefix(cached: list[int], tokens: list[int]) -> int:
    """Leading tokens the drafter's cache can keep: the common prefix, the last token excluded."""
    keep, limit = 0, min(len(cached), len(tokens) - 1)
    while keep < limit and cached[keep] == tokens[keep]:
        keep += 1
    return keep


def rescore(model: WhisperTarget, state: DecoderState, cached: list[int], tokens: list[int]) -> torch.Tensor:
    """Crop ``state``'s cache (holding ``cached``) to the shared prefix, score the rest of ``tokens``,
    and return the logits ``[vocab]`` after the last token."""
    keep = shared_prefix(cached, tokens)
    state.cache.crop(keep)
    return model.score(state, torch.tensor([tokens[keep:]], device=model.device)).logits[0, -1]
