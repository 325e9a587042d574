"""Every third-party module that specli's code imports is declared in pyproject.toml (core or an extra)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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


def _imported_modules() -> dict[str, set[str]]:
    """Top-level module -> files importing it (absolute imports, lazy ones inside functions included)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "specli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "specli" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_is_declared():
    distributions = importlib.metadata.packages_distributions()
    declared = _declared()
    missing = {}
    for module, files in _imported_modules().items():
        # the distribution that provides the module (yaml -> PyYAML); an uninstalled one by its own name
        dists = {_canonical(d) for d in distributions.get(module, [module])}
        if not dists & declared:
            missing[module] = sorted(files)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_the_check_sees_lazy_imports_and_maps_modules_to_distributions():
    modules = _imported_modules()
    assert "huggingface_hub" in modules and "jiwer" in modules  # imported inside functions
    assert {"torch", "numpy", "click"} <= set(modules)
    assert _requirement_name("huggingface-hub>=0.23") == "huggingface-hub"
    assert _requirement_name("triton>=3.0; platform_system == 'Linux'") == "triton"
    assert "PyYAML" in importlib.metadata.packages_distributions()["yaml"]
