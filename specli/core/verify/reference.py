"""Pure-torch verification: the reference that the Triton kernels are tested against.

Greedy: accept draft tokens while each equals the target's argmax of the filtered logits, then take
the target's own token (recovered after a mismatch, bonus when every draft token was accepted).
Sampling: accept a draft token ``x`` drawn from ``q`` with probability ``min(1, p(x) / q(x))``; on
rejection sample from ``normalize(max(0, p - q))``; a bonus token comes from ``p``. Trees are
walked along the target's choice (greedy) or by sibling-wise rejection (sampling), which keeps the
target's distribution exactly. Random numbers are passed in so kernel and reference see the same.

``q`` of ``None`` means point-mass proposals (deterministic draft tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specli.core.logits import sample_inverse_cdf


def greedy_chain(
    logits: torch.Tensor,  # [B, k+1, vocab] filtered target logits; row j follows j accepted drafts
    draft: torch.Tensor,  # [B, k] draft tokens
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted length ``[B]`` and next token ``[B]`` (recovered or bonus)."""
    choice = logits.argmax(-1)  # [B, k+1]
    k = draft.shape[1]
    match = (choice[:, :k] == draft).long()
    accepted = match.cumprod(-1).sum(-1)
    return accepted, choice.gather(1, accepted[:, None]).squeeze(1)


def _residual(p: torch.Tensor, q_row: torch.Tensor | None, token: int) -> torch.Tensor:
    """``normalize(max(0, p - q))`` for one row (``q`` None: a point mass on ``token``)."""
    if q_row is None:
        res = p.clone()
        res[token] = 0.0
    else:
        res = (p - q_row).clamp(min=0.0)
    total = res.sum()
    return res / total if total > 0 else p


def _accepts(p: torch.Tensor, q_row: torch.Tensor | None, token: int, u: float) -> bool:
    q_x = 1.0 if q_row is None else float(q_row[token])
    return u * q_x < float(p[token])


def sample_chain(
    probs: torch.Tensor,  # [B, k+1, vocab] target distributions
    q: torch.Tensor | None,  # [B, k, vocab] draft distributions, or None for point masses
    draft: torch.Tensor,  # [B, k] draft tokens
    u_accept: torch.Tensor,  # [B, k] uniforms for the acceptance tests
    u_sample: torch.Tensor,  # [B, k+1] uniforms for the recovered / bonus token at each row
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling of a chain: accepted length ``[B]`` and next token ``[B]``."""
    parents = list(range(-1, draft.shape[1] - 1))
    accepted, _paths, nxt = sample_tree(probs, q, draft, parents, u_accept, u_sample)
    return accepted, nxt


def greedy_tree(
    logits: torch.Tensor,  # [B, n+1, vocab] filtered logits; row 0 is the root, row i+1 node i
    tokens: torch.Tensor,  # [B, n] node tokens
    parents: Sequence[int],  # parent of each node, -1 for the root
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk along the target's argmax: path length ``[B]``, path nodes ``[B, n]`` (-1 padded), next ``[B]``."""
    choice = logits.argmax(-1).tolist()  # [B][n+1]: one readback, then the walk on the host
    node_tokens = tokens.tolist()  # [B][n]
    b, n = tokens.shape
    lengths, paths, nxt = [0] * b, [[-1] * n for _ in range(b)], [0] * b
    for r in range(b):
        cur, depth = -1, 0
        while True:
            want = choice[r][cur + 1]
            child = next((i for i in range(n) if parents[i] == cur and node_tokens[r][i] == want), None)
            if child is None:
                nxt[r] = want
                break
            paths[r][depth], depth, cur = child, depth + 1, child
        lengths[r] = depth
    dev = tokens.device
    as_tensor = lambda rows: torch.tensor(rows, dtype=torch.long, device=dev)  # noqa: E731
    return as_tensor(lengths), as_tensor(paths).reshape(b, n), as_tensor(nxt)


def sample_tree(
    probs: torch.Tensor,  # [B, n+1, vocab] target distributions; row 0 is the root
    q: torch.Tensor | None,  # [B, n, vocab] distribution each node was drawn from, or None
    tokens: torch.Tensor,  # [B, n]
    parents: Sequence[int],
    u_accept: torch.Tensor,  # [B, n] one uniform per node's acceptance test
    u_sample: torch.Tensor,  # [B, n+1] one uniform per row for the token sampled there
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sibling-wise rejection sampling down the tree (SpecInfer-style); returns like :func:`greedy_tree`."""
    b, n = tokens.shape
    lengths = torch.zeros(b, dtype=torch.long, device=tokens.device)
    paths = torch.full((b, n), -1, dtype=torch.long, device=tokens.device)
    nxt = torch.zeros(b, dtype=torch.long, device=tokens.device)
    for r in range(b):
        cur, depth = -1, 0
        while True:
            residual = probs[r, cur + 1].double()
            chosen = None
            for c in (i for i in range(n) if parents[i] == cur):
                q_row = None if q is None else q[r, c].double()
                tok = int(tokens[r, c])
                if _accepts(residual, q_row, tok, float(u_accept[r, c])):
                    chosen = c
                    break
                residual = _residual(residual, q_row, tok)
            if chosen is None:
                nxt[r] = sample_inverse_cdf(residual[None], u_sample[r, cur + 1 : cur + 2])[0]
                break
            paths[r, depth], depth, cur = chosen, depth + 1, chosen
        lengths[r] = depth
    return lengths, paths, nxt
