"""Whisper's logit rules as one pure function.

The same function runs wherever logits are turned into tokens: plain decoding, the verifier at
every position of a scored chain or tree, and drafters. Each scored row carries its own
*sampled prefix* (the tokens decoded after the prompt on that row's root-to-node path), so a rule
that depends on history (suppress-at-begin, timestamp pairing) sees exactly what plain decoding
would have seen at that point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specli.core.device import host_to_device
from specli.core.logits import DraftVocab, vocab_columns, vocab_span
from specli.models.whisper.tokenizer import WhisperSpecialTokens

NEG_INF = float("-inf")


@dataclass(frozen=True)
class WhisperLogitRules:
    """Suppress tokens, suppress-at-begin and (with ``timestamps``) the timestamp rules."""

    eot: int  # end of transcript
    no_timestamps: int  # <|notimestamps|>
    timestamp_begin: int  # first timestamp token id
    suppress_tokens: tuple[int, ...]  # always masked
    begin_suppress_tokens: tuple[int, ...]  # masked at the first sampled position
    timestamps: bool = False  # apply the timestamp rules (segment-level timestamps)
    max_initial_timestamp_index: int | None = 50  # cap on the first timestamp, None for no cap
    # column-index tensors of the id lists above by (ids, device), built on first use (not a rule parameter)
    _index: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    @classmethod
    def for_model(cls, special: WhisperSpecialTokens, timestamps: bool = False) -> WhisperLogitRules:
        return cls(
            eot=special.eot,
            no_timestamps=special.no_timestamps,
            timestamp_begin=special.timestamp_begin,
            suppress_tokens=special.suppress_tokens,
            begin_suppress_tokens=special.begin_suppress_tokens,
            timestamps=timestamps,
            max_initial_timestamp_index=special.max_initial_timestamp_index,
        )

    def __call__(self, logits: torch.Tensor, prefixes: Sequence[Sequence[int]],
                 vocab: DraftVocab | None = None) -> torch.Tensor:
        """Return masked logits ``[n, vocab]``; row ``i`` was scored after sampled ``prefixes[i]``.

        With ``vocab`` (a draft vocabulary) the columns are those token ids only; every id range and
        id list maps to its columns, so the result is the full rule restricted to them.
        """
        return self._apply(logits, prefixes, vocab)[0]

    def with_logprobs(self, logits: torch.Tensor, prefixes: Sequence[Sequence[int]]
                      ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The masked logits ``[n, vocab]`` (as a call returns them) and, with ``timestamps``, the log_softmax the
        timestamp rule took to decide its forcing ``[n, vocab]``: that of the masked rows, except on the rows the
        forcing changed afterwards (``stale [n]`` bool), whose log-probabilities a caller must compute again
        (``core.logits.filter_with_logprobs``). Without ``timestamps``: ``(masked, None, None)``."""
        return self._apply(logits, prefixes, None)

    def _apply(self, logits: torch.Tensor, prefixes: Sequence[Sequence[int]], vocab: DraftVocab | None
               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        if logits.shape[0] != len(prefixes):
            raise ValueError(f"{logits.shape[0]} logit rows but {len(prefixes)} prefixes")
        out = logits.clone()
        if self.suppress_tokens:
            out[:, self._columns(vocab, self.suppress_tokens, out.device)] = NEG_INF
        begin_rows = [i for i, p in enumerate(prefixes) if len(p) == 0]
        if begin_rows and self.begin_suppress_tokens:
            rows = host_to_device(begin_rows, torch.long, out.device)[:, None]
            out[rows, self._columns(vocab, self.begin_suppress_tokens, out.device)[None, :]] = NEG_INF
        if not self.timestamps:
            return out, None, None
        for i, prefix in enumerate(prefixes):
            self._timestamp_masks(out[i], prefix, vocab)
        return (out, *self._force_timestamps(out, vocab))

    def _columns(self, vocab: DraftVocab | None, tokens: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """``vocab_columns`` of ``tokens``, built once per device (a draft vocabulary caches its own)."""
        if vocab is not None:
            return vocab_columns(vocab, tokens, device)
        idx = self._index.get((tokens, device))
        if idx is None:
            idx = self._index[(tokens, device)] = vocab_columns(None, tokens, device)
        return idx

    def _timestamp_masks(self, row: torch.Tensor, seq: Sequence[int], vocab: DraftVocab | None) -> None:
        """openai/whisper's ``ApplyTimestampRules`` masks on one row, in place."""
        tb = self.timestamp_begin
        no_ts = self.no_timestamps if vocab is None else vocab.column(self.no_timestamps)
        if no_ts is not None:
            row[no_ts] = NEG_INF
        last_ts = len(seq) >= 1 and seq[-1] >= tb
        penultimate_ts = len(seq) < 2 or seq[-2] >= tb
        if last_ts:
            if penultimate_ts:
                row[vocab_span(vocab, tb)] = NEG_INF  # a timestamp pair is complete: text must follow
            else:
                row[vocab_span(vocab, 0, self.eot)] = NEG_INF  # a lone timestamp: close the pair (or end)
        stamps = [t for t in seq if t >= tb]
        if stamps:
            floor = stamps[-1] if (last_ts and not penultimate_ts) else stamps[-1] + 1
            row[vocab_span(vocab, tb, floor)] = NEG_INF  # timestamps never decrease
        if len(seq) == 0:
            row[vocab_span(vocab, 0, tb)] = NEG_INF  # the first sampled token is a timestamp
            if self.max_initial_timestamp_index is not None:
                row[vocab_span(vocab, tb + self.max_initial_timestamp_index + 1)] = NEG_INF

    def _force_timestamps(self, out: torch.Tensor, vocab: DraftVocab | None
                          ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Rows whose timestamp tokens together outweigh every text token must emit a timestamp (in place). Returns
        the log_softmax ``[n, vocab]`` of ``out`` before the forcing, and the rows ``[n]`` the forcing changed (a
        text column was finite), or ``(None, None)`` where nothing was computed."""
        text, stamps = vocab_span(vocab, 0, self.timestamp_begin), vocab_span(vocab, self.timestamp_begin)
        if vocab is not None and (text.start == text.stop or stamps.start == stamps.stop):
            return None, None  # no text (or no timestamp) column: nothing the full rule would change here
        logprobs = torch.log_softmax(out.float(), dim=-1)
        text_max = logprobs[:, text].max(dim=-1).values  # [n]
        force = torch.logsumexp(logprobs[:, stamps], dim=-1) > text_max
        out[:, text].masked_fill_(force[:, None], NEG_INF)  # no boolean indexing: no host sync on CUDA
        return logprobs, force & (text_max > NEG_INF)
