"""The house's layering, read from the import statements of every module (no import runs):

* ``specli/core`` is model-neutral: it imports no model family, no pipeline, no command, no click or rich; it reads
  no attribute that only a family's target has (a target is read through the protocols of ``core/types.py``);
* ``specli/core``, ``specli/asr`` and ``specli/tts`` probe for no capability by name (``getattr(x, "name", None)`` /
  ``hasattr``): a capability is a protocol member with a default; ``PROBES_ALLOWED`` lists the few named reads left
  (yaml nodes, torch.ops kernels, plain-callable rules), each with its reason;
* ``specli/models`` sit below the pipelines: no ``asr``, ``tts``, ``commands``, ``bench``, ``distill``;
* ``specli/asr`` names only the speech-model protocol (``specli.models.speech``): it imports no model family
  (``specli.models.<family>``), its Whisper-only drafters (``specli/asr/drafters``) aside;
* only ``commands/`` and ``cli.py`` import click or rich;
* no import loop between specli modules, and no specli import inside a function to dodge one;
* one module (``specli/io/locate.py``) knows where models are kept: it alone names ``$SPECLI_MODELS_DIR`` or the
  Hugging Face cache's variables, and imports ``huggingface_hub``;
* one place maps a drafter kind to its class: the registry's registrants (``DRAFTER_REGISTRANTS``) register every
  kind and are the only modules that compare a drafter kind with a kind's name (presets, which validate what a
  kind needs, aside).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "specli"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


@cache
def _tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(), str(MODULES[name]))


def _targets(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement names (``from a import b``: ``a.b`` when that is a module, else ``a``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(name: str, top_level: bool) -> set[str]:
    """What ``name`` imports at module level (``top_level``), or anywhere else (in functions and classes);
    typing-only imports (``if TYPE_CHECKING:``) are neither."""
    found: set[str] = set()

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)) and nested != top_level:
                found.update(_targets(child))
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            visit(child, inner)

    visit(_tree(name), False)
    return found


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{name} imports {target}" for name in MODULES if name == package or name.startswith(package + ".")
                  for target in _imports(name, True) | _imports(name, False)
                  if any(target == f or target.startswith(f + ".") for f in forbidden))


def test_core_imports_no_model_family_pipeline_command_or_ui() -> None:
    forbidden = ("specli.models", "specli.asr", "specli.tts", "specli.commands", "specli.bench", "specli.distill",
                 "specli.cli", "click", "rich")
    assert _violations("specli.core", forbidden) == []


def _members(cls: ast.ClassDef) -> set[str]:
    """What a class defines: its methods and fields, and the attributes its methods set on ``self``."""
    names = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names |= {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return names | {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                    and isinstance(n.value, ast.Name) and n.value.id == "self"}


def _classes(package: str) -> list[ast.ClassDef]:
    return [n for name in MODULES if name.startswith(package + ".") for n in ast.walk(_tree(name))
            if isinstance(n, ast.ClassDef)]


#: names a family's target shares with what core legitimately reads them on: a tensor's dtype, a string's encode
NOT_FAMILY_NAMES = frozenset({"dtype", "encode"})


def _family_only_names() -> set[str]:
    """Members of the families' targets (the classes of specli/models with a ``score``) that no class of core defines
    (nor :data:`NOT_FAMILY_NAMES`): what only a family's target has."""
    targets = [c for c in _classes("specli.models") if "score" in _members(c)]
    assert {"CosyVoiceLM", "Qwen2Target", "AudioLMTarget", "WhisperTarget"} <= {c.name for c in targets}
    core = set().union(*map(_members, _classes("specli.core")))
    return set().union(*map(_members, targets)) - core - NOT_FAMILY_NAMES


def _probes(tree: ast.AST) -> list[tuple[int, str | None]]:
    """``getattr`` / ``hasattr`` calls: (line, the attribute's name when spelled, else None)."""
    return [(line, name) for line, name, _ in _probe_calls(tree)]


def _attribute_reads(tree: ast.AST, names: set[str]) -> list[str]:
    """``x.name`` and ``getattr(x, "name")`` for the ``names``."""
    found = [f"line {n.lineno}: .{n.attr}" for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in names]
    return found + [f"line {line}: getattr {name}" for line, name in _probes(tree) if name in names]


def test_core_reads_no_family_attribute() -> None:
    family = _family_only_names()
    assert {"qwen", "spec", "layout", "lm", "speech_embedding", "dims"} <= family  # CosyVoice's, the decoders'
    reads = {name: hits for name in MODULES if name.startswith("specli.core")
             and (hits := _attribute_reads(_tree(name), family))}
    assert reads == {}
    old = ast.parse('qwen = getattr(target, "qwen", target)\nmask = target.spec.fill\n')
    assert _attribute_reads(old, family) == ["line 2: .spec", "line 1: getattr qwen"]


#: the named probes (``getattr(x, "name", default)`` / ``hasattr(x, "name")``) left in core/, asr/ and tts/, each not a
#: capability a protocol could declare: (module, attribute) -> why it stays
PROBES_ALLOWED = {
    ("specli.core.logits", "with_logprobs"): "LogitRules is a call signature (any callable); Whisper's rule adds"
                                             " a fused log_softmax that a plain function cannot declare",
    ("specli.core.types", "draft_lengths"): "accumulate adds into any record with DecodeStats' counters (bench rows);"
                                            " only some keep the draft-length histogram",
    ("specli.tts.acoustic.flow", "target"): "a hyperpyyaml node's field (a yaml entry, not one of our objects)",
    ("specli.tts.acoustic.hift", "target"): "a hyperpyyaml node's field (a yaml entry, not one of our objects)",
    ("specli.tts.acoustic.hift", "value"): "a hyperpyyaml node's field (a yaml entry, not one of our objects)",
    ("specli.tts.acoustic.hift", "get"): "a yaml value that may be a mapping or a scalar",
    ("specli.tts.acoustic.hifigan", "value"): "a hyperpyyaml node's field (a yaml entry, not one of our objects)",
    ("specli.tts.acoustic.hifigan", "_convolution_pointwise"): "a torch.ops kernel this torch build may lack",
    ("specli.tts.acoustic.cfm", "value"): "a hyperpyyaml node's field (a yaml entry, not one of our objects)",
}


def _named_probes(tree: ast.AST) -> list[tuple[int, str]]:
    """Capability probes: ``getattr(x, "name", default)`` and ``hasattr(x, "name")`` with a spelled name (a getattr
    without a default reads a field that must be there; one by a computed name loops over known fields)."""
    return [(line, name) for line, name, call in _probe_calls(tree) if name is not None
            and (call.func.id == "hasattr" or len(call.args) > 2)]


def _probe_calls(tree: ast.AST) -> list[tuple[int, str | None, ast.Call]]:
    return [(n.lineno, n.args[1].value if isinstance(n.args[1], ast.Constant) else None, n) for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")
            and len(n.args) > 1]


@pytest.mark.parametrize("package", ["specli.core", "specli.asr", "specli.tts"])
def test_no_capability_probes_outside_the_allowed(package: str) -> None:
    """A capability is a protocol member with a default (core/drafters/base.Drafter's fork / batched /
    finish_window, models/speech.SpeechTarget's batch_target / moe_profile / experts, the Vocoder's source, the
    Estimator's row_segments), not a ``getattr`` probe."""
    found = sorted(f"{name} line {line}: {attr}" for name in MODULES if name.startswith(package + ".")
                   for line, attr in _named_probes(_tree(name)) if (name, attr) not in PROBES_ALLOWED)
    assert found == []


def test_the_probe_check_sees_a_probe() -> None:
    old = ast.parse('make = getattr(drafter, "fork", None)\nok = hasattr(t, "start_batch")\n'
                    'x = getattr(self, name)\ny = getattr(node, "dims")\n')
    assert _named_probes(old) == [(1, "fork"), (2, "start_batch")]
    allowed_modules = {name for name, _ in PROBES_ALLOWED}
    assert allowed_modules <= set(MODULES)
    # every allowed probe is still there (a stale entry would hide a new probe of the same name)
    assert {(name, attr) for name in allowed_modules for _, attr in _named_probes(_tree(name))} >= set(PROBES_ALLOWED)


def test_models_import_no_pipeline_or_command() -> None:
    forbidden = ("specli.asr", "specli.tts", "specli.commands", "specli.bench", "specli.distill", "specli.cli",
                 "click", "rich")
    assert _violations("specli.models", forbidden) == []


#: the model families: the packages of specli/models (each family is one)
FAMILY_PACKAGES = tuple(sorted({".".join(n.split(".")[:3]) for n in MODULES
                                if n.startswith("specli.models.") and MODULES[n].parent != ROOT / "models"}))


def test_asr_imports_no_model_family_outside_its_whisper_drafters() -> None:
    assert {"specli.models.whisper", "specli.models.qwen2_audio"} <= set(FAMILY_PACKAGES)
    found = [v for v in _violations("specli.asr", FAMILY_PACKAGES) if not v.startswith("specli.asr.drafters")]
    assert found == []


@pytest.mark.parametrize("package", ["specli.core", "specli.models", "specli.asr", "specli.tts", "specli.io",
                                     "specli.bench", "specli.distill", "specli.presets"])
def test_only_commands_import_click_or_rich(package: str) -> None:
    assert _violations(package, ("click", "rich")) == []


def test_no_specli_import_inside_functions() -> None:
    nested = sorted(f"{name} imports {t}" for name in MODULES for t in _imports(name, False) if t.startswith("specli"))
    assert nested == []


def test_no_import_loops() -> None:
    graph = {name: {t for t in _imports(name, True) if t in MODULES and t != name} for name in MODULES}
    # a package's __init__ importing its own submodules is not a loop through the package
    loops: list[list[str]] = []
    state: dict[str, int] = {}

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                loops.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert loops == []


#: the environment variables (and huggingface_hub constants) that say where models are kept
MODEL_PLACES = frozenset({"SPECLI_MODELS_DIR", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"})


def _names_model_places(tree: ast.AST) -> bool:
    """Whether code (not prose) names a model place: a string equal to one, an attribute or a name of one."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in MODEL_PLACES:
            return True
        if isinstance(node, ast.Attribute) and node.attr in MODEL_PLACES:
            return True
        if isinstance(node, ast.Name) and node.id in MODEL_PLACES:
            return True
    return False


def test_one_module_knows_where_models_are_kept() -> None:
    readers = {name for name in MODULES if _names_model_places(_tree(name))}
    hub = {name for name in MODULES
           if any(t.split(".")[0] == "huggingface_hub" for t in _imports(name, True) | _imports(name, False))}
    assert readers == {"specli.io.locate"} and hub == {"specli.io.locate"}


# the modules that register drafter kinds in specli.core.drafters.registry.DRAFTERS, one a pipeline
DRAFTER_REGISTRANTS = ("specli.asr.drafters.kinds", "specli.tts.drafters")


def _names_a_drafter(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "drafter") or (isinstance(node, ast.Attribute)
                                                                      and node.attr == "drafter")


def _kind_names(node: ast.AST) -> list[str]:
    """The drafter kind names a comparison operand spells ("none", no drafter, is not a kind)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str) and i.value != "none"]


def _kind_comparisons(tree: ast.AST) -> list[str]:
    """``drafter == "pool"`` / ``x.drafter in ("eagle3", "dflash")``...: a kind's name compared with a drafter."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_names_a_drafter(o) for o in operands):
                found += [f"line {node.lineno}: {k}" for o in operands for k in _kind_names(o)]
    return found


def test_one_place_maps_a_drafter_kind_to_its_class() -> None:
    outside = {name: hits for name in MODULES if name not in DRAFTER_REGISTRANTS
               and not name.startswith("specli.presets") and (hits := _kind_comparisons(_tree(name)))}
    assert outside == {}
    registering = {name for name in MODULES if "DRAFTERS.register(" in MODULES[name].read_text()}
    assert registering == set(DRAFTER_REGISTRANTS)
    assert _kind_comparisons(ast.parse('if p.drafter in ("model", "none"):\n    pass\n')) == ["line 1: model"]


def test_the_layering_test_sees_the_tree() -> None:
    """Guards the guard: it reads the real modules and would see a violation."""
    assert {"specli.core.speculative", "specli.models.whisper.target", "specli.asr.windows"} <= set(MODULES)
    assert "specli.core.job" in _imports("specli.core.speculative", True)
    source = "import click\ndef f():\n    from specli.asr import windows\n"
    tree = ast.parse(source)
    nested = [n for n in ast.walk(tree.body[1]) if isinstance(n, ast.ImportFrom)]
    assert _targets(nested[0]) == ["specli.asr.windows"]
    reads = ast.parse('import os\nmodels = os.environ.get("SPECLI_MODELS_DIR")\n"""$SPECLI_MODELS_DIR/x"""\n')
    assert _names_model_places(reads) and not _names_model_places(ast.parse('"""$SPECLI_MODELS_DIR/<name>"""\n'))
