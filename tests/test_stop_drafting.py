"""``stop_drafting_below``: a window whose drafts are rarely accepted stops drafting after a probe (speed only:
the output is the target's greedy decode either way), at batch 1 and per row of a batch."""

from __future__ import annotations

import pytest

from specli.core.batched import RowJob, decode_all
from specli.core.drafters.batched import PerRowDrafters
from specli.asr.drafters.model import ModelDrafter
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob
from specli.core.speculative import PROBE_FORWARDS, SpecOptions, drafting_pays, speculative_decode
from specli.core.types import DecodeStats
from specli.errors import PresetError
from specli.presets import preset_from_dict
from tiny_models import EOT, NO_TS, SOT, AlwaysWrongDrafter, tiny_rules, tiny_target, window

TARGET = tiny_target(0)
MAX_NEW = 40


def test_drafting_pays_judges_after_the_probe():
    stats = DecodeStats(verify_steps=PROBE_FORWARDS - 1, accepted=0)
    assert drafting_pays(stats, 0.5)  # still probing
    assert not drafting_pays(DecodeStats(verify_steps=PROBE_FORWARDS, accepted=2), 0.5)
    assert drafting_pays(DecodeStats(verify_steps=PROBE_FORWARDS, accepted=3), 0.5)
    assert drafting_pays(DecodeStats(verify_steps=100, accepted=0), 0.0)  # 0: never stops
    with pytest.raises(ValueError):
        SpecOptions(stop_below=-1)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_window_stops_drafting_when_drafts_are_rejected_and_keeps_its_output(seed):
    prompt, rules = [SOT, NO_TS], tiny_rules(False)
    ref = greedy_decode(TARGET, window(TARGET, seed), DecodeJob(prompt, rules, EOT, MAX_NEW))
    assert len(ref.tokens) > 2 * PROBE_FORWARDS
    runs = {}
    for stop in (0.0, 0.5):
        out = speculative_decode(TARGET, window(TARGET, seed), DecodeJob(prompt, rules, EOT, MAX_NEW),
                                 AlwaysWrongDrafter(), SpecOptions(max_draft=3, stop_below=stop))
        assert out.tokens == ref.tokens
        runs[stop] = out.stats
    assert runs[0.5].drafted == 3 * PROBE_FORWARDS < runs[0.0].drafted
    right = speculative_decode(TARGET, window(TARGET, seed), DecodeJob(prompt, rules, EOT, MAX_NEW),
                               ModelDrafter(TARGET, share_encoder=True), SpecOptions(max_draft=3, stop_below=0.5))
    assert right.tokens == ref.tokens and right.stats.accepted == right.stats.drafted > 3 * PROBE_FORWARDS


def test_rows_of_a_batch_stop_drafting_on_their_own():
    jobs = []
    for key, seed in enumerate((1, 2, 3)):
        w = window(TARGET, seed)
        job = DecodeJob([SOT, NO_TS], tiny_rules(False), EOT, MAX_NEW)
        jobs.append(RowJob(key, (w.audio_features, w.features), job))
    ar = dict(decode_all(TARGET, jobs, 2))
    wrong = dict(decode_all(TARGET, jobs, 2, drafter=PerRowDrafters(AlwaysWrongDrafter),
                            options=SpecOptions(max_draft=3, stop_below=0.5)))
    for key, res in wrong.items():
        assert res.tokens == ar[key].tokens and res.stats.drafted == 3 * PROBE_FORWARDS


def test_presets_validate_the_threshold():
    kw = dict(model="whisper-base", strategy="adaptive", drafter="eagle", head="h", confidence_threshold=0.7)
    assert preset_from_dict("p", {**kw, "stop_drafting_below": 0.5}).draft.stop_drafting_below == 0.5
    with pytest.raises(PresetError):
        preset_from_dict("p", {**kw, "stop_drafting_below": -0.1})
