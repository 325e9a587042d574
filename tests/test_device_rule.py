"""Static rule: engine code never creates a tensor without saying on which device.

Every call of a torch tensor factory (``torch.tensor``, ``zeros``, ``arange``, ``rand``, ... and
``torch.Generator``) inside the decoding code (``specli/{core,models,asr,tts}/**``, not the acoustic stages) passes ``device=``; ``torch.*_like`` and
``x.new_*`` follow their source tensor and are allowed, and so is a factory whose result goes straight
into ``nn.Parameter(...)`` (a module's parameters move with ``module.to(device)``). A factory without a
device silently builds a CPU tensor, which on CUDA means a host-to-device copy inside the decode step (or
a device mismatch).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SPECLI = Path(__file__).resolve().parent.parent / "specli"
# the decoding code: the core, the model families and the two pipelines (the acoustic stages build their
# buffers at load time and move with module.to(device))
DECODING = [SPECLI / "core", SPECLI / "models", SPECLI / "asr", SPECLI / "tts"]
EXEMPT = SPECLI / "tts" / "acoustic"

FACTORIES = frozenset({
    "tensor", "as_tensor", "asarray", "zeros", "ones", "empty", "full", "arange", "range", "rand", "randn",
    "randint", "randperm", "linspace", "logspace", "eye", "empty_strided", "scalar_tensor", "tril_indices",
    "triu_indices", "sparse_coo_tensor", "Generator",
})


def _torch_aliases(tree: ast.Module) -> set[str]:
    """Names bound to the torch module in a file (``import torch``, ``import torch as th``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.asname or a.name for a in node.names if a.name == "torch")
    return names


def _factory_names(tree: ast.Module) -> set[str]:
    """Factories imported by name (``from torch import zeros``)."""
    return {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module == "torch" for a in node.names if a.name in FACTORIES}


def _is_parameter(func: ast.expr) -> bool:
    """``nn.Parameter`` / ``torch.nn.Parameter`` / ``Parameter``."""
    return (isinstance(func, ast.Attribute) and func.attr == "Parameter") or (
        isinstance(func, ast.Name) and func.id == "Parameter")


def violations(source: str, filename: str = "<string>") -> list[str]:
    """``file:line: torch.<factory>`` for each factory call without ``device=``."""
    tree = ast.parse(source, filename)
    aliases, direct = _torch_aliases(tree), _factory_names(tree)
    in_parameter = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call) and _is_parameter(node.func)
                    for arg in node.args[:1]}
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in in_parameter:
            continue
        f = node.func
        name = None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in aliases:
            name = f.attr if f.attr in FACTORIES else None
        elif isinstance(f, ast.Name) and f.id in direct:
            name = f.id
        if name is None:
            continue
        if not any(k.arg == "device" or k.arg is None for k in node.keywords):  # **kwargs may carry it
            out.append(f"{filename}:{node.lineno}: torch.{name} without device=")
    return sorted(out, key=lambda s: int(s.split(":")[1]))


def test_engine_code_names_a_device_for_every_new_tensor():
    found = []
    for path in sorted(p for d in DECODING for p in d.rglob("*.py") if EXEMPT not in p.parents):
        found += violations(path.read_text(), str(path.relative_to(SPECLI.parent)))
    assert not found, "tensor factories without device= in engine code:\n" + "\n".join(found)


@pytest.mark.parametrize("src,bad", [
    ("import torch\nx = torch.zeros(3)\n", 1),
    ("import torch\nx = torch.zeros(3, device=y.device)\n", 0),
    ("import torch as th\nx = th.arange(4)\ng = th.Generator()\n", 2),
    ("from torch import randn\nx = randn(2)\n", 1),
    ("import torch\nx = torch.zeros_like(y)\nz = y.new_zeros(3)\nw = torch.full_like(y, 1)\n", 0),
    ("import torch\nx = torch.tensor([[1]], dtype=torch.long)\n", 1),
    ("import torch\nx = torch.tensor([[1]], **kw)\n", 0),
    ("import numpy as np\nx = np.zeros(3)\n", 0),
    ("import torch\nfrom torch import nn\nw = nn.Parameter(torch.ones(4))\nb = nn.Parameter(torch.ones(4) * 2)\n", 1),
])
def test_the_scan_catches_what_it_should(src, bad):
    assert len(violations(src)) == bad
