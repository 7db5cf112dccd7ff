"""The pure layers stay pure: importing them pulls in neither Ray nor pyzmq (checked in a fresh interpreter).

Layers 1-2 of the design (waferrt core, the model, the scheduler) must be usable and testable without Ray
or sockets; only waferrt.actors and waferrt.runtime/cli may join them.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

PURE = ["waferrt", "waferrt.mesh", "waferrt.layout", "waferrt.kernel", "waferrt.comm", "waferrt.cost",
        "waferrt.ledger", "waferrt.loopfabric", "waferrt.decode_layout", "waferrt.model", "waferrt.scheduler",
        "waferrt.cli"]
HEAVY = ("ray", "zmq")

PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})))
"""


@pytest.mark.parametrize("module", PURE)
def test_import_pulls_in_no_ray_or_zmq(module):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not written yet")
    proc = subprocess.run([sys.executable, "-c", PROBE.format(heavy=set(HEAVY)), module],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded == [], f"import {module} loaded {loaded}"


def test_the_probe_sees_heavy_imports():
    """The check above can fail: importing the runtime's actor layer does load Ray and pyzmq."""
    proc = subprocess.run([sys.executable, "-c", PROBE.format(heavy=set(HEAVY)), "waferrt.actors.remote",
                           "waferrt.actors.fabric"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {"ray", "zmq"} <= set(json.loads(proc.stdout.strip().splitlines()[-1]))
