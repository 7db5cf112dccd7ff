"""The dequantised-weights cache: the first load writes it, later loads map the same numbers from it, an
edited GGUF gets a new entry, and a cached array travels by reference (a few bytes) and maps back equal."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
from ggufs import write_gguf

from waferrt.model import synthetic_llama, tiny_config
from waferrt.model.npcache import MappedArray, by_reference, cached, load_meta, load_model, resolve


def test_first_load_writes_later_loads_map_the_same_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("WAFERRT_CACHE", str(tmp_path / "cache"))
    cfg, w = tiny_config(), synthetic_llama(tiny_config(), seed=3)
    path = tmp_path / "tiny.gguf"
    write_gguf(path, cfg, w)
    assert not cached(path)
    config, first, tok = load_model(path)
    assert cached(path) and config == cfg
    config2, again, tok2 = load_model(path)
    assert isinstance(again.layers[1].w_up, np.memmap) and again.tied and again.head is again.embed
    np.testing.assert_array_equal(again.layers[1].w_up, w.layers[1].w_up)
    np.testing.assert_array_equal(again.embed, first.embed)
    assert tok2.tokens == tok.tokens and tok2.merges == tok.merges and load_meta(path)[0] == cfg
    write_gguf(path, cfg, synthetic_llama(cfg, seed=4))  # the file changed: a new entry, new numbers
    assert not cached(path)
    assert not np.array_equal(load_model(path)[1].embed, first.embed)
    assert len([p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]) == 2


def test_a_cached_array_travels_by_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("WAFERRT_CACHE", str(tmp_path / "cache"))
    cfg = tiny_config()
    write_gguf(tmp_path / "m.gguf", cfg, synthetic_llama(cfg, seed=5))
    load_model(tmp_path / "m.gguf")
    _, w, _ = load_model(tmp_path / "m.gguf")
    layer = w.layers[2]
    ref = by_reference((layer, w.final_norm))
    assert isinstance(ref[0].wq, MappedArray) and isinstance(ref[1], MappedArray)
    assert len(pickle.dumps(ref)) < 4000 < layer.wq.nbytes * 9  # a few bytes instead of the arrays
    back = resolve(pickle.loads(pickle.dumps(ref)))
    for f in dataclasses.fields(layer):
        np.testing.assert_array_equal(getattr(back[0], f.name), getattr(layer, f.name))
    plain = np.ones(3, np.float32)
    assert by_reference(plain) is plain and resolve(plain) is plain  # not from a file: sent as it is


def test_the_embedding_table_is_cut_from_its_file_block_by_block(tmp_path, monkeypatch):
    """pack_embed from a table read a block of rows at a time equals the blocks cut from the whole table."""
    from waferrt.core.layout import to_blocks
    from waferrt.core.mesh import Region
    from waferrt.decode import pack
    from waferrt.decode.layout import embed_layout

    monkeypatch.setenv("WAFERRT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(pack, "ROWS_PER_BLOCK", 37)  # several blocks, the last one short
    cfg = tiny_config()
    write_gguf(tmp_path / "m.gguf", cfg, synthetic_llama(cfg, seed=6))
    load_model(tmp_path / "m.gguf")
    _, w, _ = load_model(tmp_path / "m.gguf")
    table = by_reference(w.embed)
    np.testing.assert_array_equal(table.read_rows(40, 90), w.embed[40:90])
    for region in (Region(0, 0, 3, 5), Region(0, 0, 1, 1), Region(0, 0, 7, 2)):
        got = pack.pack_embed(cfg, table, w.final_norm, region)["table"]
        want = pack.out_in(to_blocks(w.embed, embed_layout(cfg, region)), "y")
        np.testing.assert_array_equal(got, want)
