"""The dequantised-weights cache: the first load writes it, later loads map the same numbers from it, an
edited GGUF gets a new entry, a cached array travels by reference (a few bytes) and maps back equal, and a
damaged entry (4 KB overwritten, a file truncated or deleted, meta.json garbled or without checksums) is
said so on one line and rebuilt, giving the GGUF's numbers again."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle

import numpy as np
import pytest
from ggufs import write_gguf

from waferrt.model import synthetic_llama, tiny_config
from waferrt.model.npcache import MappedArray, by_reference, cache_root, cached, damaged, load_meta, load_model, resolve


def test_first_load_writes_later_loads_map_the_same_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("WAFERRT_CACHE", str(tmp_path / "cache"))
    config, w = tiny_config(), synthetic_llama(tiny_config(), seed=3)
    path = tmp_path / "tiny.gguf"
    write_gguf(path, config, w)
    assert not cached(path)
    config, first, tok = load_model(path)
    assert cached(path) and config == config
    config2, again, tok2 = load_model(path)
    assert isinstance(again.layers[1].w_up, np.memmap) and again.tied and again.head is again.embed
    np.testing.assert_array_equal(again.layers[1].w_up, w.layers[1].w_up)
    np.testing.assert_array_equal(again.embed, first.embed)
    assert tok2.tokens == tok.tokens and tok2.merges == tok.merges and load_meta(path)[0] == config
    write_gguf(path, config, synthetic_llama(config, seed=4))  # the file changed: a new entry, new numbers
    assert not cached(path)
    assert not np.array_equal(load_model(path)[1].embed, first.embed)
    assert len([p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]) == 2


def test_a_cached_array_travels_by_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("WAFERRT_CACHE", str(tmp_path / "cache"))
    config = tiny_config()
    write_gguf(tmp_path / "m.gguf", config, synthetic_llama(config, seed=5))
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
    config = tiny_config()
    write_gguf(tmp_path / "m.gguf", config, synthetic_llama(config, seed=6))
    load_model(tmp_path / "m.gguf")
    _, w, _ = load_model(tmp_path / "m.gguf")
    table = by_reference(w.embed)
    np.testing.assert_array_equal(table.read_rows(40, 90), w.embed[40:90])
    for region in (Region(0, 0, 3, 5), Region(0, 0, 1, 1), Region(0, 0, 7, 2)):
        got = pack.pack_embed(config, table, w.final_norm, region)["table"]
        want = pack.out_in(to_blocks(w.embed, embed_layout(config, region)), "y")
        np.testing.assert_array_equal(got, want)


def _overwrite_4k(file):
    with open(file, "r+b") as f:
        f.seek(os.path.getsize(file) // 2)
        f.write(os.urandom(4096))


def _truncate(file):
    os.truncate(file, os.path.getsize(file) - 100)


def _garble_meta(file):
    meta = json.loads((file.parent / "meta.json").read_text())
    (file.parent / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "checks"}))


DAMAGE = {"4 KB overwritten": (_overwrite_4k, "does not match its checksum"),
          "truncated": (_truncate, "bytes, not the"),
          "deleted": (os.remove, "cannot be read (No such file or directory)"),
          "written without checksums": (_garble_meta, "has no checksums")}


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_entry_is_said_and_rebuilt(tmp_path, monkeypatch, caplog, how):
    """The damage is found when the entry is mapped, named on one line (the file, why, rebuilding), and the
    entry rebuilt: the weights equal the GGUF's, and the entry after is whole (the next load maps it)."""
    monkeypatch.setenv("WAFERRT_CACHE", str(tmp_path / "cache"))
    config, w = tiny_config(), synthetic_llama(tiny_config(), seed=7)
    path = tmp_path / "tiny.gguf"
    write_gguf(path, config, w)
    load_model(path)
    (entry,) = [p for p in cache_root().iterdir() if not p.name.startswith(".")]
    assert damaged(entry) == ""
    file = entry / "layers.1.w_up.npy"
    damage, words = DAMAGE[how]
    damage(file)
    assert words in damaged(entry)
    with caplog.at_level(logging.WARNING, logger="waferrt.cache"):
        _, got, _ = load_model(path)
    (line,) = [r.getMessage() for r in caplog.records]
    assert str(entry) in line and words in line and "rebuilding it from the GGUF" in line
    if how != "written without checksums":
        assert "layers.1.w_up.npy" in line
    for a, b in ((got.layers[1].w_up, w.layers[1].w_up), (got.embed, w.embed), (got.layers[2].wq, w.layers[2].wq)):
        np.testing.assert_array_equal(a, b)
    assert damaged(entry) == "" and cached(path)
    caplog.clear()
    _, again, _ = load_model(path)
    assert isinstance(again.layers[1].w_up, np.memmap) and not caplog.records  # mapped, nothing said
    np.testing.assert_array_equal(again.layers[1].w_up, w.layers[1].w_up)


def test_a_garbled_meta_json_is_rebuilt(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("WAFERRT_CACHE", str(tmp_path / "cache"))
    config, w = tiny_config(), synthetic_llama(tiny_config(), seed=8)
    write_gguf(tmp_path / "m.gguf", config, w)
    load_model(tmp_path / "m.gguf")
    (entry,) = [p for p in cache_root().iterdir() if not p.name.startswith(".")]
    (entry / "meta.json").write_text('{"config": {')
    assert load_meta(tmp_path / "m.gguf")[0] == config  # from the GGUF's header meanwhile
    with caplog.at_level(logging.WARNING, logger="waferrt.cache"):
        _, got, _ = load_model(tmp_path / "m.gguf")
    assert len(caplog.records) == 1 and "meta.json is unreadable" in caplog.records[0].getMessage()
    np.testing.assert_array_equal(got.embed, w.embed)
