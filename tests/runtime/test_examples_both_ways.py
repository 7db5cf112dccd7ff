"""The examples print the same results and modelled costs on the Ray wafer and on the local one.

Each example's ``main(backend)`` runs twice, on Ray (tile actors, the session's Ray) and locally (the same
tiles in this process); what they print must be equal line for line, but for wall-clock figures (the
emulation's milliseconds, the fault log's seconds) and the trace file's temporary path.
"""

from __future__ import annotations

import re

import pytest
from example_modules import example


def _modelled(out: str) -> list[str]:
    """What a run printed, without what the wall clock decides."""
    lines = []
    for line in out.splitlines():
        line = re.sub(r"emulated in [\d.]+ ms", "emulated in T ms", line)
        line = re.sub(r"\S*stencil-trace\.json", "TRACE", line)
        if re.match(r"\s+\d+ \w+ ", line):  # a fault log row: its seconds columns are wall clock
            line = re.sub(r"\b\d+\.\d\d\b", "T", line)
        lines.append(line)
    return lines


@pytest.mark.parametrize("name", ["allreduce", "custom_kernel", "fault_tolerant_allreduce"])
def test_an_example_prints_the_same_on_ray_and_locally(name, ray_session, capsys):
    module = example(name)
    outs = {}
    for backend in ("local", "ray"):
        assert module.main(backend) == 0
        outs[backend] = _modelled(capsys.readouterr().out)
    assert outs["local"] == outs["ray"]
    assert any("cycles" in line for line in outs["ray"])
