"""The Ray-free wafer: ``Wafer(..., backend="local")`` runs the same tiles in this process.

The examples run on it, the plugin offers it (``--wafer-backend local``, ``@pytest.mark.wafer(backend=...)``)
and the example fault suite passes on it with the outcomes it has on Ray, without loading Ray or pyzmq. The
examples import only the public API. (tests/runtime/test_examples_both_ways.py holds local and Ray equal.)
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from example_modules import example

import waferrt
from waferrt.faults import TileCrash

pytest_plugins = ["pytester"]

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ["allreduce", "custom_kernel", "fault_tolerant_allreduce"]
PUBLIC = ["waferrt", "waferrt.faults", "waferrt.model", "waferrt.scheduler", "waferrt.serving"]

NO_RAY = """
import sys
import numpy as np
import waferrt
with waferrt.Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2), backend="local") as w:
    w.dsm.alloc("x", (2, 4))
    w.dsm.put("x", np.ones((2, 4), np.float32))
    w.run(lambda ctx: ctx.store("x", ctx.allreduce(ctx.load("x"), "x")))
    assert (w.dsm.get("x") == 4).all()
print(sorted(m for m in ("ray", "zmq") if m in sys.modules))
"""


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_examples_pass_on_the_local_wafer(name, capsys):
    assert example(name).main("local") == 0
    assert "WRONG" not in capsys.readouterr().out


def test_the_local_wafer_loads_neither_ray_nor_pyzmq():
    proc = subprocess.run([sys.executable, "-c", NO_RAY], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_a_fault_that_ends_a_process_needs_ray():
    with waferrt.Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2), backend="local") as w:
        with pytest.raises(ValueError, match="TileCrash ends a tile's process.*backend='ray'"):
            w.inject(TileCrash((0, 0)))
    with pytest.raises(ValueError, match="backend is 'ray'.*or 'local'"):
        waferrt.Wafer(backend="threads")


def test_the_example_fault_suite_passes_without_ray(pytester):
    result = pytester.runpytest_inprocess(str(ROOT / "examples" / "fault_suite"), "--fault-seed", "1",
                                          "--wafer-backend", "local", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_the_marker_picks_the_backend(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.wafer(mesh=(4, 4), tile=(2, 2), backend="local")
        def test_local(wafer):
            assert wafer.backend == "local" and len(wafer.tiles) == 4
    """)
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def _waferrt_imports(path: pathlib.Path) -> list[tuple[str, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("waferrt"):
            out += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names if a.name.startswith("waferrt")]
    return out


@pytest.mark.parametrize("path", sorted((ROOT / "examples").rglob("*.py")), ids=lambda p: p.name)
def test_the_examples_import_only_the_public_api(path):
    for module, name in _waferrt_imports(path):
        assert module in PUBLIC, f"{path.name} imports {module}, not one of the public packages {PUBLIC}"
        assert not name or name in importlib.import_module(module).__all__, f"{path.name}: {module}.{name}"


def test_the_public_packages_export_what_they_list():
    for module in PUBLIC:
        m = importlib.import_module(module)
        assert all(hasattr(m, n) for n in m.__all__), module
    assert waferrt.Context.__module__ == "waferrt.fabric.kernel" and isinstance(waferrt.Cost(), waferrt.Cost)
    np.testing.assert_equal(waferrt.Coord(3, 4), (3, 4))
