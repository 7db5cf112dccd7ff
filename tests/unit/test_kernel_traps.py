"""The kernel API's traps that a user hit (issue 35), each closed: a replicated tensor whose copies differ, a
keyword of Launch given to Wafer, ... -- each raises an error that says what to write instead."""

from __future__ import annotations

import numpy as np
import pytest

import waferrt
from waferrt.dsm import CopiesDiffer


def _rows_store_their_y(ctx):
    _, ys = ctx.coords()
    ctx.store("v", ctx.load("v") + ys[..., None].astype(np.float32))  # every row of cores a different value


def test_the_copies_of_a_replicated_tensor_must_agree_or_one_is_chosen():
    with waferrt.Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2), backend="local") as wafer:
        wafer.dsm.alloc("v", (8,), split=("x",))                        # split along x, a copy on each row
        wafer.dsm.put("v", np.zeros(8, np.float32))
        assert (wafer.dsm.get("v") == 0).all()                         # copies agree: read as before
        wafer.run(_rows_store_their_y)
        with pytest.raises(CopiesDiffer) as e:
            wafer.dsm.get("v")
        assert "core (x=0, y=1)'s copy" in str(e.value) and "core (x=0, y=0)'s" in str(e.value)
        assert "copy=(0, 1)" in str(e.value)
        assert (wafer.dsm.get("v", copy=(3, 1)) == 1).all() and (wafer.dsm.get("v", copy=(0, 0)) == 0).all()
        with pytest.raises(ValueError, match=r"copy=\(9, 0\) is not a core"):
            wafer.dsm.get("v", copy=(9, 0))


def test_a_split_tensor_has_no_copies_to_compare():
    with waferrt.Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2), backend="local") as wafer:
        wafer.dsm.alloc("v", (2, 4))
        wafer.dsm.put("v", np.arange(8, dtype=np.float32).reshape(2, 4))
        wafer.run(lambda ctx: ctx.store("v", ctx.load("v") + ctx.coords()[1][..., None, None]))
        assert wafer.dsm.get("v").tolist() == [[0, 1, 2, 3], [5, 6, 7, 8]]


@pytest.mark.parametrize("keyword, hint", [
    ("timeout", "write Wafer(..., launch=waferrt.Launch(timeout=5))"),
    ("max_tiles", "launch=waferrt.Launch(max_tiles=5)"),
    ("timout", "Wafer takes spec, mesh, tile, backend and launch"),
])
def test_a_keyword_wafer_does_not_take_is_named_with_where_it_goes(keyword, hint):
    with pytest.raises(TypeError) as e:
        waferrt.Wafer(backend="local", **{keyword: 5})
    assert f"unknown keyword(s) {keyword}" in str(e.value) and hint in str(e.value)
