"""Fresh-machine truth: every third-party module that specli/, the shipped scripts, the benchmarks and the tests
import is declared in pyproject.toml (core or an extra), so a fresh virtual environment has it (.ci/run installs
into one); nothing left on a machine may stand in for a requirement."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("specli", "scripts", "benchmarks", "tests")  # every Python file the repository ships or runs
# import names whose distribution is not their own name, for when it is not installed here to be asked
NOT_INSTALLED_HERE = {"piper": "piper-tts"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return _canonical(re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0])


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    return {_requirement_name(r) for r in requirements}


@functools.cache
def _local_modules() -> frozenset[str]:
    """Module names the repository provides itself: the package, the voice's build (``scripts.voice``, run from the
    repository), and the modules and packages of the folders its scripts, benchmarks and tests run with on
    sys.path."""
    folders = ("scripts", "benchmarks", "tests")
    modules = {p.stem for f in folders for p in (ROOT / f).glob("*.py")}
    packages = {p.parent.name for f in folders for p in (ROOT / f).glob("*/__init__.py")}  # e.g. tests/toy_asr
    return frozenset({"specli", "scripts"} | modules | packages)


def _imported_modules() -> dict[str, set[str]]:
    """Top-level module -> files importing it (absolute imports, lazy ones inside functions included)."""
    found: dict[str, set[str]] = {}
    for path in sorted(p for root in SOURCES for p in (ROOT / root).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in _local_modules() and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_is_declared():
    distributions = importlib.metadata.packages_distributions()
    declared = _declared()
    missing = {}
    for module, files in _imported_modules().items():
        # the distribution that provides the module (yaml -> PyYAML); an uninstalled one by its own name
        dists = {_canonical(d) for d in distributions.get(module, [NOT_INSTALLED_HERE.get(module, module)])}
        if not dists & declared:
            missing[module] = sorted(files)[:3]
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_the_check_sees_lazy_imports_and_maps_modules_to_distributions():
    modules = _imported_modules()
    assert "huggingface_hub" in modules and "jiwer" in modules  # imported inside functions
    assert {"torch", "numpy", "click"} <= set(modules)
    assert _requirement_name("huggingface-hub>=0.23") == "huggingface-hub"
    assert _requirement_name("triton>=3.0; platform_system == 'Linux'") == "triton"
    assert "PyYAML" in importlib.metadata.packages_distributions()["yaml"]


def test_the_check_reads_scripts_benchmarks_and_tests_and_knows_local_modules():
    modules = _imported_modules()
    assert "scripts/voice/tokenizer/graph.py" in modules["scipy"]  # once undeclared: a fresh venv failed to collect
    assert "tests/flow_cv2_reference.py" in modules["einops"]
    assert "scripts/make_distill_audio.py" in modules["piper"] and "pytest" in modules
    assert not {"specli", "scripts", "conftest", "tiny_models"} & set(modules)
    assert "yaml" in modules  # third-party, though specli/models/cosyvoice/yaml.py has its name
