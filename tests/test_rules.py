"""Whisper's logit rules: one pure function, row by row, against a direct reading of openai/whisper's rules."""

from __future__ import annotations

import torch

from specli.models.whisper.rules import WhisperLogitRules

EOT, NO_TS, TB, V = 10, 11, 12, 40


def rules(timestamps=True, max_initial=3):
    return WhisperLogitRules(EOT, NO_TS, TB, suppress_tokens=(1, 2), begin_suppress_tokens=(0, EOT),
                             timestamps=timestamps, max_initial_timestamp_index=max_initial)


def test_suppress_and_begin_suppress_without_timestamps():
    r = rules(timestamps=False)
    logits = torch.zeros(3, V)
    out = r(logits, [[], [5], [5, 6]])
    assert torch.isinf(out[:, [1, 2]]).all()
    assert torch.isinf(out[0, [0, EOT]]).all()
    assert not torch.isinf(out[1:, [0, EOT]]).any()
    assert not torch.isinf(out[:, 3:10]).any()
    assert torch.equal(logits, torch.zeros(3, V)), "the input is not modified"


def test_first_token_is_a_timestamp_within_the_initial_cap():
    out = rules()(torch.zeros(1, V), [[]])
    allowed = (~torch.isinf(out[0])).nonzero().flatten().tolist()
    assert allowed == [TB, TB + 1, TB + 2, TB + 3]


def test_timestamp_pairing_and_monotonic():
    r = rules(max_initial=None)
    out = r(torch.zeros(3, V), [[TB + 2], [TB + 2, 5], [TB + 2, 5, TB + 4]])
    # after a lone opening timestamp (penultimate empty counts as timestamp): text must follow
    assert torch.isinf(out[0, TB:]).all() and not torch.isinf(out[0, 3:EOT]).any()
    # after text: timestamps allowed only from the last one + 1 on
    assert torch.isinf(out[1, TB : TB + 3]).all() and not torch.isinf(out[1, TB + 3 :]).any()
    # after text + timestamp: close the pair (timestamp >= last, or eot), no text
    assert torch.isinf(out[2, :EOT]).all()
    assert torch.isinf(out[2, TB : TB + 4]).all() and not torch.isinf(out[2, TB + 4 :]).any()
    assert torch.isinf(out[:, NO_TS]).all()


def test_timestamp_mass_forces_a_timestamp():
    logits = torch.zeros(1, V)
    logits[0, 5] = 2.0  # best single text token ...
    logits[0, TB:] = 1.0  # ... but timestamps together weigh more
    out = rules(max_initial=None)(logits, [[TB, 5]])
    assert torch.isinf(out[0, :TB]).all()
    logits[0, 5] = 20.0
    out = rules(max_initial=None)(logits, [[TB, 5]])
    assert not torch.isinf(out[0, 5])
