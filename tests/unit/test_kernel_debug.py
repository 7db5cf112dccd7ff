"""Kernels can be debugged and misuse never passes silently (simulate: the same runner as the tiles').

A kernel's print reaches the caller labelled by tile; its exception carries the kernel's own line and the
tile; a collective that not every tile joins, a message never received, a block larger than a core's SRAM,
a send into a dead core despite where= and a kernel that returns a value each raise an error naming the rule.
"""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Coord, MeshSpec
from waferrt.core.spec import TINY
from waferrt.fabric import BlockTooLarge, Context, KernelMisuse, NotSpmd, simulate
from waferrt.fabric.comm import Span
from waferrt.fabric.debug import KernelFailed
from waferrt.fabric.spmd import run_kernel
from waferrt.faults import CoreFailed
from waferrt.faults.faultmap import FaultMap

MESHES = [MeshSpec(4, 2, 2, 2), MeshSpec(2, 4, 2, 2), MeshSpec(6, 3, 2, 3)]


def _x(mesh):
    return np.arange(mesh.width * mesh.height, dtype=np.float32).reshape(mesh.height, mesh.width, 1)


def _first_tile(ctx) -> bool:
    return ctx.local.x0 == 0 and ctx.local.y0 == 0


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_print_in_a_kernel_reaches_the_caller_labelled_by_tile(mesh, capsys):
    def kernel(ctx, x):
        print("row", ctx.local.y0, "col", ctx.local.x0)
        ctx.log("done")
        return x

    simulate(mesh, TINY, mesh.region, kernel, x=_x(mesh))
    lines = capsys.readouterr().out.splitlines()
    for t in mesh.tiles():
        r = mesh.tile_region(t)
        assert f"[{t}] row {r.y0} col {r.x0}" in lines and f"[{t}] done" in lines
    assert len(lines) == 2 * len(mesh.tiles())


def test_an_exception_carries_the_kernels_line_and_the_tile():
    mesh = MeshSpec(4, 2, 2, 2)

    def kernel(ctx, x):
        y = ctx.shift(x, "x")
        if not _first_tile(ctx):
            y = y.reshape(3, 3)  # the line the error must name
        return y

    with pytest.raises(ValueError, match="cannot reshape") as e:
        simulate(mesh, TINY, mesh.region, kernel, x=_x(mesh), timeout=5)
    assert e.value.tile == mesh.tiles()[1] and e.value.kernel_site.file == __file__
    assert e.value.kernel_site.code == "y = y.reshape(3, 3)  # the line the error must name"
    assert any(f"{__file__}:{e.value.kernel_site.line}" in n and "tile(1,0)" in n for n in e.value.__notes__)


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_a_shift_that_only_the_first_tile_runs_is_not_spmd(mesh):
    def kernel(ctx, x):
        return ctx.shift(x, "x") if _first_tile(ctx) else x

    with pytest.raises(NotSpmd, match=r"same primitives in the same order \(SPMD\)"):
        simulate(mesh, TINY, mesh.region, kernel, x=_x(mesh), timeout=5)


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_a_collective_that_only_the_other_tiles_run_is_not_spmd(mesh):
    def kernel(ctx, x):
        return x if _first_tile(ctx) else ctx.allreduce(x, "y" if mesh.width == 2 else "x")

    # which tile sees it first depends on where the collective's data flows: the one left with a message no
    # primitive took, or the one that waited for a neighbour that had ended -- both name the SPMD rule
    with pytest.raises(NotSpmd, match=r"no primitive here received \('sim:[xy]1'|"
                                      r"ended the kernel after 0 primitive\(s\), without it"):
        simulate(mesh, TINY, mesh.region, kernel, x=_x(mesh), timeout=5)


def test_a_message_never_received_is_named():
    mesh = MeshSpec(4, 1, 2, 1)

    def kernel(ctx, x):  # tile(0,0) sends East in a shift that tile(1,0) never runs
        if _first_tile(ctx):
            ctx.shift(x, "x")
        else:
            ctx.shift(x, "x", -1)
        return x

    with pytest.raises(NotSpmd, match=r"no primitive here received|parted at primitive 1"):
        simulate(mesh, TINY, mesh.region, kernel, x=_x(mesh), timeout=5)


def test_a_block_larger_than_a_cores_sram_is_refused_where_it_is_sent():
    mesh = MeshSpec(4, 2, 2, 2)
    big = TINY.sram_bytes // 4 + 1  # float32 values: one more than a core holds

    def kernel(ctx, x):
        return ctx.allreduce(np.zeros(ctx.shape + (big,), np.float32), "x")[..., :1]

    with pytest.raises(BlockTooLarge, match=rf"ctx.allreduce along x at {__file__}:\d+.*{4 * big:,} bytes.*"
                                            rf"{TINY.sram_bytes:,} bytes a core has free on tiny"):
        simulate(mesh, TINY, mesh.region, kernel, x=_x(mesh), timeout=5)


def test_a_send_into_a_dead_core_despite_where_names_sender_and_receiver():
    mesh = MeshSpec(4, 2, 2, 2)
    dead = FaultMap(frozenset({Coord(2, 0)}))
    with pytest.raises(CoreFailed, match=r"core \(x=2, y=0\) is dead \(needed by ctx.send E \(where=\) from core "
                                         r"\(x=1, y=0\), which sends to it"):
        simulate(mesh, TINY, mesh.region, lambda ctx, x: ctx.send(x, 1, 0, where=ctx.live), x=_x(mesh),
                 timeout=5, faults=dead)
    out, _ = simulate(mesh, TINY, mesh.region, lambda ctx, x: ctx.send(x, 1, 0, where=ctx.can_send(1, 0)),
                      x=_x(mesh) + 1, faults=dead)
    assert out[0, :, 0].tolist() == [0, 1, 0, 0]  # (1,0) left out: it faces the dead core; (2,0) sends nothing


def test_a_kernel_that_returns_a_value_is_misuse():
    mesh = MeshSpec(2, 2, 2, 2)
    ctx = Context(Span.of(mesh.region), Ledger(TINY), {})
    with pytest.raises(KernelFailed) as e:
        run_kernel(ctx, lambda ctx: np.zeros(3), {}, mesh.tiles()[0])
    err = e.value.unwrap()
    assert isinstance(err, KernelMisuse) and "returned a ndarray: a kernel returns nothing" in str(err)
    assert "ctx.store(name, value)" in str(err) and err.tile == mesh.tiles()[0]


def test_the_same_primitives_from_different_lines_are_spmd():
    mesh = MeshSpec(4, 2, 2, 2)

    def kernel(ctx, x):
        if _first_tile(ctx):
            return ctx.shift(x, "x")
        return ctx.shift(x, "x")  # another line, the same primitive: fine

    out, _ = simulate(mesh, TINY, mesh.region, kernel, x=_x(mesh) + 1)
    assert out[0, :, 0].tolist() == [0, 1, 2, 3]


def test_tiles_that_part_are_named_with_both_lines():
    mesh = MeshSpec(4, 1, 2, 1)

    def kernel(ctx, x):
        y = ctx.allreduce(x, "y")  # a line of one core along y: nothing moves, but every tile must run it
        return y if _first_tile(ctx) else ctx.allreduce(y, "y")

    here = rf"(nothing more|ctx.allreduce along y at {__file__}:\d+)"
    with pytest.raises(NotSpmd, match=rf"parted at primitive 2: here {here}"):
        simulate(mesh, TINY, mesh.region, kernel, x=_x(mesh), timeout=5)
