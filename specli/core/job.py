"""One decode job: what every decoding loop takes (greedy, speculative, beam search, batched rows).

A :class:`DecodeJob` is one sequence to decode: its prompt, its logit rules, where it stops, how its
tokens are chosen and from which random source. Every loop starts the same way, with :func:`prefill`
(one target forward over the prompt, or all of it but the pending last token) and, where a pipeline asks
for one, a :class:`Probe`: the probability of one token at one prompt position, read from the target's
distribution without changing decoding (Whisper reads ``<|nospeech|>`` at ``<|startoftranscript|>``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specli.core.device import host_to_device
from specli.core.logits import GREEDY, SamplingParams
from specli.core.types import LogitRules, ScoreOutput, Target, TargetState


@dataclass(frozen=True)
class Probe:
    """Report the probability of ``token`` at prompt position ``index`` (the target's next-token
    distribution there, raw logits, before any rule)."""

    index: int  # position in the prompt whose next-token distribution is read
    token: int  # the token whose probability is reported

    def read(self, logits: torch.Tensor) -> float:
        """``logits [vocab]`` of the probed position -> the probability of ``token``."""
        return float(self.value(logits))

    def value(self, logits: torch.Tensor) -> torch.Tensor:
        """:meth:`read` left on the device (0-d), for a caller that packs it into its own readback."""
        return logits.softmax(-1)[self.token]


@dataclass(frozen=True)
class DecodeJob:
    """One sequence to decode: the same fields for every loop and every target."""

    prompt: tuple[int, ...]  # prompt tokens; the last one is the first pending token
    rules: LogitRules | None  # this sequence's logit rules (timestamp rules, min-length masks, RAS ...)
    eot: int  # the token that ends the sequence
    max_new_tokens: int  # most tokens sampled after the prompt (eot included)
    sampling: SamplingParams = GREEDY  # greedy, or sampling with temperature / top-k / top-p / penalty
    generator: torch.Generator | None = None  # this sequence's random source (sampling drafters and verify)
    probe: Probe | None = None  # a probability to report from the prompt (Whisper: no-speech), or None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", tuple(int(t) for t in self.prompt))
        if not self.prompt:
            raise ValueError("a decode job needs at least one prompt token")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.probe is not None and not 0 <= self.probe.index < len(self.prompt):
            raise ValueError("the probe must read a prompt position")


@dataclass(frozen=True)
class Prefill:
    """What :func:`prefill` returns."""

    out: ScoreOutput | None  # the forward over the prefilled prompt tokens (None: nothing to prefill); its logits
    # are only those of the rows read: [1, k, vocab], the probed row and (``last``) the last one, in prompt order
    probed: float | None  # the probe's value when its position was prefilled, else None (read it later)


def prefill(target: Target, state: TargetState, job: DecodeJob, upto: int, last: bool = False) -> Prefill:
    """Score ``job.prompt[:upto]`` into ``state``'s cache in one target forward (none when ``upto`` is 0);
    the job's probe is read when its position is among them. Logits come back for the probed row and, with
    ``last``, the last row only (``score``'s ``logit_rows``)."""
    if upto <= 0:
        return Prefill(None, None)
    probe = job.probe
    probed_row = probe is not None and probe.index < upto
    rows = sorted(({probe.index} if probed_row else set()) | ({upto - 1} if last else set()))
    tokens = host_to_device([list(job.prompt[:upto])], torch.long, state.cache.device)
    out = target.score(state, tokens, logit_rows=rows)
    probed = probe.read(out.logits[0, rows.index(probe.index)]) if probed_row else None
    return Prefill(out, probed)


def probe_at(job: DecodeJob, position: int, logits: torch.Tensor) -> float | None:
    """The probe's value if ``position`` (a prompt position scored by a later forward) is the probed one."""
    probe = job.probe
    return probe.read(logits) if probe is not None and probe.index == position else None
