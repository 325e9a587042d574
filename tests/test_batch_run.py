"""The batch-run skeleton (``specli.io.batch``, ``specli.commands.batch_run``) on its own: outcomes released in input
order whatever order they finish in, a failure in the middle keeps the batch going, the resume mode from the flags
and what each mode does with an existing output, and the run-manifest row of each status."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from specli.commands.batch_run import resume_mode
from specli.io.batch import InOrder, Outcome, in_input_order, manifest_row
from specli.tts.pipeline import Resume, SpeechItem, run_items, write_output
from specli.tts.synthesis import SynthesisInputError, SynthesisRequest


def test_out_of_order_completion_is_released_in_input_order():
    finished = [(2, "c"), (0, "a"), (3, "d"), (1, "b"), (4, "e")]
    assert list(in_input_order(finished)) == ["a", "b", "c", "d", "e"]
    order: InOrder[str] = InOrder()
    assert [order.settle(k, out) for k, out in finished] == [[], ["a"], [], ["b", "c", "d"], ["e"]]


def _interrupted(pairs):
    yield from pairs
    raise KeyboardInterrupt


def test_ctrl_c_reports_what_finished():
    """What finished before Ctrl-C but waits for an earlier input is reported (input order, gaps allowed), then
    the interrupt goes on."""
    seen = []
    with pytest.raises(KeyboardInterrupt):
        for out in in_input_order(_interrupted([(3, "d"), (0, "a"), (2, "c")])):
            seen.append(out)
    assert seen == ["a", "c", "d"]


def _items(n: int) -> list[SpeechItem]:
    return [SpeechItem(f"lines.txt:{i + 1}", SynthesisRequest(f"u{i}", f"line {i}")) for i in range(n)]


def _target(tmp_path: Path, settings: dict):
    return lambda it: (tmp_path / f"{it.request.id}.bin", {**settings, "text": it.request.text})


def _produce(it: SpeechItem, path: Path, settings: dict) -> Outcome:
    if it.request.text == "line 1":
        raise SynthesisInputError("cannot speak line 1")
    write_output(path, it.request.text.encode(), settings, {"id": it.request.id})
    return Outcome(it.where, it.request.text, outputs=(path,), id=it.request.id)


def test_a_failure_in_the_middle_keeps_the_batch_going(tmp_path):
    bad = SpeechItem("lines.txt:4", None, "empty line")
    pairs = run_items([*_items(3), bad], Resume({}), _target(tmp_path, {}), _produce, (SynthesisInputError,))
    outcomes = [out for _, out in pairs]
    assert [o.status for o in outcomes] == ["ok", "failed", "ok", "failed"]
    assert outcomes[1].error == "cannot speak line 1" and outcomes[1].id == "u1" and outcomes[1].outputs == ()
    assert outcomes[3].error == "empty line" and outcomes[3].id == ""
    assert sorted(p.name for p in tmp_path.glob("*.bin")) == ["u0.bin", "u2.bin"]


def test_resume_mode_from_the_flags():
    assert resume_mode(False, False) == "changed"
    assert resume_mode(True, False) == "overwrite"
    assert resume_mode(False, True) == "skip-existing"
    with pytest.raises(click.UsageError, match="exclude each other"):
        resume_mode(True, True)


@pytest.mark.parametrize(("mode", "settings", "status"), [
    ("changed", {"seed": 1}, "skipped"),  # made with the same settings: kept, its record read back
    ("changed", {"seed": 2}, "ok"),  # other settings: redone, and said why
    ("overwrite", {"seed": 1}, "ok"),
    ("skip-existing", {"seed": 2}, "skipped"),
])
def test_each_resume_mode_on_an_existing_output(tmp_path, mode, settings, status):
    items = _items(1)
    list(run_items(items, Resume({}), _target(tmp_path, {"seed": 1}), _produce, ()))  # the first run
    redone = []
    resume = Resume({}, mode, on_redo=lambda rid, why: redone.append((rid, why)))
    [(_, out)] = run_items(items, resume, _target(tmp_path, settings), _produce, ())
    assert out.status == status and out.outputs == (tmp_path / "u0.bin",)
    assert out.record == ({"id": "u0"} if status == "skipped" else None)
    assert redone == ([("u0", "settings changed (seed 1 -> 2)")] if mode == "changed" and status == "ok" else [])


def test_the_manifest_row_of_each_status():
    ok = Outcome(Path("a.wav"), "text", outputs=(Path("out/a.txt"),), record={"text": "hi"})
    failed = Outcome(Path("b.wav"), error="b.wav: not audio")
    skipped = Outcome("lines.txt:3", skipped=True, outputs=(Path("u3.npy"),), id="u3")
    assert manifest_row(ok, {"audio_seconds": 1.5}, False) == {
        "input": "a.wav", "status": "ok", "outputs": ["out/a.txt"], "error": None, "audio_seconds": 1.5}
    assert manifest_row(ok, {}, True)["record"] == {"text": "hi"}
    assert "record" not in manifest_row(failed, {}, True)  # none to print
    assert manifest_row(failed, {}, False) == {"input": "b.wav", "status": "failed", "outputs": [],
                                               "error": "b.wav: not audio"}
    row = manifest_row(skipped, {"tokens": 0}, False, named=True)
    assert json.dumps(row) == ('{"input": "lines.txt:3", "id": "u3", "status": "skipped", "outputs": ["u3.npy"], '
                               '"error": null, "tokens": 0}')  # the manifest's key order
