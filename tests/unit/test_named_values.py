"""Values that travel together are named (issue 31): no parameter of waferrt/, actors/ or scheduler/ is an
anonymous tuple.

A parameter is an anonymous tuple when it is annotated ``tuple[a, b]`` (a fixed-size tuple: its parts have no
names; ``tuple[X, ...]``, a sequence, is fine) or when one of the first statements of its function unpacks it
(``a, b = param``). The 86 found when the rule came in are all named now (``core.mesh.Extent`` for a size in
cores, frozen dataclasses and enums for the rest), so the test fails on any.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _docless(body: list[ast.stmt]) -> list[ast.stmt]:
    doc = body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    return body[1:] if doc else body


def tuple_params(path: pathlib.Path) -> set[str]:
    """`function param` of every anonymous tuple parameter in the module at `path`."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        params = {p.arg: p for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")}
        for name, p in params.items():
            ann = ast.unparse(p.annotation) if p.annotation else ""
            if ann.startswith(("tuple[", "Tuple[")) and "..." not in ann:
                out.add(f"{node.name} {name}")
        for st in _docless(node.body)[:3]:
            if not isinstance(st, ast.Assign):
                continue
            for target in st.targets:
                pairs = (zip(target.elts, st.value.elts) if isinstance(target, ast.Tuple)
                         and isinstance(st.value, ast.Tuple) else [(target, st.value)])
                for t, v in pairs:
                    if isinstance(t, ast.Tuple) and isinstance(v, ast.Name) and v.id in params:
                        out.add(f"{node.name} {v.id}")
    return out


def found() -> set[str]:
    return {f"{path.relative_to(ROOT)} {hit}" for top in ("waferrt", "actors", "scheduler")
            for path in sorted((ROOT / top).rglob("*.py")) for hit in tuple_params(path)}


def test_the_checker_finds_both_kinds(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f(a: tuple[int, int], b: tuple[int, ...], c):\n    '''doc'''\n    x, y = c\n"
                    "    z, (u, v) = 1, c\n    return x\n")
    assert tuple_params(path) == {"f a", "f c"}


def test_no_anonymous_tuple_parameters():
    now = found()
    assert not now, (f"anonymous tuple parameters: {sorted(now)}; pass a frozen dataclass (or an enum) whose "
                     "fields name the parts instead")
