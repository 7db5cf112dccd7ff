"""The floors of the code stay floors: every import of every module (those inside functions too) goes to
its own floor or one below, only the actor layer and the runtime touch Ray/pyzmq, only the model's file
readers touch gguf/tokenizers, and no two modules import each other, however indirectly.

The modules are listed from the package tree on disk (a renamed or new module is checked, never skipped).
A second check imports the pure packages in a fresh interpreter and looks at what got loaded.
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOPS = {"waferrt": "waferrt", "actors": "waferrt.actors", "scheduler": "waferrt.scheduler"}

# floor -> the floors its modules may import (besides their own), stated for each floor: the allowed-imports
# map (no order of entries matters). The pure floors, then the joins (each may use the joins before it).
PURE = {"core", "model", "faults", "fabric", "kernels", "decode", "scheduler", "estimator", "serving", "training",
        "tiles"}
ALLOWED = {
    "core": set(),
    "model": set(),
    "faults": {"core"},
    "fabric": {"core", "faults"},
    "kernels": {"core", "faults", "fabric"},  # kernels of the programming model (MeshGEMM, SUMMA, Cannon, ...)
    "decode": {"core", "faults", "fabric", "kernels", "model"},
    "scheduler": {"core", "model", "decode"},  # emulator-scale planning: placements, their speed, repair
    "estimator": {"core", "model", "fabric", "decode", "scheduler"},  # the whole wafer on paper
    "training": {"core", "faults", "fabric", "kernels", "model", "decode"},  # AdamW, corpus, store, step; mesh backward
    "serving": {"core", "faults", "fabric", "kernels", "model", "decode", "scheduler"},
    "tiles": {"core", "faults", "fabric", "model", "decode"},  # a tile's cores: SRAM, DSM, kernels, decode program
    "actors": PURE,  # the tiles run the serving loop
    "inject": PURE | {"actors"},  # faults into the tiles (the Wafer's fault session)
    "dsm": PURE | {"actors", "inject"},  # the Wafer's named tensors in the tiles
    "localtiles": PURE | {"actors", "inject", "dsm"},  # the runtime's Ray-free tiles
    "wafer_faults": PURE | {"actors", "inject", "dsm", "localtiles"},  # the Wafer's fault methods (a mixin)
    "runtime": PURE | {"actors", "inject", "dsm", "localtiles", "wafer_faults"},
    "recovery": PURE | {"actors", "inject", "dsm", "localtiles", "wafer_faults", "runtime"},  # a decode's recovery
    "llm": PURE | {"actors", "inject", "dsm", "localtiles", "wafer_faults", "runtime", "recovery"},  # WaferLLM
    "cli": PURE | {"actors", "inject", "dsm", "localtiles", "wafer_faults", "runtime", "recovery", "llm"},
    "server": PURE | {"actors", "inject", "dsm", "localtiles", "wafer_faults", "runtime", "recovery", "llm",
               "cli"},  # the HTTP server (waferrt serve): the web stack and sockets
    "testing": PURE | {"actors", "inject", "dsm", "localtiles", "wafer_faults", "runtime", "recovery", "llm",
                       "cli"},  # the pytest plugin
}
FLOORS = {f"waferrt.{floor}": {f"waferrt.{m}" for m in may} for floor, may in ALLOWED.items()}
HEAVY = {  # third-party package -> the only modules that may import it
    "ray": ("waferrt.actors", "waferrt.runtime"),
    "zmq": ("waferrt.actors",),
    "gguf": ("waferrt.model.gguf_loader", "waferrt.model.gguf_writer"),
    "tokenizers": ("waferrt.model.tokenizer",),
    **dict.fromkeys(WEB := ("starlette", "uvicorn", "prometheus_client"), ("waferrt.server",)),  # the web stack
    "matplotlib": ("waferrt.cli.draw", "waferrt.cli.heatmap", "waferrt.cli.sweep_draw", "waferrt.cli.train_draw"),
}
PURE_PACKAGES = ["waferrt", "waferrt.core", "waferrt.faults", "waferrt.fabric", "waferrt.model", "waferrt.decode",
                 "waferrt.scheduler", "waferrt.estimator", "waferrt.serving", "waferrt.cli",
                 "waferrt.training", "waferrt.tiles"]


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for top, name in TOPS.items():
        for f in sorted((ROOT / top).rglob("*.py")):
            rel = f.relative_to(ROOT / top).with_suffix("").parts
            rel = rel[:-1] if rel[-1] == "__init__" else rel
            out[".".join((name, *rel))] = f
    return out


MODULES = _modules()
PACKAGES = {m for m, f in MODULES.items() if f.name == "__init__.py"}


def _imports(module: str) -> set[str]:
    """Every module name `module` imports anywhere in its source, relative imports resolved; a name
    imported from a package that is one of its submodules counts as that submodule."""
    tree = ast.parse(MODULES[module].read_text())
    base_parts = module.split(".") if module in PACKAGES else module.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(base_parts[:len(base_parts) - node.level + 1] + ([base] if base else []))
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names}
    return out


def _floor(module: str) -> str | None:
    return next((f for f in FLOORS if module == f or module.startswith(f + ".")), None)


def _ours(name: str) -> str | None:
    """The project module that an imported name lives in (None: a third-party or standard module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def test_the_map_names_only_floors_and_no_floor_imports_itself_back():
    """The allowed-imports map is a partial order: every name in it is a floor, and no two floors may import
    each other (so the floors stack, whatever order the map lists them in)."""
    assert all(may <= set(ALLOWED) for may in ALLOWED.values())
    assert [(a, b) for a in ALLOWED for b in ALLOWED[a] if a in ALLOWED[b]] == []


def test_the_tree_has_every_floor_and_no_loose_modules():
    assert {_floor(m) for m in MODULES} - {None} == set(FLOORS)
    loose = [m for m in MODULES if _floor(m) is None and m != "waferrt"]
    assert loose == [], f"modules outside every floor: {loose}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "waferrt"))
def test_imports_stay_on_their_floor_or_below(module):
    floor, wrong = _floor(module), []
    for name in _imports(module):
        target = _ours(name)
        if target is not None and target != "waferrt":
            if _floor(target) not in FLOORS[floor] | {floor}:
                wrong.append(f"{name} (floor {_floor(target)})")
        top = name.split(".")[0]
        if top in HEAVY and not module.startswith(HEAVY[top]):
            wrong.append(f"{name} (only {', '.join(HEAVY[top])} may import {top})")
    assert wrong == [], f"{module} (floor {floor}) imports {wrong}"


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycles():
    edges = {m: {t for t in map(_ours, _imports(m)) if t and t != m} for m in MODULES}
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail: a -> b -> c -> a is found, a lone self-loop-free chain is not."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(%r)))))
"""


def _loaded(*modules: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE % json.dumps(sorted(HEAVY)), *modules],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_the_pure_packages_loads_no_ray_zmq_gguf_or_tokenizers():
    assert _loaded(*PURE_PACKAGES) == []


def test_the_pytest_plugin_loads_nothing_heavy_when_pytest_loads_it():
    """Installed, the plugin loads in every pytest session: Ray comes only with its fixtures."""
    assert _loaded("waferrt.testing.plugin") == []


def test_the_probe_sees_heavy_imports():
    """The check above can fail: the actor layer loads Ray and pyzmq, the model's readers gguf/tokenizers
    (matplotlib loads only when a drawing function of the CLI runs, never at import)."""
    assert _loaded("waferrt.actors.remote", "waferrt.actors.fabric", "waferrt.model.gguf_loader") == \
        sorted(set(HEAVY) - {"matplotlib", *WEB})
    assert set(_loaded("waferrt.server.app", "waferrt.server.metrics")) >= {"starlette", "prometheus_client"}
