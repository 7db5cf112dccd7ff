"""The host's float32 copies of a tile's storage-dtype weights (decode.shards.ComputeCopies): converted once, not
once per micro-batch; a block replaced is converted again; float32 storage is used as it is (no copy)."""

from __future__ import annotations

import tracemalloc

import numpy as np

from waferrt.core.dtypes import to_f32
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.core.spec import WSE2
from waferrt.decode.cost import Decoding
from waferrt.decode.pack import Chunks, pack_layer
from waferrt.decode.shards import ComputeCopies, LayerShard
from waferrt.model import synthetic_llama, tiny_config

CFG = tiny_config()
W = synthetic_llama(CFG, seed=2)


def test_a_block_is_converted_once_and_again_when_replaced():
    stored = np.arange(6, dtype=np.float16).reshape(2, 3)
    copies = ComputeCopies("float16")
    first = copies.of("w", stored)
    assert first.dtype == np.float32 and (first == [[0, 1, 2], [3, 4, 5]]).all()
    assert copies.of("w", stored) is first  # the same copy for the same block
    again = stored * np.float16(2)
    assert (copies.of("w", again) == 2 * first).all()  # a new block under the name: its own copy
    f32 = np.ones(4, np.float32)
    assert ComputeCopies("float32").of("w", f32) is f32  # float32 storage: the array itself


def _step(shard: LayerShard, x: np.ndarray, pos: int) -> tuple[np.ndarray, int]:
    """A decode step of two requests -> (its output, the peak bytes it allocated)."""
    tracemalloc.start()
    try:
        out = shard.forward(x, np.array([0, 1]), np.array([pos, pos]))
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_float16_layer_allocates_its_float32_weights_on_the_first_step_only():
    """The first step converts the layer's blocks (2x their float16 bytes); later steps allocate a fraction
    of that (they once converted every block for every micro-batch) and compute the same as fresh copies."""
    region = Region(0, 0, 3, 2)
    arrays = pack_layer(CFG, W.layers[0], region, "float16")
    f32_bytes = sum(2 * a.nbytes for a in arrays.values())
    shard = LayerShard(Decoding(CFG, "float16"), region, arrays, (2, 16), Ledger(WSE2, "float16"))
    x = Chunks(CFG.dim, region.w).split(np.random.default_rng(0).standard_normal((2, CFG.dim)).astype(np.float32))
    _, first = _step(shard, x, 0)
    out, later = _step(shard, x, 1)
    assert first > f32_bytes > 4 * later
    fresh = LayerShard(Decoding(CFG, "float16"), region, arrays, (2, 16), Ledger(WSE2, "float16"))
    fresh.forward(x, np.array([0, 1]), np.array([0, 0]))
    np.testing.assert_array_equal(fresh.forward(x, np.array([0, 1]), np.array([1, 1])), out)
    assert all(np.array_equal(to_f32(a, "float16"), ComputeCopies("float16").of(n, a)) for n, a in arrays.items())
