"""Tiny random Whisper targets and test drafters for the property tests of the decoding math."""

from __future__ import annotations

import weakref

import torch
import transformers

from specli.core.drafters.base import Drafter, DraftProposal, DraftRequest
from specli.models.whisper.target import DecoderState, WhisperDims, WhisperTarget
from specli.models.whisper.rules import WhisperLogitRules
from specli.core.tree import chain_parents

VOCAB = 48
EOT, SOT, NO_TS, TB = 2, 3, 4, 36  # ids of the control tokens; 36.. are timestamps
SUPPRESSED = 5


def tiny_weights(seed: int, layers: int = 2, init_std: float = 0.3, d_model: int = 32, heads: int = 2,
                 encoder_layers: int = 1) -> tuple[dict[str, torch.Tensor], WhisperDims]:
    """A random Whisper's Hugging Face state dict and dims (``d_model``-wide, FFN 2x, ``heads`` heads)."""
    torch.manual_seed(seed)
    cfg = transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=80, d_model=d_model, encoder_layers=encoder_layers,
        encoder_attention_heads=heads, decoder_layers=layers, decoder_attention_heads=heads,
        encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model, max_source_positions=1500,
        max_target_positions=96, pad_token_id=0, bos_token_id=1, eos_token_id=EOT, decoder_start_token_id=SOT,
        init_std=init_std,
    )
    hf = transformers.WhisperForConditionalGeneration(cfg).eval()
    return hf.state_dict(), WhisperDims.from_hf_config(cfg.to_dict())


def tiny_target(seed: int, layers: int = 2, init_std: float = 0.3, dtype: torch.dtype = torch.float32,
                device: str = "cpu") -> WhisperTarget:
    weights, dims = tiny_weights(seed, layers, init_std)
    return WhisperTarget(dims, weights, dtype, device)


def tiny_rules(timestamps: bool = False) -> WhisperLogitRules:
    return WhisperLogitRules(EOT, NO_TS, TB, suppress_tokens=(SUPPRESSED,), begin_suppress_tokens=(EOT,),
                             timestamps=timestamps, max_initial_timestamp_index=4)


# Encoder outputs per live target and seed. Keyed by the target object, not id(target): a collected target's id is
# reused by the next one, which then got the dead target's encoding (test_beam compared greedy and beam search on
# features that depended on which tests ran before it).
_ENCODED: weakref.WeakKeyDictionary[WhisperTarget, dict[int, tuple[torch.Tensor, torch.Tensor]]] = (
    weakref.WeakKeyDictionary())


def window(target: WhisperTarget, seed: int) -> DecoderState:
    """A fresh decoder state over random features (encoder output cached per target and seed)."""
    cache = _ENCODED.setdefault(target, {})
    if seed not in cache:
        g = torch.Generator().manual_seed(seed)
        mel = torch.randn(1, 80, 3000, generator=g)
        cache[seed] = (mel, target.encode(mel))
    mel, enc = cache[seed]
    return target.start(enc, features=mel)


class AlwaysWrongDrafter(Drafter):
    """Proposes a suppressed token at every position: the target never accepts it."""

    def start(self, state: DecoderState, prompt: list[int]) -> None:
        pass

    def propose(self, request: DraftRequest) -> DraftProposal:
        n = request.budget
        return DraftProposal([SUPPRESSED] * n, chain_parents(n), [1.0] * n)

    def commit(self, tokens: list[int]) -> None:
        pass


class RandomTreeDrafter(Drafter):
    """Proposes random trees (for tree verification); deterministic given its seed."""

    def __init__(self, seed: int) -> None:
        self.g = torch.Generator().manual_seed(seed)

    def start(self, state: DecoderState, prompt: list[int]) -> None:
        pass

    def propose(self, request: DraftRequest) -> DraftProposal:
        n = int(torch.randint(0, request.budget + 1, (1,), generator=self.g))
        parents = [int(torch.randint(-1, i, (1,), generator=self.g)) if i else -1 for i in range(n)]
        tokens = torch.randint(6, VOCAB, (n,), generator=self.g).tolist()
        return DraftProposal(tokens, parents, [1.0] * n)

    def commit(self, tokens: list[int]) -> None:
        pass


class NoisyTreeDrafter(Drafter):
    """Wraps a drafter: corrupts some of its tokens and adds random sibling branches (seeded)."""

    def __init__(self, inner, seed: int, corrupt: float = 0.3) -> None:
        self.inner, self.corrupt = inner, corrupt
        self.g = torch.Generator().manual_seed(seed)

    def start(self, state: DecoderState, prompt: list[int]) -> None:
        self.inner.start(state, prompt)

    def _rand(self, hi: int, lo: int = 0) -> int:
        return int(torch.randint(lo, hi, (1,), generator=self.g))

    def propose(self, request: DraftRequest) -> DraftProposal:
        base = self.inner.propose(request)
        tokens, parents = list(base.tokens), list(base.parents)
        for i in range(len(tokens)):
            if torch.rand(1, generator=self.g).item() < self.corrupt:
                tokens[i] = self._rand(VOCAB, 6)
        while len(tokens) < request.budget and self._rand(3):
            parents.append(self._rand(len(tokens), -1) if tokens else -1)
            tokens.append(self._rand(VOCAB, 6))
        return DraftProposal(tokens, parents, [1.0] * len(tokens))

    def commit(self, tokens: list[int]) -> None:
        self.inner.commit(tokens)


def random_verify_case(g: torch.Generator, chain: bool, with_q: bool, b: int, n: int, v: int
                       ) -> tuple[torch.Tensor, DraftProposal]:
    """Random target logits ``[b, n + 1, v]`` and an ``n``-node chain or tree proposal for ``verify()``:
    drawn from random ``q`` rows (``with_q``), else point masses that are about 60 % the target's argmax
    at their parent (long accepted paths)."""
    parents = list(range(-1, n - 1)) if chain else [-1] + [int(torch.randint(-1, i, (1,), generator=g))
                                                           for i in range(1, n)]
    logits = torch.randn(b, n + 1, v, generator=g) * 3
    q = (torch.randn(n, v, generator=g) * 3).softmax(-1) if with_q else None
    if with_q:
        tokens = torch.multinomial(q, 1, generator=g)[:, 0].tolist()
    else:
        tokens = [int(logits[0, p + 1].argmax()) if torch.rand(1, generator=g) < 0.6
                  else int(torch.randint(0, v, (1,), generator=g)) for p in parents]
    return logits, DraftProposal(tokens, parents, [1.0] * n, q)


def count_kernel_calls(monkeypatch, kernels) -> dict[str, int]:
    """Wraps each verify kernel of the ``kernels`` module so its calls are counted (the real kernels
    still run); returns the live ``{kernel name: calls}`` dict."""
    calls: dict[str, int] = {}
    for name in ("greedy_chain", "greedy_tree", "sample_chain", "sample_tree"):
        real = getattr(kernels, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(kernels, name, spy)
    return calls
