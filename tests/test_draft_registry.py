"""One DraftSpec in every preset class, one drafter registry: the shipped presets load to the values they had
before the DraftSpec (tests/shipped_presets.json, written by main's loader at cee3496, when every setting was a
flat preset field), a DraftSpec checks itself, and each pipeline's drafter kinds are found in one registry."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, asdict, fields
from pathlib import Path

import pytest

import specli.asr.strategies  # noqa: F401  (registers the transcription drafter kinds)
import specli.tts.synthesis  # noqa: F401  (registers the synthesis drafter kinds)
from specli.core.drafters.ngram import NgramDrafter, NgramPool
from specli.core.drafters.registry import DRAFTERS, DrafterRegistry, UnknownDrafterError
from specli.errors import PresetError
from specli.models.registry import FAMILIES
from specli.presets import available_presets, default_draft, load_any_preset, preset_from_dict
from specli.presets.draft import DRAFT_FIELDS, DraftSpec
from specli.presets.synthesis import SynthesisPreset
from specli.tts.drafters import run_draft

BEFORE = json.loads((Path(__file__).parent / "shipped_presets.json").read_text())
WHISPER_ONLY = {"draft_model", "head", "head_weights", "branch_steps"}  # audio-LLM presets no longer carry them


def _flat(preset) -> dict:
    """A preset as the flat table its fields were before the DraftSpec."""
    own = {f.name: getattr(preset, f.name) for f in fields(preset) if f.name != "draft"}
    return {"class": type(preset).__name__, **own, **asdict(preset.draft)}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_every_shipped_preset_loads_to_the_values_it_had(name: str) -> None:
    before, now = BEFORE[name], _flat(load_any_preset(name))
    assert {k: (v, type(v)) for k, v in now.items() if k in before} == {k: (v, type(v)) for k, v in before.items()
                                                                       if k in now}
    cls = type(load_any_preset(name))
    keys = {f.name for f in fields(cls)} - {"draft"} | cls.DRAFT_KEYS | {"class"}
    dropped = set(before) - keys
    assert dropped == (WHISPER_ONLY if before["class"] == "AudioLLMPreset" else set())
    assert all(before[k] == getattr(DraftSpec(), k) for k in dropped)  # they were unused defaults


def test_the_snapshot_covers_every_shipped_preset() -> None:
    assert sorted(BEFORE) == available_presets(None)


def test_a_draft_spec_checks_itself() -> None:
    assert DraftSpec(strategy="chain", drafter="pool", confidence_threshold=0).confidence_threshold == 0.0
    assert isinstance(DraftSpec(tree_threshold=1).tree_threshold, float)
    for bad, match in (({"strategy": "chain"}, "takes drafter 'none'"), ({"max_draft": 0}, "max_draft"),
                       ({"max_draft": 25}, "max_draft"), ({"ngram": 0}, "ngram"), ({"tree_topk": -1}, "tree_topk"),
                       ({"branch_steps": -1}, "branch_steps"), ({"max_draft_rows": -1}, "max_draft_rows"),
                       ({"confidence_threshold": 1.0}, "thresholds"), ({"stop_drafting_below": 24}, "stop_drafting"),
                       ({"strategy": "beam"}, "strategy must be one of"), ({"max_draft": True}, "an integer"),
                       ({"draft_length": "auto"}, "draft_length"), ({"head_weights": "int4"}, "head_weights")):
        with pytest.raises(PresetError, match=match):
            DraftSpec(**bad)
    with pytest.raises(FrozenInstanceError):
        DraftSpec().max_draft = 3  # type: ignore[misc]


def test_a_preset_names_itself_in_its_draft_errors() -> None:
    with pytest.raises(PresetError, match=r"preset 'x': max_draft must be within 1\.\.24"):
        preset_from_dict("x", {"model": "m", "strategy": "chain", "drafter": "pool", "max_draft": 0})
    with pytest.raises(PresetError, match=r"preset 'x': drafter must be one of \['none', 'pool', 'eagle3'"):
        preset_from_dict("x", {"model": "m", "family": "qwen2-audio", "strategy": "chain", "drafter": "eagle"})


@pytest.mark.parametrize("family,key,value", [("qwen2-audio", "branch_steps", 3), ("qwen2-audio", "head_weights", "int8"),
                                              ("qwen3-asr", "draft_model", "whisper-tiny"),
                                              ("cosyvoice", "draft_length", "goodput"), ("cosyvoice", "head", "h")])
def test_a_family_takes_only_its_own_draft_keys(family: str, key: str, value: object) -> None:
    with pytest.raises(PresetError, match=rf"unknown key\(s\) \['{key}'\]"):
        preset_from_dict("x", {"model": "m", "family": family, key: value})


def test_a_preset_built_in_code_keeps_to_its_family_keys() -> None:
    spec = DraftSpec(strategy="chain", drafter="pool", head_weights="int8")
    with pytest.raises(PresetError, match=r"\['head_weights'\] are no settings of family 'cosyvoice'"):
        SynthesisPreset("x", "cosyvoice3", draft=spec)
    synth = SynthesisPreset("x", "cosyvoice3", draft=default_draft(SynthesisPreset))
    assert synth.draft.confidence_threshold == 0.3 and synth.draft.tree_depth == 8  # synthesis's defaults
    assert synth.with_draft(strategy="chain", drafter="pool").draft.drafter == "pool"


def test_every_preset_drafter_kind_is_registered_by_its_pipeline() -> None:
    for fam in FAMILIES.values():
        cls = fam.preset_class()
        assert set(cls.DRAFTER_KINDS) - {"none"} <= set(DRAFTERS.kinds(fam.task)), (fam.name, DRAFTERS.kinds(fam.task))
        assert cls.DRAFT_KEYS <= DRAFT_FIELDS


def test_an_unknown_kind_lists_the_registered_ones() -> None:
    with pytest.raises(UnknownDrafterError, match=r"unknown transcribe drafter kind 'medusa'; registered kinds: "
                                                  r"cross-tokenizer, dflash, eagle, eagle3, model, pool"):
        DRAFTERS.build("transcribe", "medusa", None, DraftSpec())
    with pytest.raises(UnknownDrafterError, match=r"registered kinds: dflash, dspark, eagle3, model, pool"):
        DRAFTERS.build("synthesize", "eagle", None, DraftSpec())


def test_a_registry_builds_with_the_kind_s_builder_and_refuses_a_second() -> None:
    registry = DrafterRegistry()

    @registry.register("transcribe", "pool")
    def pool(model, spec: DraftSpec, eot: int) -> NgramDrafter:
        return NgramDrafter(NgramPool(spec.ngram), eot)

    drafter = registry.build("transcribe", "pool", None, DraftSpec(strategy="chain", drafter="pool", ngram=3), eot=7)
    assert isinstance(drafter, NgramDrafter) and drafter.eot == 7 and drafter.pool.max_ngram == 3
    assert registry.kinds("transcribe") == ("pool",) and registry.kinds("synthesize") == ()
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("transcribe", "pool")(pool)


def test_the_synthesis_run_takes_the_cli_drafter() -> None:
    """--draft: a preset kind, the pool (chains), none (plain AR) or a drafter directory (kind "model")."""
    adaptive = load_any_preset("cosyvoice3-dspark-adaptive").draft
    assert run_draft(adaptive) == adaptive
    pool = run_draft(adaptive, "pool")
    assert (pool.strategy, pool.drafter, pool.max_draft) == ("chain", "pool", adaptive.max_draft)
    assert (run_draft(adaptive, "none").strategy, run_draft(adaptive, "none").drafter) == ("ar", "none")
    mine = run_draft(load_any_preset("cosyvoice3-ar").draft, "/drafters/mine")
    assert (mine.strategy, mine.drafter, mine.draft_dir) == ("chain", "model", "/drafters/mine")
    assert run_draft(adaptive, "dflash").strategy == "adaptive"
