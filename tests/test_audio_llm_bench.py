"""`specli bench` on audio-LLM presets (the tiny random Qwen3-Omni thinker as $SPECLI_MODELS_DIR/qwen3-omni, a
random EAGLE-3 drafter as .../qwen3-omni-eagle3): the family loads through the registry and its hooks (no
Whisper special tokens), the speculative presets are token-identical to AR, and report.json / report.md give
the distinct MoE experts touched per verify step, more with longer drafts."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import EN_CLIPS
from qwen3_omni_fixtures import write_tiny_qwen3_omni
from specli.cli import main
from specli.core.drafters.llm.dflash import new_dflash
from specli.core.drafters.llm.eagle3 import new_eagle3
from specli.core.drafters.llm.speculators import save_speculators
from specli.models.qwen3_omni.loader import load_qwen3_omni


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-models")
    write_tiny_qwen3_omni(root / "qwen3-omni")
    target = load_qwen3_omni(str(root / "qwen3-omni"), "float32").target
    ids, convention = target.draft_recipe.aux_layers("eagle3", target.dims.layers)
    save_speculators(new_eagle3(target.draft_parts(), 5, aux_layers=ids, convention=convention),
                     root / "qwen3-omni-eagle3")
    # a DFlash drafter reading other layers of the same target (the tiny depth gives both recipes [0, 1, 2]): one
    # bench process serves both (the target returns the union, each drafter picks its own)
    save_speculators(new_dflash(target.draft_parts(), layers=1, block_size=4, aux_layers=(0, 2), convention="input",
                                seed=5), root / "qwen3-omni-dflash")
    return root


def test_bench_reports_experts_touched_per_verify_step(models_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLI_MODELS_DIR", str(models_dir))
    out = tmp_path / "bench"
    res = CliRunner().invoke(main, ["bench", str(EN_CLIPS[0]), str(EN_CLIPS[2]), "--presets",
                                    "qwen3-omni-ar,qwen3-omni-eagle3,qwen3-omni-dflash,qwen3-omni-pool", "--repeat", "1",
                                    "--no-warmup", "--no-plots", "--language", "en", "--out", str(out), "-q"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    summaries = {s["system"]: s for s in report["summaries"]}
    assert set(summaries) == {"qwen3-omni-ar", "qwen3-omni-eagle3", "qwen3-omni-dflash", "qwen3-omni-pool"}
    ar, eagle = summaries["qwen3-omni-ar"], summaries["qwen3-omni-eagle3"]
    moe_layers = 2  # the tiny thinker: 3 layers, layer 1 dense (mlp_only_layers), top-2 of 8 experts
    assert ar["experts_by_tokens"] == {"1": pytest.approx(2 * moe_layers)}  # a decode step: top-k a layer
    assert ar["experts_per_step"] == pytest.approx(2 * moe_layers)
    assert eagle["experts_per_step"] > ar["experts_per_step"]  # verifying k + 1 tokens reads more experts
    by = {int(n): v for n, v in eagle["experts_by_tokens"].items()}
    assert max(by) > 1 and by[max(by)] > by[min(by)] and all(v <= 8 * moe_layers for v in by.values())
    runs = [r for r in map(json.loads, (out / "runs.jsonl").read_text().splitlines()) if "token_ids" in r]
    assert len(runs) == 8
    tokens = {}
    for r in runs:
        tokens.setdefault(r["file"], {})[r["system"]] = r["token_ids"]
    for per_system in tokens.values():  # lossless: every speculative preset writes AR's tokens
        assert (per_system["qwen3-omni-eagle3"] == per_system["qwen3-omni-dflash"] == per_system["qwen3-omni-ar"]
                == per_system["qwen3-omni-pool"])
    md = (out / "report.md").read_text()
    assert "## MoE experts touched" in md and "qwen3-omni-eagle3" in md
