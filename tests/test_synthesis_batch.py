"""``synthesize --batch-size``: a request's speech tokens do not depend on the batch size or the order of
the requests (tiny CosyVoice checkpoints; the AR and n-gram pool presets; greedy, RAS and vLLM samplers).

Batched matrix products can move a logit by ~1e-7 against batch 1. Where that flips a decision, the
first differing token must be a near-tie of the batch-1 decode, within ``TOL`` of flipping: a greedy
top-2 gap; with AR sampling, the step's uniform against the sampler's CDF; with the pool drafter and a
sampler, any acceptance test (uniform against the target probability of the draft token) or recovery
sample (uniform against the CDF of the target or the residual distribution) of the speculative step that
emitted it, replayed with the request's generator.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cosyvoice_fixtures import write_checkpoint
from specli.cli import main
import specli.core.speculative as speculative
from specli.core.logits import filter_logits
from specli.core.sampling import request_generator
from specli.tts.synthesis import PresetOverrides, SynthesisInputError, SynthesisRequest, build_synthesizer, prepare
from specli.presets.synthesis import load_synthesis_preset

TOL = 1e-5  # a decision closer than this to flipping is a near-tie
SEED = 5
TEXTS = ["hi", "ok then", "one two", "yes", "a b"]  # 40 to 140 tokens each (the tiny model never stops early)
REQUESTS = [SynthesisRequest(f"r{i}", t) for i, t in enumerate(TEXTS)]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from specli.models.cosyvoice.lm import load_cosyvoice

    return load_cosyvoice(str(write_checkpoint(tmp_path_factory.mktemp("cv2") / "ckpt", "cosyvoice2", seed=3)))


def _synth(model, preset: str, sampler: str):
    return build_synthesizer(load_synthesis_preset(preset), model, PresetOverrides(sampler=sampler, seed=SEED))


@pytest.fixture(scope="module")
def reference(model):
    """Batch-1 tokens of every request, per (preset, sampler)."""
    cache: dict = {}

    def get(preset: str, sampler: str) -> dict[str, list[int]]:
        if (preset, sampler) not in cache:
            synth = _synth(model, preset, sampler)
            cache[preset, sampler] = {r.id: synth.synthesize(r).tokens for r in REQUESTS}
        return cache[preset, sampler]

    return get


def _near_ties(model, synth, request: SynthesisRequest, tokens: list[int]) -> set[int]:
    """Steps of the batch-1 AR decode of ``tokens`` whose decision lies within TOL of flipping."""
    prep = prepare(model, request)
    job = synth._job(request, prep, torch.device("cpu"))
    state = model.lm.start(len(prep.prompt) + len(tokens) + 2)
    with torch.inference_mode():
        logits = model.lm.score(state, torch.tensor([prep.prompt + tokens])).logits[0, len(prep.prompt) - 1:]
    uniforms = torch.rand(len(tokens) + 1, generator=request_generator(SEED, request.id), dtype=torch.float64)
    fragile = set()
    for t in range(len(tokens) + 1):
        filtered = filter_logits(logits[t : t + 1], [tokens[:t]], job.rules, job.sampling)[0].double()
        if job.sampling.greedy:
            top = filtered.topk(2).values
            margin = float(top[0] - top[1])
        else:
            cdf = filtered.softmax(-1).cumsum(-1)
            margin = float((cdf - uniforms[t] * cdf[-1]).abs().min())
        if margin < TOL:
            fragile.add(t)
    return fragile


def _cdf_distance(probs: torch.Tensor, u: float) -> float:
    cdf = probs.cumsum(-1)
    return float((cdf - u * cdf[-1]).abs().min())


def _step_margin(filtered: torch.Tensor, draft: list[int], u_accept: list[float], u_sample: list[float]) -> float:
    """How close one speculative chain step (point-mass drafts) came to another outcome."""
    p = filtered.double().softmax(-1)  # [n+1, vocab]
    margins = [abs(u_accept[i] - float(p[i, tok])) for i, tok in enumerate(draft)]
    for j, u in enumerate(u_sample):
        margins.append(_cdf_distance(p[j], u))
        if j < len(draft):
            residual = p[j].clone()
            residual[draft[j]] = 0.0
            margins.append(_cdf_distance(residual, u))
    return min(margins)


def _speculative_near_ties(synth, request: SynthesisRequest) -> set[int]:
    """Positions emitted by a batch-1 speculative step of ``request`` that lay within TOL of flipping."""
    real, fragile = speculative.accept_draft, set()

    def recording(logits, sampled, proposal, filt, sampling, gen, backend="auto"):
        saved, n = gen.get_state(), len(proposal)
        u_accept = torch.rand(n, generator=gen, dtype=torch.float64).float().tolist()
        u_sample = torch.rand(n + 1, generator=gen, dtype=torch.float64).float().tolist()
        gen.set_state(saved)
        kept, emitted, logprobs = real(logits, sampled, proposal, filt, sampling, gen, backend)
        filtered = filt(logits, speculative._row_prefixes(sampled, proposal))
        if _step_margin(filtered, proposal.tokens, u_accept, u_sample) < TOL:
            fragile.update(range(len(sampled), len(sampled) + len(emitted)))
        return kept, emitted, logprobs

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(speculative, "accept_draft", recording)
        synth.synthesize(request)
    return fragile


def _check(model, synth, got: dict[str, list[int]], ref: dict[str, list[int]], drafts_matter: bool) -> None:
    for r in REQUESTS:
        a, b = got[r.id], ref[r.id]
        if a == b:
            continue
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        ties = _speculative_near_ties(synth, r) if drafts_matter else _near_ties(model, synth, r, b)
        assert first in ties, f"{r.id}: differs from batch 1 at token {first}, not a near-tie"


def _batched(synth, order: list[int], batch_size: int) -> dict[str, list[int]]:
    requests = [REQUESTS[i] for i in order]
    out = dict(synth.synthesize_batch(requests, batch_size))
    assert sorted(out) == list(range(len(requests)))
    return {requests[i].id: res.tokens for i, res in out.items()}


@pytest.mark.parametrize(("preset", "sampler"), [
    ("cosyvoice2-ar", "greedy"), ("cosyvoice2-ar", "ras"), ("cosyvoice2-ar", "vllm"),
    ("cosyvoice2-pool", "greedy"), ("cosyvoice2-pool", "ras")])
@settings(max_examples=5, deadline=None)
@given(batch_size=st.integers(1, 6), order=st.permutations(range(len(TEXTS))))
def test_tokens_do_not_depend_on_batch_size_or_order(model, reference, preset, sampler, batch_size, order):
    synth = _synth(model, preset, sampler)
    got = _batched(synth, list(order), batch_size)
    drafts_matter = preset.endswith("-pool") and sampler != "greedy"  # sampled tokens depend on the drafts
    _check(model, synth, got, reference(preset, sampler), drafts_matter)


def test_pool_sampling_does_not_depend_on_earlier_requests(model, reference):
    """A sampled request drafts from its own tokens, so what ran before it (or was skipped) changes nothing."""
    synth = _synth(model, "cosyvoice2-pool", "ras")
    alone = synth.synthesize(REQUESTS[3]).tokens
    for r in REQUESTS:
        synth.synthesize(r)
    assert synth.synthesize(REQUESTS[3]).tokens == alone == reference("cosyvoice2-pool", "ras")["r3"]


def test_bad_requests_come_first(model):
    synth = _synth(model, "cosyvoice2-ar", "greedy")
    out = list(synth.synthesize_batch([REQUESTS[0], SynthesisRequest("bad", "   "), REQUESTS[1]], 2))
    assert out[0][0] == 1 and isinstance(out[0][1], SynthesisInputError)
    assert sorted(i for i, _ in out[1:]) == [0, 2]
    with pytest.raises(ValueError, match="batch_size"):
        list(synth.synthesize_batch(REQUESTS, 0))


def _cli(*args):
    return CliRunner().invoke(main, ["synthesize", "--format", "npy", *map(str, args)], catch_exceptions=False)


def test_cli_batch_size_writes_the_batch_1_outputs_in_input_order(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt", "cosyvoice2", seed=3)
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(TEXTS[:3]) + "\n\n" + "\n".join(TEXTS[3:]) + "\n", encoding="utf-8")
    common = (lines, "--model", ckpt, "--preset", "cosyvoice2-pool", "--sampler", "greedy", "--jsonl", "-")
    one = _cli(*common, "-o", tmp_path / "one")
    (tmp_path / "three").mkdir()
    np.save(tmp_path / "three" / "lines_00002.npy", np.asarray([1, 2, 3], dtype=np.int32))  # resumed: kept
    three = _cli(*common, "-o", tmp_path / "three", "--batch-size", "3", "--skip-existing")
    assert one.exit_code == three.exit_code == 1  # the empty line
    assert f"{lines}:4: empty line" in three.stderr
    ids = [json.loads(x)["id"] for x in three.stdout.splitlines()]
    assert ids == ["lines_00001", "lines_00003", "lines_00005", "lines_00006"]  # input order, skipped one left out
    assert "1 skipped" in three.stderr and "skipped lines_00002: no JSON record" in three.stderr
    for name in ids:
        assert np.load(tmp_path / "three" / f"{name}.npy").tolist() == np.load(tmp_path / "one" / f"{name}.npy").tolist()
    assert np.load(tmp_path / "three" / "lines_00002.npy").tolist() == [1, 2, 3]


def test_ctrl_c_reports_a_batched_row_written_before_an_earlier_one(tmp_path, monkeypatch):
    """Batched rows finish out of order: a short line written while an earlier, longer one still runs is reported
    (its JSONL record) when Ctrl-C stops the run, and its output is whole."""
    import specli.tts.pipeline as pipeline

    ckpt = write_checkpoint(tmp_path / "ckpt", "cosyvoice2", seed=3)
    lines = tmp_path / "lines.txt"
    lines.write_text("ok then\nhi\n", encoding="utf-8")  # ~140 then ~40 speech tokens: line 2 finishes first
    write = pipeline.write_atomic_with

    def ctrl_c_on_line_1(path, fill):
        if path.name.startswith("lines_00001"):
            raise KeyboardInterrupt
        write(path, fill)

    monkeypatch.setattr(pipeline, "write_atomic_with", ctrl_c_on_line_1)
    res = _cli(lines, "--model", ckpt, "--preset", "cosyvoice2-ar", "--sampler", "greedy", "--jsonl", "-",
               "-o", tmp_path / "out", "--batch-size", "2")
    assert res.exit_code == 130
    assert [json.loads(x)["id"] for x in res.stdout.splitlines()] == ["lines_00002"]
    assert len(np.load(tmp_path / "out" / "lines_00002.npy")) > 0
    assert not (tmp_path / "out" / "lines_00001.npy").exists()


@pytest.mark.parametrize(("preset", "sampler"), [("cosyvoice2-ar", "ras"), ("cosyvoice2-pool", "ras")])
def test_the_near_tie_check_rejects_a_real_difference(model, reference, preset, sampler):
    synth = _synth(model, preset, sampler)
    ref = reference(preset, sampler)
    got = {**ref, "r2": ref["r2"][:5] + [(ref["r2"][5] + 1) % 6561] + ref["r2"][6:]}
    with pytest.raises(AssertionError, match="r2: differs from batch 1 at token 5"):
        _check(model, synth, got, ref, preset.endswith("-pool"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dspark", "eagle3"])
def test_model_drafters_batch_with_the_batch_1_tokens(tmp_path, kind):
    """Each row gets its own drafter over the shared module. Greedy and RAS tokens equal batch 1 on this
    fixture (no near-tie check here: these drafters sample their drafts, so a flip could also come from
    the drafter's own states)."""
    from specli.core.drafters.llm.speculators import save_speculators
    from specli.models.cosyvoice.lm import load_cosyvoice
    from test_speech_drafters import make_module

    ckpt = write_checkpoint(tmp_path / "ckpt", "cosyvoice2", seed=3)
    draft = save_speculators(make_module(kind, load_cosyvoice(str(ckpt)).lm.draft_parts(), seed=1), tmp_path / kind)
    for sampler in ("greedy", "ras"):
        model = load_cosyvoice(str(ckpt))
        synth = build_synthesizer(load_synthesis_preset(f"cosyvoice2-{kind}"), model,
                                  PresetOverrides(draft=str(draft), sampler=sampler, seed=SEED))
        ref = {r.id: synth.synthesize(r).tokens for r in REQUESTS[:4]}
        for batch_size, order in ((1, [0, 1, 2, 3]), (3, [3, 1, 0, 2])):
            requests = [REQUESTS[i] for i in order]
            got = {requests[i].id: res.tokens for i, res in synth.synthesize_batch(requests, batch_size)}
            assert got == ref, (kind, sampler, batch_size)


def test_preset_overrides_name_a_known_sampler() -> None:
    """A run's overrides are checked where they are built: a sampler name that is none of the samplers."""
    assert PresetOverrides(sampler="vllm", top_k=5).sampler == "vllm"
    with pytest.raises(ValueError, match="unknown sampler 'beam': choose ras, vllm, greedy"):
        PresetOverrides(sampler="beam")
