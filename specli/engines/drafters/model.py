"""Training-free drafter: an independent (smaller) Whisper model with the target's tokenizer.

The drafter keeps its own KV cache in step with the committed tokens (rolling back with ``crop``
after a rejection) and drafts with the same logit filter as the target. Two SpecASR options:

* adaptive length: stop drafting when the drafter's probability of its token falls below
  ``confidence_threshold`` (the first token is always drafted), capped by the request's budget;
* two-pass sparse tree: after drafting the chain, add the drafter's next-best tokens as sibling
  leaves at the low-confidence positions only (``tree_topk`` alternatives each).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specli.engines.drafters.base import DraftProposal, DraftRequest
from specli.engines.logits import sample_inverse_cdf
from specli.engines.targets.whisper import DecoderState, WhisperTarget


@dataclass(frozen=True)
class ModelDraftOptions:
    """How a model drafter drafts."""

    confidence_threshold: float = 0.0  # adaptive: stop below this drafter probability (0 = never)
    tree_topk: int = 0  # sparse tree: alternatives added at each low-confidence position (0 = chain)
    tree_threshold: float = 0.6  # sparse tree: positions below this confidence get alternatives

    def __post_init__(self) -> None:
        if not 0.0 <= self.confidence_threshold < 1.0 or not 0.0 <= self.tree_threshold <= 1.0:
            raise ValueError("thresholds must be within [0, 1)")
        if self.tree_topk < 0:
            raise ValueError("tree_topk must be >= 0")


class ModelDrafter:
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
        opts = self.options
        logits = self._sync(request.tokens)
        sampled = request.tokens[request.prompt_len :]
        draft: list[int] = []
        conf: list[float] = []
        q_rows, alts = [], []
        while len(draft) < request.budget:
            probs = request.filter(logits[None], [sampled + draft]).softmax(-1)[0]
            tok = draft_token(probs, request)
            p = float(probs[tok])
            if draft and p < opts.confidence_threshold:
                break
            draft.append(tok)
            conf.append(p)
            q_rows.append(None if request.greedy else probs)
            alts.append(probs.topk(opts.tree_topk + 1).indices.tolist() if opts.tree_topk else [])
            if len(draft) < request.budget:
                logits = self.model.score(self._state, torch.tensor([[tok]])).logits[0, -1]
                self._cached.append(tok)
        return sparse_tree(draft, conf, q_rows, alts, request.budget, opts)

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
    return model.score(state, torch.tensor([tokens[keep:]])).logits[0, -1]


def draft_token(probs: torch.Tensor, request: DraftRequest) -> int:
    """The drafter's token from its filtered distribution ``probs [vocab]``: argmax, or a sample."""
    if request.greedy:
        return int(probs.argmax())
    u = torch.rand(1, generator=request.generator, dtype=torch.float64).float()
    return int(sample_inverse_cdf(probs[None], u)[0])


def sparse_tree(draft, conf, q_rows, alts, budget: int, options: ModelDraftOptions) -> DraftProposal:
    """The drafted chain plus (two-pass sparse tree) alternative leaves at low-confidence positions.

    Alternatives come after every chain node, so parents still precede their children. In sampling
    mode chain nodes keep their drafter distribution ``q`` and alternatives are point masses.
    """
    tokens, parents, confs, q = list(draft), list(range(-1, len(draft) - 1)), list(conf), list(q_rows)
    for pos, c in enumerate(conf):
        if not options.tree_topk or c >= options.tree_threshold:
            continue
        for alt in alts[pos]:
            if alt != draft[pos] and len(tokens) < budget:
                tokens.append(alt)
                parents.append(pos - 1)
                confs.append(0.0)
                q.append(None)
    q_t = None
    if q and q[0] is not None:
        vocab = q[0].shape[0]
        q_t = torch.stack([r if r is not None else _one_hot(t, vocab) for r, t in zip(q, tokens)])
    return DraftProposal(tokens, parents, confs, q_t)


def _one_hot(token: int, vocab: int) -> torch.Tensor:
    row = torch.zeros(vocab)
    row[token] = 1.0
    return row
