"""Real dimensions without Ray: ``waferrt convert`` writes the Llama3-8B shape cut, and one Llama3-8B layer on the
WSE-2 region the planner gives it books exactly the estimator's cycles (benchmarks/realdims.py runs the same on
three Ray nodes, with the reference's tokens)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from waferrt.cli import main
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.core.spec import WSE2
from waferrt.decode.cost import layer_decode_cost
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.pack import Chunks, pack_layer
from waferrt.decode.shards import LayerShard
from waferrt.decode.stage import Stage, StageKind
from waferrt.model import LayerWeights, Tokenizer, load_gguf, read_config, synthetic_llama
from waferrt.model.convert import Cut
from waferrt.model.gguf_writer import gguf_name
from waferrt.model.zoo import MODELS
from waferrt.scheduler import KVReserve
from waferrt.scheduler.budget import layer_bytes, layer_shapes
from waferrt.scheduler.speed import stage_seconds
from waferrt.scheduler.types import Workload

L8B = MODELS["llama3-8b"].config


def test_convert_writes_the_llama3_8b_shape_cut(tmp_path):
    """One real layer (F16: 436 MB, never read back whole here) and a 512-token vocabulary: the config reads
    back as Llama3-8B's with the cut's layers, vocabulary and untied head, and every tensor has its real shape."""
    out = tmp_path / "l8b.gguf"
    assert main(["convert", "--shape", "Llama3-8B", "--layers", "1", "--vocab", "512", "--seed", "3", str(out)]) == 0
    config = read_config(out)
    assert (config.dim, config.n_heads, config.n_kv_heads, config.head_dim, config.hidden_dim, config.rope_theta,
            config.norm_eps) == \
        (4096, 32, 8, 128, 14336, 500000.0, 1e-5)
    assert (config.n_layers, config.vocab_size, config.tie_embeddings) == (1, 512, False)
    assert config == Cut("llama3-8b", 1, 512).config()
    tensors = {t.name: (tuple(int(n) for n in reversed(t.shape)), t.tensor_type)
               for t in gguf.GGUFReader(out).tensors}  # ggml dims innermost first: numpy's (out, in) reversed
    want = {gguf_name(config, f"layers[0].{f}"): s for f, s in LayerWeights.shapes(config).items()}
    want.update({"token_embd.weight": (512, 4096), "output_norm.weight": (4096,), "output.weight": (512, 4096)})
    assert {n: s for n, (s, _) in tensors.items()} == want  # the real head, a table of its own
    assert {t for _, t in tensors.values()} == {gguf.GGMLQuantizationType.F16}


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_a_converted_model_reads_back_as_its_seeded_weights(tmp_path, dtype):
    """A small cut, whole: the weights are synthetic_llama's for the cut's config and seed (rounded to float16),
    the tokenizer loads, and the file is a model every command reads."""
    out = tmp_path / "s.gguf"
    assert main(["convert", "--shape", "smollm2-135m", "--layers", "2", "--vocab", "300", "--seed", "5",
                 "--dtype", dtype, str(out)]) == 0
    config, w, meta = load_gguf(out)
    assert config == Cut("smollm2-135m", 2, 300, 5, dtype).config()
    ref = synthetic_llama(config, 5)
    for got, want in [(w.embed, ref.embed), (w.final_norm, ref.final_norm), (w.layers[1].w_down, ref.layers[1].w_down),
                      (w.layers[0].attn_norm, ref.layers[0].attn_norm), (w.layers[0].wq, ref.layers[0].wq)]:
        np.testing.assert_array_equal(got, want.astype(dtype).astype(np.float32))
    assert w.tied
    assert Tokenizer(meta).encode("The cat") != []


@pytest.mark.parametrize("argv,words", [
    (["--layers", "2"], "give --shape"),
    (["--shape", "llama3-8b", "--layers", "33"], "layers 33 is not 1..32"),
    (["--shape", "llama3-8b", "--layers", "2", "--vocab", "200000"], "vocab 200000 is not 256..128256"),
    (["--shape", "gpt9", "--layers", "2"], "'gpt9' is not a named model shape"),
])
def test_convert_refuses_a_bad_cut_in_one_line(tmp_path, capsys, argv, words):
    assert _status(["convert", *argv, str(tmp_path / "x.gguf")]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())  # nothing written, not even a part


@pytest.mark.parametrize("kw,error", [({"layers": 2.5}, TypeError), ({"layers": True}, TypeError),
                                      ({"vocab": "512"}, TypeError), ({"seed": -1}, ValueError),
                                      ({"dtype": "bfloat16"}, ValueError), ({"shape": "gpt9"}, ValueError)])
def test_a_cut_checks_its_fields(kw, error):
    with pytest.raises(error):
        Cut(**{"shape": "llama3-8b", "layers": 2, **kw})


def _status(argv: list[str]) -> int:
    """main's exit status, whether it returns it or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def _l8b_region(dtype: str, kv: KVReserve) -> Region:
    """The planner's narrowest layer region for a Llama3-8B layer at WSE-2's 48 KB per core (the benchmark's)."""
    w, h = layer_shapes(Workload(L8B, kv, dtype), WSE2.sram_bytes, *WSE2.full_mesh)[0]
    return Region(0, 0, w, h)


def test_a_llama3_8b_layer_on_its_wse2_region_books_the_estimators_cycles():
    """LayerShard.forward -- what the tiles run -- on a Llama3-8B layer cut for its WSE-2 region (every core's
    blocks and K/V within 48 KB) books, token by token, the cycles the estimator gives that region at that
    context (stage_seconds: the closed forms), and the ledger's Cost equals layer_decode_cost field by field.
    Zero weights (the booking depends on shapes only) keep the test to one packed layer."""
    kv, dtype = KVReserve(64, 2), "float16"
    region = _l8b_region(dtype, kv)
    assert (region.h, region.w) == (64, 158)
    work = Workload(L8B, KVReserve(max(kv.tokens, region.w), kv.requests), dtype)
    assert layer_bytes(work, region.w, region.h) <= WSE2.sram_bytes
    zeros = LayerWeights(**{n: np.zeros(s, np.float32) for n, s in LayerWeights.shapes(L8B).items()})
    ledger, dec = Ledger(WSE2, dtype), Decoding(L8B, dtype)
    shard = LayerShard(dec, region, pack_layer(L8B, zeros, region, dtype), KVCapacity(1, kv.tokens), ledger)
    x = Chunks(L8B.dim, region.w).split(np.random.default_rng(0).standard_normal((1, L8B.dim)).astype(np.float32))
    for pos in range(2):  # a request's positions in order; the K/V shift moves pos % cols columns (none at 0)
        ledger.clear()
        shard.forward(x, np.array([0]), np.array([pos]))
        booked = ledger.by_op["layer"]
        assert booked == layer_decode_cost(WSE2, dec, region, pos + 1, 1, moving=pos % region.w)
        estimated = stage_seconds(WSE2, dec, [Stage(StageKind.LAYER, region, 0)], pos + 1, 1)[0] * WSE2.clock_hz
        if pos % region.w:
            assert booked.cycles == pytest.approx(estimated, rel=1e-12)
        else:  # nothing shifts east yet: one routing stage fewer than the estimate's, which shifts every column
            assert booked.cycles < estimated


@pytest.mark.parametrize("dtype,most", [("float16", 2.5), ("float32", 2.0)])
def test_packing_a_layer_holds_little_more_than_its_result(dtype, most):
    """pack_layer casts each matrix to the storage dtype first and cuts it straight into place, one at a time:
    its peak allocation stays within `most` times what it returns (it was 5.6x in float16, 2.8x in float32
    when every matrix was cut in float32, stacked and copied again: 4.7 GB peak for one Llama3-8B layer)."""
    import tracemalloc
    from dataclasses import replace

    # head_dim 128, GQA 4
    config = replace(L8B, vocab_size=256, dim=1024, n_heads=8, n_kv_heads=2, hidden_dim=3584, n_layers=1)
    layer = synthetic_llama(config, 0).layers[0]
    tracemalloc.start()
    try:
        packed = pack_layer(config, layer, Region(0, 0, 7, 4), dtype)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= most * sum(a.nbytes for a in packed.values())


def _realdims():
    """benchmarks/realdims.py as a module (it imports its neighbour anchor.py)."""
    root = Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(root))
    try:
        spec = importlib.util.spec_from_file_location("realdims", root / "realdims.py")
        mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look it up there
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(root))


def test_the_documented_32_layer_cluster_command_places_the_whole_model():
    """docs/clusters.md's ``realdims.py --layers 32 --nodes 8`` (run only on a cluster): its mesh places all 32
    layers, the real 128,256-token vocabulary and the untied head, the head on the embedding's tile (where the
    decode samples), and each tile holds what the page says. By hand, at float16: a layer is
    4096 x (4096 + 1024 + 1024 + 4096) + 3 x 4096 x 14336 + 2 x 4096 = 218,112,000 values = 436,224,000 bytes
    (5 of them: 2,181,120,000 B = 2.03 GiB); the two tables, each booked with a final norm (scheduler.budget's
    head_tables), 2 x (128,256 x 4096 + 4096) = 1,050,681,344 values = 2,101,362,688 bytes (1.96 GiB)."""
    from waferrt.decode.setup import DecodeSetup
    from waferrt.scheduler import PlanOptions, plan, plan_report

    kv = KVReserve(64, 2)
    mesh = _realdims().mesh_for(L8B, kv, "float16", 8)
    assert (mesh.width, mesh.height, mesh.tile_w, mesh.tile_h) == (632, 768, 158, 384)
    placement = plan(L8B, WSE2, mesh, kv=kv, options=PlanOptions(dtype="float16"))
    assert len(placement.layers) == 32 and placement.head is not None
    setup = DecodeSetup.from_placement(placement)
    assert setup.stage_tiles()[0] == setup.stage_tiles()[-1]  # embedding and head on one tile
    work = {w.tile: w for w in plan_report(placement).tile_work}
    tables = [w for w in work.values() if w.embed]
    assert [(w.layers, w.weight_bytes) for w in tables] == [(0, 2_101_362_688)]
    assert sorted(w.weight_bytes for w in work.values() if w.layers == 5) == [5 * 436_224_000] * 6
