"""What a tile's process holds of its weights. The float32 form of its storage-dtype blocks
(decode.shards.in_float32): widened once -- a tile program's dense layers as they load, the largest block first
(decode.shards.widen), any other block on its first use -- in place of the storage block (held once, not twice),
not once per micro-batch; a block put back at the storage dtype is widened again; float32 storage is used as
it is; the bytes the cores hold stay at the storage dtype (core.dtypes.stored_nbytes). The mapped float32
source of a packed matrix gives its pages back (core.pages.drop_pages)."""

from __future__ import annotations

import tracemalloc

import numpy as np

from waferrt.core.dtypes import stored_nbytes, to_f32, to_storage
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.core.pages import drop_pages
from waferrt.core.spec import WSE2
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.pack import Chunks, pack_layer
from waferrt.decode.shards import LayerShard, in_float32, widen
from waferrt.model import synthetic_llama, tiny_config

CFG = tiny_config()
W = synthetic_llama(CFG, seed=2)


def test_a_block_is_widened_once_in_its_place_and_again_when_put_back():
    arrays = {"w": np.arange(6, dtype=np.float16).reshape(2, 3)}
    first = in_float32(arrays, "w", "float16")
    assert first.dtype == np.float32 and (first == [[0, 1, 2], [3, 4, 5]]).all()
    assert arrays["w"] is first and in_float32(arrays, "w", "float16") is first  # held once, in float32
    assert stored_nbytes(arrays["w"], "float16") == 12  # 6 values x 2 bytes: what a core holds
    arrays["w"] = to_storage(2 * first, "bfloat16")  # put back at the storage dtype
    assert (in_float32(arrays, "w", "bfloat16") == 2 * first).all() and arrays["w"].dtype == np.float32
    assert to_f32(arrays["w"], "bfloat16") is arrays["w"]  # widened already: not read as bfloat16 bits
    f32 = {"w": np.ones(4, np.float32)}
    assert in_float32(f32, "w", "float32") is f32["w"] and stored_nbytes(f32["w"], "float32") == 16


class _Order(dict):
    """A dict that records the names put in it, in order."""

    def __init__(self, *a):
        super().__init__(*a)
        self.put: list[str] = []

    def __setitem__(self, name, value):
        self.put.append(name)
        super().__setitem__(name, value)


def test_a_layer_is_widened_at_load_largest_block_first():
    """widen: every block in float32, the largest first (the block held at both widths at the end is the
    smallest); a tile program widens a dense layer's blocks as it loads them, counted at the storage dtype."""
    from waferrt.core.mesh import MeshSpec
    from waferrt.core.spec import TINY
    from waferrt.scheduler import KVReserve, PlanOptions, plan
    from waferrt.serving import LocalDecoder

    arrays = _Order(pack_layer(CFG, W.layers[0], Region(0, 0, 3, 2), "float16"))
    sizes = {name: a.nbytes for name, a in arrays.items()}
    widen(arrays, "float16")
    assert sorted(arrays.put) == sorted(sizes) and arrays.put[0] == "w13"  # gate and up: 2 x 128 x 64 values
    assert [sizes[n] for n in arrays.put] == sorted(sizes.values(), reverse=True)
    assert {a.dtype for a in arrays.values()} == {np.dtype(np.float32)}
    p = plan(CFG, TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(32, 2), options=PlanOptions(dtype="float16"))
    dec = LocalDecoder(CFG, W, p)
    shards = [sh for prog in dec.programs.values() for sh in prog.layers.values()]
    assert len(shards) == CFG.n_layers and all(a.dtype == np.float32 for sh in shards for a in sh.arrays.values())
    stored = sum(a.nbytes for a in pack_layer(CFG, W.layers[0], p.layers[0], "float16").values())
    assert sum(stored_nbytes(a, "float16") for a in shards[0].arrays.values()) == stored


def _step(shard: LayerShard, x: np.ndarray, pos: int) -> tuple[np.ndarray, int]:
    """A decode step of two requests -> (its output, the peak bytes it allocated)."""
    tracemalloc.start()
    try:
        out = shard.forward(x, np.array([0, 1]), np.array([pos, pos]))
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_float16_layer_widens_its_weights_on_the_first_step_only():
    """The first step widens the layer's blocks (2x their float16 bytes); later steps allocate a fraction of
    that (they once converted every block for every micro-batch), compute what a fresh shard computes, and the
    blocks still count their float16 bytes."""
    region = Region(0, 0, 3, 2)
    arrays = pack_layer(CFG, W.layers[0], region, "float16")
    stored = sum(a.nbytes for a in arrays.values())
    fresh = LayerShard(Decoding(CFG, "float16"), region, dict(arrays), KVCapacity(2, 16), Ledger(WSE2, "float16"))
    shard = LayerShard(Decoding(CFG, "float16"), region, arrays, KVCapacity(2, 16), Ledger(WSE2, "float16"))
    x = Chunks(CFG.dim, region.w).split(np.random.default_rng(0).standard_normal((2, CFG.dim)).astype(np.float32))
    _, first = _step(shard, x, 0)
    out, later = _step(shard, x, 1)
    assert first > 2 * stored > 4 * later
    assert {a.dtype for a in shard.arrays.values()} == {np.dtype(np.float32)}
    assert sum(stored_nbytes(a, "float16") for a in shard.arrays.values()) == stored
    fresh.forward(x, np.array([0, 1]), np.array([0, 0]))
    np.testing.assert_array_equal(fresh.forward(x, np.array([0, 1]), np.array([1, 1])), out)


def _rss_file() -> int:
    """This process's resident file-backed bytes (Linux)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssFile:"))


def test_a_read_mapped_array_gives_its_pages_back_and_reads_the_same_after(tmp_path):
    path = tmp_path / "w.npy"
    np.save(path, np.arange(16 << 20, dtype=np.float32))  # 64 MB
    mapped = np.load(path, mmap_mode="r")
    total = float(mapped.sum(dtype=np.float64))  # every page read: resident
    before = _rss_file()
    assert drop_pages(mapped)
    assert before - _rss_file() > 48 << 20
    assert float(mapped.sum(dtype=np.float64)) == total  # mapped in again from the file
    assert not drop_pages(np.ones(4, np.float32))  # in memory: nothing to give back
    writeable = np.memmap(tmp_path / "rw.bin", np.float32, mode="w+", shape=(4,))
    assert not drop_pages(writeable)  # its pages may hold writes not yet in the file
