"""Read HyperPyYAML files (CosyVoice's ``cosyvoice2.yaml`` / ``cosyvoice3.yaml``) without running them.

HyperPyYAML tags name Python objects to build (``!new:pkg.Class``), functions to bind
(``!name:pkg.fn``), calls to make (``!apply:pkg.fn``), and references (``!ref <key>``, with
arithmetic such as ``!ref <a> * 2``). This reader parses the file with PyYAML's *safe* loader, keeps
every other ``!`` tag (``!new:``, ``!name:``, ``!apply:``, ``!PLACEHOLDER``, and tags it does not know)
as a plain :class:`Tagged` record (its kind, dotted target and arguments) and never imports or calls
anything: an entry is data until a loader asks for it and decides whether it can use it. ``!ref`` is
resolved against the file's own keys; over numbers its arithmetic is evaluated (``+ - * / // % **``
and parentheses only), over strings it interpolates
(``!ref <dir>/file``).
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

_REF = re.compile(r"<([^<>]+)>")


@dataclass(frozen=True)
class Tagged:
    """A HyperPyYAML object tag, recorded and never built."""

    kind: str  # "new" | "name" | "apply" | ... (the text between "!" and ":", as written)
    target: str  # dotted path after the colon ("" for tags without one)
    value: Any  # the node's arguments: a dict, a list, a scalar, or None

    def get(self, key: str, default: Any = None) -> Any:
        """A keyword argument of a ``!new:`` / ``!name:`` node (``default`` when absent)."""
        return self.value.get(key, default) if isinstance(self.value, dict) else default


@dataclass(frozen=True)
class _Ref:
    expr: str  # the text after !ref (or !copy)


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader plus HyperPyYAML's tags as inert records."""


def _construct(loader: _Loader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    text = loader.construct_scalar(node)
    return yaml.safe_load(text) if text else None  # typed like an untagged scalar


def _tagged(loader: _Loader, suffix: str, node: yaml.Node) -> Any:
    kind, _, target = suffix.partition(":")
    if kind in ("ref", "copy"):
        return _Ref(str(loader.construct_scalar(node)))
    return Tagged(kind, target, _construct(loader, node))  # any other tag: an inert record


_Loader.add_multi_constructor("!", _tagged)


def read_hyperpyyaml(path: str | Path) -> dict[str, Any]:
    """The file's top-level mapping with every ``!ref`` resolved and every object tag a :class:`Tagged`."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not a readable HyperPyYAML file: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level is not a mapping")
    return _resolve(data, data, ())


def _resolve(node: Any, root: dict, seen: tuple[str, ...]) -> Any:
    if isinstance(node, _Ref):
        return _resolve_ref(node.expr, root, seen)
    if isinstance(node, dict):
        return {k: _resolve(v, root, seen) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, root, seen) for v in node]
    if isinstance(node, Tagged):
        return Tagged(node.kind, node.target, _resolve(node.value, root, seen))
    return node


def _lookup(key: str, root: dict, seen: tuple[str, ...]) -> Any:
    if key in seen:
        raise ValueError(f"circular !ref <{key}>")
    node: Any = root
    for part in re.split(r"[.\[\]]+", key.strip()):
        if not part:
            continue
        if isinstance(node, Tagged):
            node = node.value
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ValueError(f"!ref <{key}>: no such key")
    return _resolve(node, root, (*seen, key))


def _resolve_ref(expr: str, root: dict, seen: tuple[str, ...]) -> Any:
    expr = expr.strip()
    whole = _REF.fullmatch(expr)
    if whole:
        return _lookup(whole.group(1), root, seen)
    values: list[Any] = []

    def sub(m: re.Match) -> str:
        values.append(_lookup(m.group(1), root, seen))
        return f"_v{len(values) - 1}"

    py = _REF.sub(sub, expr)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return _REF.sub(lambda m: str(_lookup(m.group(1), root, seen)), expr)  # string interpolation
    try:
        tree = ast.parse(py, mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"!ref {expr!r}: not an arithmetic expression") from exc
    return _arith(tree, values, expr)


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


def _arith(node: ast.AST, values: list[Any], expr: str) -> Any:
    """Evaluate numbers, references and + - * / // % ** (nothing else) of a !ref expression."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name) and re.fullmatch(r"_v\d+", node.id):
        return values[int(node.id[2:])]
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left, values, expr), _arith(node.right, values, expr))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_arith(node.operand, values, expr)
    raise ValueError(f"!ref {expr!r}: only numbers, references and arithmetic are supported")


def whole_number(value: object, key: str) -> int:
    """A yaml value that must be a whole number (``int(2.5)`` and ``int(True)`` would pass silently); ValueError
    naming ``key`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be a whole number, got {value!r}")
    return value
