"""A toy speech-token target for the sampler exactness tests, and drafters over it.

:class:`TableTarget` is a real decoder-only target of the ``Target`` protocol: the logits after a
token depend on that token and the one before it (a trigram table), looked up through a real
``KVCache`` (each slot stores its token id) and the tree mask, so ``crop`` / ``compact`` mistakes and
wrong tree masks change its output. Cheap enough for thousands of decodes per test.
"""

from __future__ import annotations

import torch

from specli.core.drafters.base import Drafter, DraftProposal, DraftRequest
from specli.core.kv_cache import KVCache
from specli.core.logits import sample_inverse_cdf
from specli.core.types import HiddenStates, ScoreOutput

V = 8  # toy vocabulary: 0..4 speech tokens, 5 "sos" (CV3-style masked id), 6 eos, 7 never emitted
SOS, EOS, NEVER = 5, 6, 7
BOS = V  # context id before the first position


class ToyState:
    """The target's per-sequence state: its cache (slot i holds the token at position i)."""

    def __init__(self, max_len: int) -> None:
        self.cache = KVCache(1, 1, 1, max_len, 1)
        self.audio_features = None  # what ModelDrafter(share_encoder=True) hands back to start()


class TableTarget:
    """Next-token logits ``table[token before, token]``; ``table [V + 1, V, V]`` (row ``BOS`` = no token)."""

    def __init__(self, table: torch.Tensor, max_len: int = 64) -> None:
        self.table = table
        self.max_len = max_len
        self.eye = torch.eye(V)
        self.device = torch.device("cpu")  # where its tensors live (drafters build inputs there)

    def start(self, audio=None) -> ToyState:
        return ToyState(self.max_len)

    def score(self, state: ToyState, tokens: torch.Tensor, positions: torch.Tensor | None = None,
              tree_mask: torch.Tensor | None = None, logit_rows: list[int] | None = None) -> ScoreOutput:
        cache, n = state.cache, tokens.shape[1]
        start = cache.length
        tok = tokens[0].tolist()
        pos = positions[0].tolist() if positions is not None else list(range(start, start + n))
        mask = tree_mask[0].tolist() if tree_mask is not None else [[j <= i for j in range(n)] for i in range(n)]
        stored = cache.values[0, 0, 0, :start, 0].tolist()  # tokens at positions [0, start)
        prev = []
        for i in range(n):
            want = pos[i] - 1
            seen = [j for j in range(n) if mask[i][j] and pos[j] == want]
            if seen:
                prev.append(tok[seen[0]])
            elif want < 0:
                prev.append(BOS)
            elif want < start:
                prev.append(int(stored[want]))
            else:
                raise AssertionError(f"row {i} at position {pos[i]} sees no token at {want}")
        ids = tokens.float().view(1, 1, n, 1)
        cache.write(0, start, ids, ids)
        cache.length = start + n
        logits = self.table[prev, tok][None]  # [1, n, V]
        if logit_rows is not None:
            logits = logits[:, logit_rows]  # [1, len(logit_rows), V]
        h = self.eye[tok][None]  # [1, n, V] one-hot states
        return ScoreOutput(logits, HiddenStates(h, h, h))

    def next_logits(self, context: list[int]) -> torch.Tensor:
        """Logits ``[V]`` after ``context`` (at least one token), straight from the table."""
        before = context[-2] if len(context) > 1 else BOS
        return self.table[before, context[-1]]


def random_table(seed: int, scale: float = 2.0, eos_bias: float = 0.0) -> torch.Tensor:
    """A random trigram table ``[V + 1, V, V]`` whose column ``NEVER`` is ``-inf``."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(V + 1, V, V, generator=g) * scale
    table[..., EOS] += eos_bias
    table[..., NEVER] = float("-inf")
    return table


def _draw(probs: torch.Tensor, request: DraftRequest) -> int:
    if request.greedy:
        return int(probs.argmax())
    u = torch.rand(1, generator=request.generator, dtype=torch.float64).float()
    return int(sample_inverse_cdf(probs[None], u)[0])


class IidTreeDrafter(Drafter):
    """Samples ``width`` i.i.d. children of the root from its own filtered table, each with one child."""

    def __init__(self, model: TableTarget, width: int = 2) -> None:
        self.model, self.width = model, width

    def start(self, state, prompt) -> None:
        pass

    def _probs(self, request: DraftRequest, path: list[int]) -> torch.Tensor:
        logits = self.model.next_logits(request.tokens + path)
        sampled = request.tokens[request.prompt_len:]
        return request.filter(logits[None], [sampled + path]).softmax(-1)[0]

    def propose(self, request: DraftRequest) -> DraftProposal:
        tokens, parents, q = [], [], []
        root = self._probs(request, [])
        for _ in range(self.width):
            if len(tokens) + 2 > request.budget:
                break
            first = _draw(root, request)
            child_q = self._probs(request, [first])
            tokens += [first, _draw(child_q, request)]
            parents += [-1, len(tokens) - 2]
            q += [root, child_q]
        if not tokens:
            return DraftProposal([], [])
        return DraftProposal(tokens, parents, [1.0] * len(tokens), None if request.greedy else torch.stack(q))

    def commit(self, tokens) -> None:
        pass


class WrongDrafter(Drafter):
    """Always wrong: proposes the never-emitted token everywhere (a chain)."""

    def start(self, state, prompt) -> None:
        pass

    def propose(self, request: DraftRequest) -> DraftProposal:
        n = request.budget
        return DraftProposal([NEVER] * n, list(range(-1, n - 1)), [1.0] * n)

    def commit(self, tokens) -> None:
        pass


class RandomTreeDrafter(Drafter):
    """Random point-mass trees over the whole vocabulary (seeded; independent of the decode's randomness)."""

    def __init__(self, seed: int) -> None:
        self.g = torch.Generator().manual_seed(seed)

    def start(self, state, prompt) -> None:
        pass

    def propose(self, request: DraftRequest) -> DraftProposal:
        n = int(torch.randint(0, request.budget + 1, (1,), generator=self.g))
        parents = [int(torch.randint(-1, i, (1,), generator=self.g)) if i else -1 for i in range(n)]
        tokens = torch.randint(0, V, (n,), generator=self.g).tolist()
        return DraftProposal(tokens, parents, [1.0] * n)

    def commit(self, tokens) -> None:
        pass


class ArgmaxChainDrafter(Drafter):
    """Proposes the chain of its model's most likely tokens (filtered) as point masses, also when sampling."""

    def __init__(self, model: TableTarget) -> None:
        self.model = model

    def start(self, state, prompt) -> None:
        pass

    def propose(self, request: DraftRequest) -> DraftProposal:
        sampled, path = request.tokens[request.prompt_len:], []
        for _ in range(request.budget):
            logits = self.model.next_logits(request.tokens + path)[None]
            path.append(int(request.filter(logits, [sampled + path])[0].argmax()))
        return DraftProposal(path, list(range(-1, len(path) - 1)), [1.0] * len(path))

    def commit(self, tokens) -> None:
        pass
