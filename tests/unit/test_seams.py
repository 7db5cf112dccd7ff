"""Modules meet at public seams: no module uses another module's underscore names (issue 31).

The AST of every module of waferrt, actors/ and scheduler/ (listed from disk) is walked for
- ``from M import _x`` (M another module: its private name imported);
- ``m._x`` where ``m`` is a module the file imported (``import m``, ``from pkg import m``);
- ``obj._x`` on any object but ``self``/``cls`` when no code of the same module defines ``_x`` (a function,
  a class, an attribute assigned as ``self._x = ...``): another module's private reached through one of
  its objects.
Dunder names are public. The exceptions are listed below, each with its reason: the standard library's
documented underscore names, and Ray's internals, which only ``actors/rayinternals.py`` may touch.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOPS = {"waferrt": "waferrt", "actors": "waferrt.actors", "scheduler": "waferrt.scheduler"}
ALLOWED = {
    "os._exit",  # the documented exit without cleanup (a tile process that must die at once)
    "sys._getframe",  # the documented frame access (the kernel debugger's call site)
    "_make", "_replace", "_asdict", "_fields",  # a namedtuple's public API is underscored
    "args._run",  # the CLI's protocol (cli/__init__): each subcommand's set_defaults(_run=run), out of --help
}
RAY_INTERNALS = "waferrt.actors.rayinternals"  # the one module that may use ray._private / ray._raylet


def _modules() -> list[tuple[str, pathlib.Path]]:
    out = []
    for top, pkg in TOPS.items():
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = [p for p in path.relative_to(ROOT / top).with_suffix("").parts if p != "__init__"]
            out.append((".".join([pkg, *parts]), path))
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError, AttributeError):
        return False


def _own_names(tree: ast.Module) -> set[str]:
    """The private names this module defines: functions, classes, and attributes it assigns."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)  # a class body's `_x = ...`
    return {n for n in own if _private(n)}


def _source(module: str, path: pathlib.Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{node.module}" if node.module else base


def crossings(module: str, path: pathlib.Path) -> list[str]:
    """`line: what` of every use of another module's underscore name in this module."""
    tree = ast.parse(path.read_text(), str(path))
    modules, out = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                modules[a.asname or a.name.split(".")[0]] = a.name
                if any(_private(p) for p in a.name.split(".")) and module != RAY_INTERNALS:
                    out.append(f"{node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom):
            src = _source(module, path, node)
            for a in node.names:
                if _private(a.name) or (any(_private(p) for p in src.split(".")) and module != RAY_INTERNALS):
                    out.append(f"{node.lineno}: from {src} import {a.name}")
                elif _is_module(f"{src}.{a.name}"):
                    modules[a.asname or a.name] = f"{src}.{a.name}"
    own = _own_names(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)) or node.attr in ALLOWED:
            continue
        base = node.value
        if not isinstance(base, ast.Name) or base.id in ("self", "cls"):
            continue
        if f"{base.id}.{node.attr}" in ALLOWED or (base.id == "ray" and module == RAY_INTERNALS):
            continue
        if base.id in modules or node.attr not in own:
            out.append(f"{node.lineno}: {base.id}.{node.attr}")
    return out


def test_the_walk_sees_every_kind_of_crossing(tmp_path):
    """The checker itself: each kind of crossing is found, and what is allowed is not."""
    path = tmp_path / "m.py"
    path.write_text("import os\nfrom waferrt.core import cost\nfrom waferrt.core.arith import _x\n"
                    "from . import _y\n"
                    "class A:\n    def __init__(self):\n        self._mine = 1\n"
                    "    def f(self, other, obj):\n        return other._mine + obj._theirs + cost._z + self._w\n"
                    "def g():\n    os._exit(0)\n")
    found = {c.split(": ", 1)[1] for c in crossings("waferrt.core.m", path)}
    assert found == {"from waferrt.core.arith import _x", "from waferrt.core import _y", "obj._theirs", "cost._z"}


@pytest.mark.parametrize("module,path", _modules(), ids=lambda v: v if isinstance(v, str) else "")
def test_no_module_uses_another_modules_underscore_names(module, path):
    found = crossings(module, path)
    assert not found, (f"{path.relative_to(ROOT)} uses another module's underscore names: {found}; make what it "
                       "needs public in its owner (a name without the underscore) and call that")
