"""The offline model locator (specli/io/locate.py): a path, then a shipped directory, then $SPECLI_MODELS_DIR, then
a snapshot in the local Hugging Face cache (the layout huggingface_hub writes: blobs, snapshots/<rev> of symlinks,
refs/main); required files checked; one error naming where it looked."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from specli.asr.drafters.eagle_head import resolve_head
from specli.core.drafters.llm.loading import resolve_drafter_dir
from specli.errors import ModelLoadError
from specli.io import locate as loc
from specli.io.locate import Lookup, locate


def _needs_config(path: Path) -> list[str]:
    return [] if (path / "config.json").is_file() else ["config.json"]


LOOKUP = Lookup("test model", required=_needs_config, hint="It needs config.json.")


def _model(path: Path, files: tuple[str, ...] = ("config.json",)) -> Path:
    path.mkdir(parents=True)
    for name in files:
        (path / name).write_text("{}")
    return path


def _hub_snapshot(hub: Path, repo: str, rev: str, files: dict[str, str], main: bool = True) -> Path:
    """One revision of ``repo`` as huggingface_hub caches it: content in blobs/<sha256>, the snapshot's files
    relative symlinks to them, refs/main holding the revision (when ``main``)."""
    entry = hub / f"models--{repo.replace('/', '--')}"
    snap = entry / "snapshots" / rev
    (entry / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True)
    for name, text in files.items():
        blob = entry / "blobs" / hashlib.sha256(text.encode()).hexdigest()
        blob.write_text(text)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    if main:
        (entry / "refs").mkdir(exist_ok=True)
        (entry / "refs" / "main").write_text(rev)
    return snap


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """No model place of the machine running the tests: the models dir and every hub cache under tmp_path."""
    monkeypatch.setenv("SPECLI_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(loc.hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return {"models": tmp_path / "models", "hub": tmp_path / "hub", "home_hub": tmp_path / "hf-home" / "hub"}


def test_a_path_comes_first_and_must_hold_the_required_files(tmp_path: Path, places: dict[str, Path]) -> None:
    given = _model(tmp_path / "given")
    _model(places["models"] / "given", ())
    assert locate(str(given), LOOKUP) == given
    (given / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"given is not a test model directory: missing config\.json"):
        locate(str(given), LOOKUP)
    # a name that reads as a path is looked for nowhere else, even when $SPECLI_MODELS_DIR has that name
    _model(places["models"] / "elsewhere")
    with pytest.raises(ModelLoadError, match=r"test model directory not found: .*nowhere.*never downloads"):
        locate(str(tmp_path / "nowhere"), LOOKUP)
    with pytest.raises(ModelLoadError, match="directory not found"):
        locate("./elsewhere", LOOKUP)


def test_specli_models_dir_by_name_then_by_repo_name(places: dict[str, Path]) -> None:
    by_repo = _model(places["models"] / "Model-1B")
    assert locate("short", Lookup("m", repo="org/Model-1B")) == by_repo
    by_name = _model(places["models"] / "short")
    assert locate("short", Lookup("m", repo="org/Model-1B")) == by_name
    nested = _model(places["models"] / "org" / "Other")
    assert locate("org/Other", LOOKUP) == nested


def test_hf_cache_snapshot_refs_main_first(places: dict[str, Path]) -> None:
    main = _hub_snapshot(places["hub"], "org/model", "a" * 40, {"config.json": "{}", "weights.bin": "w"})
    newer = _hub_snapshot(places["hub"], "org/model", "b" * 40, {"config.json": "{}"}, main=False)
    os.utime(newer, (main.stat().st_mtime + 10,) * 2)
    assert locate("org/model", LOOKUP) == main
    assert (main / "config.json").is_symlink() and (main / "config.json").read_text() == "{}"
    assert locate("short", Lookup("m", repo="org/model")) == main  # a family's short name for a hub id
    # a snapshot lacking a required file is passed over for the next one (here: the newest other revision)
    (main / "config.json").unlink()
    assert locate("org/model", LOOKUP) == newer
    # $SPECLI_MODELS_DIR comes before the cache
    by_dir = _model(places["models"] / "org" / "model")
    assert locate("org/model", LOOKUP) == by_dir


def test_hf_home_and_environment_read_when_called(places: dict[str, Path], monkeypatch) -> None:
    snap = _hub_snapshot(places["home_hub"], "org/home", "c" * 40, {"config.json": "{}"})
    assert locate("org/home", LOOKUP) == snap
    monkeypatch.setenv("HF_HOME", str(places["hub"].parent / "other-home"))
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache"):
        locate("org/home", LOOKUP)


def test_not_found_names_where_it_looked(places: dict[str, Path], monkeypatch) -> None:
    _model(places["models"] / "org" / "broken", ())
    snap = _hub_snapshot(places["hub"], "org/broken", "d" * 40, {"weights.bin": "w"})
    with pytest.raises(ModelLoadError) as err:
        locate("org/broken", LOOKUP)
    msg = str(err.value)
    assert msg.startswith("test model 'org/broken' not found offline")
    assert f"not under {places['models'] / 'org' / 'broken'} or {places['models'] / 'broken'}" in msg
    assert f"{snap} lacks config.json" in msg and f"{places['models'] / 'org' / 'broken'} lacks config.json" in msg
    assert str(places["hub"]) in msg and str(places["home_hub"]) in msg
    assert "It needs config.json." in msg and "`hf download org/broken`" in msg and "never downloads" in msg
    monkeypatch.delenv("SPECLI_MODELS_DIR")
    with pytest.raises(ModelLoadError, match=r"not under \$SPECLI_MODELS_DIR/plain \(SPECLI_MODELS_DIR is not set\)") \
            as err:
        locate("plain", LOOKUP)
    assert "Hugging Face" not in str(err.value)  # not a hub id: the cache is not searched


def test_shipped_directory_before_models_dir(tmp_path: Path, places: dict[str, Path]) -> None:
    shipped = _model(tmp_path / "pkg" / "heads" / "h")
    _model(places["models"] / "h")
    assert locate("h", Lookup("head", shipped=(shipped,))) == shipped
    assert locate("h", Lookup("head", shipped=(tmp_path / "pkg" / "heads" / "absent",))) == places["models"] / "h"


def test_drafters_and_heads_are_found_by_the_locator(places: dict[str, Path]) -> None:
    """The drafter and EAGLE-head lookups take the same places: $SPECLI_MODELS_DIR and the HF cache."""
    drafter = _hub_snapshot(places["hub"], "org/drafter", "e" * 40, {"config.json": "{}", "model.safetensors": "w"})
    assert resolve_drafter_dir("org/drafter") == drafter
    head = _model(places["models"] / "my-head", ("config.json", "model.safetensors"))
    assert resolve_head("my-head") == head
    assert resolve_head("whisper-base-eagle").name == "whisper-base-eagle"  # shipped with specli
    (head / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"EAGLE head 'my-head' not found offline.*lacks model\.safetensors"):
        resolve_head("my-head")
