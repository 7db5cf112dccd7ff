"""Every mesh primitive through the real path -- Ray tile actors, pyzmq links, the DSM -- against numpy.

One Wafer per mesh shape (module scope) on the session's Ray: 1x1, a 1xN row, an Nx1 column, a square mesh
in 2x2 tiles, a non-square mesh in 3x2-core tiles, and a mesh whose tile size does not divide it. The
exhaustive matrix of shapes runs without Ray in tests/unit/test_collectives.py; here a few kernels per
mesh check that the real fabric carries what the in-process one does, and that the costs it books equal
the closed forms.
"""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.cost import allreduce_cost, broadcast_cost, compute_cost, reduce_flops, shift_cost
from waferrt.core.mesh import Coord, MeshSpec
from waferrt.core.spec import TINY
from waferrt.runtime import Wafer

# (mesh w, h, tile w, h)
MESHES = {"1x1": (1, 1, 1, 1), "row6/2": (6, 1, 2, 1), "col6/2": (1, 6, 1, 2), "4x4/2x2": (4, 4, 2, 2),
          "6x4/3x2": (6, 4, 3, 2), "5x3/2x2": (5, 3, 2, 2)}
BLOCK = 5  # floats per core
AXES = {"x": 1, "y": 0}  # mesh axis -> axis of the (rows, cols, block) array


@pytest.fixture(scope="module", params=list(MESHES), ids=list(MESHES))
def wafer(request, ray_session):
    mesh = MeshSpec(*MESHES[request.param])
    x = np.random.default_rng(7).standard_normal((mesh.height, mesh.width, BLOCK)).astype(np.float32)
    with Wafer(spec=TINY, mesh=mesh) as w:
        for name in ("x", "y"):
            w.dsm.alloc(name, x.shape, split=("y", "x", None))
        w.dsm.put("x", x)
        w.x = x  # the host copy, for the checks
        yield w


def run_on_x(wafer: Wafer, fn, **args) -> tuple[np.ndarray, dict]:
    """y = fn(ctx, blocks of x) on every core; returns (y from the DSM, cost per primitive)."""

    def kernel(ctx, **kw):
        ctx.store("y", fn(ctx, ctx.load("x"), **kw))

    cost = wafer.run(kernel, **args)
    return wafer.dsm.get("y"), cost


@pytest.mark.parametrize("algo", ["ktree", "chain", "ring", "pipeline"])
def test_allreduce_matches_numpy_and_closed_form(wafer, algo):
    x, h = wafer.x, wafer.mesh.height
    for axis, ax in AXES.items():
        for op, ref_fn in (("sum", np.sum), ("max", np.max)):
            y, cost = run_on_x(wafer, lambda ctx, a, axis, op: ctx.allreduce(a, axis, algo, 2, op),
                               axis=axis, op=op)
            ref = np.broadcast_to(ref_fn(x, axis=ax, keepdims=True), x.shape)
            np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5, err_msg=f"{algo} {op} along {axis}")
        if axis == "x" and wafer.mesh.width > 1:
            n = wafer.mesh.width  # the context books the busiest core's reductions too
            got = cost[f"allreduce.{algo}"]
            want = allreduce_cost(TINY, algo, n, 4 * BLOCK) + compute_cost(TINY, reduce_flops(algo, n, BLOCK))
            assert (got.hops, got.stages, got.cycles) == (want.hops, want.stages, want.cycles)
            # the closed form is for one line of cores; every row of the mesh is such a line
            assert (got.link_bytes, got.messages) == (h * want.link_bytes, h * want.messages)


@pytest.mark.parametrize("wrap", [False, True], ids=["nowrap", "wrap"])
def test_shift_matches_numpy_and_closed_form(wafer, wrap):
    x = wafer.x
    for axis, ax in AXES.items():
        for dist in (1, -1):
            y, cost = run_on_x(wafer, lambda ctx, a, axis, dist: ctx.shift(a, axis, dist, wrap),
                               axis=axis, dist=dist)
            ref = np.roll(x, dist, axis=ax)
            if not wrap:
                edge = [slice(None)] * 3
                edge[ax] = 0 if dist == 1 else -1
                ref[tuple(edge)] = 0
            np.testing.assert_array_equal(y, ref, err_msg=f"shift {dist} along {axis}")
        n = x.shape[ax]
        if n > 1:
            want = shift_cost(TINY, n, 4 * BLOCK, wrap)
            assert (cost["shift"].hops, cost["shift"].stages) == (want.hops, want.stages)


def test_broadcast_matches_numpy_and_closed_form(wafer):
    x = wafer.x
    for axis, ax in AXES.items():
        root = x.shape[ax] - 1
        y, cost = run_on_x(wafer, lambda ctx, a, axis, root: ctx.broadcast(a, axis, root),
                           axis=axis, root=root)
        np.testing.assert_array_equal(y, np.broadcast_to(np.take(x, [root], axis=ax), x.shape))
        if x.shape[ax] > 1:
            want = broadcast_cost(TINY, x.shape[ax], 4 * BLOCK)
            assert (cost["broadcast"].hops, cost["broadcast"].stages) == (want.hops, want.stages)


def test_send_moves_every_block_one_hop(wafer):
    x = wafer.x
    for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        y, cost = run_on_x(wafer, lambda ctx, a, dx, dy: ctx.send(a, dx, dy), dx=dx, dy=dy)
        ref = np.zeros_like(x)
        h, w = x.shape[:2]
        ref[max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = x[max(-dy, 0):h - max(dy, 0),
                                                                     max(-dx, 0):w - max(dx, 0)]
        np.testing.assert_array_equal(y, ref, err_msg=f"send ({dx},{dy})")
        if (w if dx else h) > 1:
            assert cost["send"].hops == 1


def test_gemv_alternates_axes_over_the_dsm(wafer):
    """MeshGEMV twice, as in decode: x split over columns -> W1 -> rows -> W2 -> columns, no transpose.
    Weights and vectors live in the DSM with the decode layouts' splits."""
    mesh, rng = wafer.mesh, np.random.default_rng(3)
    ib, ob = 3, 2
    w1 = rng.standard_normal((mesh.height * ob, mesh.width * ib)).astype(np.float32)
    w2 = rng.standard_normal((mesh.width * ib, mesh.height * ob)).astype(np.float32)
    v = rng.standard_normal(mesh.width * ib).astype(np.float32)
    tensors = {"w1": (w1, ("y", "x")), "w2": (w2, ("x", "y")), "v": (v, ("x",)),
               "h": (np.zeros(mesh.height * ob, np.float32), ("y",)), "z": (np.zeros_like(v), ("x",))}
    for name, (value, split) in tensors.items():
        wafer.dsm.alloc(name, value.shape, split=split)
        wafer.dsm.put(name, value)
    try:
        def kernel(ctx):
            h = ctx.gemv(ctx.load("w1"), ctx.load("v"), "x")  # output split over rows
            ctx.store("h", h)
            ctx.store("z", ctx.gemv(ctx.load("w2"), h, "y"))  # output split over columns again

        cost = wafer.run(kernel)
        np.testing.assert_allclose(wafer.dsm.get("h"), w1 @ v, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(wafer.dsm.get("z"), w2 @ (w1 @ v), rtol=1e-4, atol=1e-4)
        reductions = reduce_flops("ktree", mesh.width, ob) + reduce_flops("ktree", mesh.height, ib)
        assert cost["gemv"].flops == 2 * (2 * ib * ob) + reductions
    finally:
        for name in tensors:
            wafer.dsm.free(name)


def test_dsm_owners_read_and_cost_report(wafer):
    x, mesh = wafer.x, wafer.mesh
    index = (mesh.height - 1, mesh.width - 1, BLOCK - 1)
    assert wafer.dsm.owners("x", index) == [Coord(mesh.width - 1, mesh.height - 1)]
    assert wafer.dsm.read("x", index) == x[index]
    before = wafer.cost()
    step = wafer.run(lambda ctx: ctx.store("y", ctx.allreduce(ctx.load("x"), "x", "ring")))
    after = wafer.cost()
    assert after.steps == before.steps + 1
    for name, c in step.items():
        assert after.by_op[name] == before.by_op.get(name, type(c)()) + c
    assert "total" in str(after) and f"{after.steps} step(s)" in str(after)
    assert after.per_step[-1] == step and after.step_totals()[-1].cycles == sum(c.cycles for c in step.values())
