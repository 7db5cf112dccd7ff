"""Kernels can be debugged through Ray: print reaches the driver labelled by tile, an exception carries the
kernel's line and the tile, misuse (a collective one tile skips, a kernel that returns a value) names the rule.

A 4x2 mesh in two tile actors of 2x2 cores, on the session's Ray; the same kernels run on the local wafer
(tests/unit/test_kernel_debug.py holds the details).
"""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.mesh import TileId
from waferrt.fabric import KernelMisuse, NotSpmd
from waferrt.runtime import Wafer


@pytest.fixture(scope="module")
def wafer(ray_session):
    with Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2)) as w:
        w.dsm.alloc("x", (2, 4))
        yield w


def _east(ctx) -> bool:
    return ctx.local.x0 > 0


def test_print_in_a_kernel_reaches_the_driver_labelled_by_tile(wafer, capsys):
    def hello(ctx):
        print("cores", ctx.shape)
        ctx.log("x0 =", ctx.local.x0)

    wafer.run(hello)
    out = capsys.readouterr().out.splitlines()
    assert out == ["[tile(0,0)] cores (2, 2)", "[tile(0,0)] x0 = 0", "[tile(1,0)] cores (2, 2)", "[tile(1,0)] x0 = 2"]


def test_an_exception_names_the_kernels_line_and_the_tile_and_keeps_its_type(wafer, capsys):
    def broken(ctx):
        print("before")
        x = ctx.shift(ctx.load("x"), "x")
        if _east(ctx):
            x = x[:, :, None] @ np.ones((3, 3))  # the line the error must name
        ctx.store("x", x)

    with pytest.raises(ValueError) as e:
        wafer.run(broken)
    assert e.value.tile == TileId(1, 0) and e.value.kernel_site.file == __file__
    assert "the line the error must name" in e.value.kernel_site.code
    assert any(f"{__file__}:{e.value.kernel_site.line}" in n for n in e.value.__notes__)
    assert "[tile(1,0)] before" in capsys.readouterr().out  # what it printed before it failed


def test_misuse_names_the_rule_through_ray(wafer):
    with pytest.raises(NotSpmd, match=r"same primitives in the same order \(SPMD\)"):
        wafer.run(lambda ctx: ctx.store("x", ctx.shift(ctx.load("x"), "x") if _east(ctx) else ctx.load("x")))
    with pytest.raises(KernelMisuse, match="returned a ndarray: a kernel returns nothing"):
        wafer.run(lambda ctx: ctx.load("x"))
    wafer.run(lambda ctx: ctx.store("x", ctx.allreduce(ctx.load("x"), "x")))  # the wafer works on
