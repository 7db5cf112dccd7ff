"""Misusing the Python API's values (MeshSpec, Region, Layout, KVReserve, NodeInfo, plan, a Wafer that is
made but not opened, a Ray address, a GGUF) raises a TypeError or ValueError that names the argument and
the value, before anything is started (no Ray in this tier)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from waferrt.actors.session import ClusterUnreachable, check_address
from waferrt.core.arith import whole
from waferrt.core.layout import Layout
from waferrt.core.mesh import MeshSpec, MeshTooLarge, Region, TooManyTiles
from waferrt.core.spec import TINY
from waferrt.model import tiny_config
from waferrt.runtime import Launch, Wafer, WaferClosed
from waferrt.scheduler import KVReserve, NodeInfo, PlanError, PlanOptions, plan

R = Region(0, 0, 4, 2)
CFG = tiny_config()


def _plan(**over):
    args = {"config": CFG, "spec": TINY, "mesh": MeshSpec(16, 16, 8, 8), "kv": KVReserve(32, 2)} | over
    return plan(args.pop("config"), args.pop("spec"), args.pop("mesh"), **args)


CASES = [
    ("negative mesh", lambda: MeshSpec(-4, 2, 1, 1), ValueError, "a mesh needs at least 1x1 cores, got -4x2"),
    ("str mesh width", lambda: MeshSpec("4", 2, 1, 1), TypeError, "MeshSpec.width must be a whole number"),
    ("float tile", lambda: MeshSpec(4, 2, 1.5, 1), TypeError, "MeshSpec.tile_w must be a whole number"),
    ("tile over mesh", lambda: MeshSpec(4, 2, 8, 1), ValueError, "tile 8x1 is larger than the mesh 4x2"),
    ("zero region", lambda: Region(0, 0, 0, 2), ValueError, "a region needs at least 1x1 cores"),
    ("float region", lambda: Region(0.5, 0, 1, 1), TypeError, "Region.x0 must be a whole number"),
    ("negative origin", lambda: Region(-1, 0, 1, 1), ValueError, "x, y >= 0"),
    ("negative shape", lambda: Layout((-4, 8), R, ("y", "x")), ValueError, "shape (-4, 8): axis 0 has -4 elements"),
    ("zero shape", lambda: Layout((2, 0), R, ("y", "x")), ValueError, "axis 1 has 0 elements"),
    ("float shape", lambda: Layout((2.0, 8), R, ("y", "x")), TypeError, "axis 0 must be a whole number"),
    ("int shape", lambda: Layout(8, R, ("x",)), TypeError, "a tensor's shape is a tuple of whole numbers"),
    ("bad split", lambda: Layout((2, 8), R, ("z", "x")), ValueError, "split entries are 'x', 'y' or None"),
    ("too few split", lambda: Layout((2, 8), R, ("x",)), ValueError, "needs one split entry per axis"),
    ("axis over too many cores", lambda: Layout((2, 3), R, ("y", "x")), ValueError,
     "use at most 3 cores along that mesh axis"),
    ("unknown dtype", lambda: Layout((2, 8), R, ("y", "x"), dtype="foo"), ValueError,
     "dtype 'foo' is not a numeric numpy dtype name"),
    ("dtype object", lambda: Layout((2, 8), R, ("y", "x"), dtype=np.float32), TypeError,
     "a dtype is given by name"),
    ("negative kv", lambda: KVReserve(-1, 2), ValueError, "KV reserve needs tokens >= 1"),
    ("float kv", lambda: KVReserve(1.5, 2), TypeError, "KVReserve.tokens must be a whole number"),
    ("no cpus", lambda: NodeInfo("a", 0), ValueError, "at least 1 CPU"),
    ("bool count", lambda: whole("count", True), TypeError, "count must be a whole number (an int), got True"),
    ("plan beyond the wafer", lambda: _plan(mesh=MeshSpec(1000, 1000, 500, 500)), MeshTooLarge,
     "a 1000x1000 mesh does not fit on the tiny wafer, which has 64x64 cores"),
    ("plan kv as a tuple", lambda: _plan(kv=(32, 2)), TypeError, "plan(): kv must be a KVReserve"),
    ("plan int8", lambda: _plan(options=PlanOptions(dtype="int8")), PlanError, "unknown storage dtype 'int8'"),
    ("wafer beyond the wafer", lambda: Wafer(spec="tiny", mesh=(100, 2), tile=(2, 2)), MeshTooLarge,
     "a 100x2 mesh does not fit on the tiny wafer"),
    ("wafer of 1x1 tiles", lambda: Wafer(spec="tiny", mesh=(64, 64), tile=(1, 1)), TooManyTiles,
     "is 4,096 tile actors"),
    ("wafer max_tiles 0", lambda: Wafer(spec="tiny", mesh=(64, 64), tile=(1, 1), launch=Launch(max_tiles=0)),
     ValueError,
     "max_tiles must be at least 1"),
    ("wafer mesh not a pair", lambda: Wafer(mesh=8), TypeError, "mesh is a (width, height) pair"),
    ("wafer zero timeout", lambda: Wafer(launch=Launch(timeout=0)), ValueError, "a number > 0; got 0"),
    ("wafer nan timeout", lambda: Wafer(launch=Launch(timeout=math.nan)), ValueError, "a number > 0; got nan"),
    ("wafer unknown spec", lambda: Wafer(spec="wse9"), ValueError, "unknown hardware spec 'wse9'"),
    ("wafer address not a str", lambda: Wafer(launch=Launch(address=6379)), TypeError, "address is a str"),
    ("alloc before open", lambda: Wafer(mesh=(4, 2), tile=(2, 2)).dsm.alloc("x", (2, 4)), WaferClosed,
     "this Wafer is not open yet; open it with `with wafer:` or wafer.open()"),
    ("run before open", lambda: Wafer(mesh=(4, 2), tile=(2, 2)).run(lambda ctx: None), WaferClosed,
     "is not open yet"),
    ("nobody at the address", lambda: check_address("127.0.0.1:1"), ClusterUnreachable,
     "no Ray cluster at Ray address '127.0.0.1:1' (127.0.0.1:1)"),
    ("address without port", lambda: check_address("headnode"), ValueError, "is not HOST:PORT"),
]


@pytest.mark.parametrize("call, error, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_misuse_names_the_argument(call, error, words):
    t0 = time.monotonic()
    with pytest.raises(error) as e:
        call()
    assert words in str(e.value)
    assert time.monotonic() - t0 < 10.0, "nothing may be started before the arguments are checked"


def test_a_truncated_gguf_says_how_many_bytes_it_lacks(tmp_path):
    from ggufs import write_gguf

    from waferrt.model import GGUFError, GGUFModel, synthetic_llama

    path = tmp_path / "m.gguf"
    write_gguf(path, CFG, synthetic_llama(CFG, seed=1))
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    with pytest.raises(GGUFError, match=f"truncated \\(expected {len(data):,} bytes, got {len(data) - 1:,}\\)"):
        GGUFModel(path)
