"""An untied output head (Llama3-8B's kind) on the tiny model: its own region beside the embedding's, its tokens
the reference's, its cycles the closed forms' and the planner's, re-placed after a fault, read from a GGUF.

The real-size run is benchmarks/realdims.py (the real 128,256-token vocabulary and head on Ray nodes)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from waferrt.cli import main
from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY
from waferrt.decode.cost import step_cycles
from waferrt.decode.setup import stage_sram
from waferrt.decode.stage import Stage, StageKind
from waferrt.model import Sampler, read_config, synthetic_llama, tiny_config
from waferrt.model.gguf_writer import write_gguf
from waferrt.scheduler import KVReserve, PlanOptions, plan, plan_report
from waferrt.scheduler.budget import model_bytes, work_bytes
from waferrt.scheduler.placement import violations
from waferrt.scheduler.repair import replan
from waferrt.scheduler.serial import placement_from_json, placement_to_json
from waferrt.serving import GenRequest, LocalDecoder, generate_reference

CFG = dataclasses.replace(tiny_config(), tie_embeddings=False)
W = synthetic_llama(CFG, seed=1)
MESH = MeshSpec(16, 16, 8, 8)
KV = KVReserve(32, 2)
REQS = [GenRequest((1, 2, 3), 5), GenRequest((7, 8), 4)]


@pytest.fixture(scope="module")
def placed():
    return plan(CFG, TINY, MESH, kv=KV)


def test_the_head_has_a_region_of_its_own_in_the_embeddings_tile(placed):
    p = placed
    assert not W.tied and p.head is not None and p.head_region == p.head != p.embed
    assert p.head.intersect(p.embed) is None and p.mesh.tiles_of(p.head) == p.mesh.tiles_of(p.embed)
    assert [name for name, _ in p.regions()] == ["embed", "layer 0", "layer 1", "layer 2", "head"]
    assert violations(p) == () and placement_from_json(placement_to_json(p)) == p
    assert violations(dataclasses.replace(p, head=None)) != ()  # an untied model's head needs its region
    # the weights: two tables of 256 x 64 float32 values (65,536 bytes each) and the final norm's 256 bytes
    assert work_bytes(CFG, "float32")[0] == 256 * 64 * 4 + 64 * 4
    assert model_bytes(CFG, 32, 2, "float32")[0] == model_bytes(tiny_config(), 32, 2, "float32")[0] + 65_792


def test_the_untied_decode_gives_the_references_tokens_and_books_the_closed_forms(placed):
    p = placed
    ref, _ = generate_reference(CFG, W, REQS, Sampler())
    dec = LocalDecoder(CFG, W, p)
    out, stats = dec.generate(REQS, Sampler())
    assert [c.tokens for c in out] == [c.tokens for c in ref]
    stages = dec.setup.stages()
    assert stages[-1] == Stage(StageKind.HEAD, p.head)
    head = stage_sram(dec.setup, len(stages) - 1)
    assert set(head) == {"head.table", "head.scratch"} and {r for r, _ in head.values()} == {p.head}
    heads = [r for r in stats.runs if r.stage == len(stages) - 1]
    assert heads
    for r in stats.runs:
        pos = r.items[0].pos
        if {it.pos for it in r.items} != {pos}:
            continue  # a micro-batch of items at several positions: not one closed form
        want = step_cycles(p.spec, p.decoding, stages, pos + 1, [len(r.items)], pos % p.layers[0].w)
        assert r.cycles == pytest.approx(want[(r.stage, 0)], rel=1e-12), (r.mb, r.stage)
    full = sum(step_cycles(p.spec, p.decoding, stages, p.kv_tokens, [1]).values())
    assert full == pytest.approx(plan_report(p).step_cycles, rel=1e-12)  # the planner times the same stages


def test_a_dead_core_in_the_head_moves_the_head_alone_and_the_tokens_stay(placed):
    p = placed
    dead = next(iter(p.head.cores()))
    fixed = replan(p, frozenset({dead}))
    new = fixed.placement
    assert fixed.broken == ("head",) and fixed.moved == ("head",) and fixed.mode == "local"
    assert new.embed == p.embed and new.layers == p.layers and not new.head.contains(dead)
    assert new.mesh.tiles_of(new.head) == new.mesh.tiles_of(new.embed) and violations(new) == ()
    assert sorted(m.tensor for m in fixed.moves) == ["head", "head_norm"]
    assert sum(m.nbytes for m in fixed.moves) == 256 * 64 * 4 + 64 * 4
    ref, _ = generate_reference(CFG, W, REQS, Sampler())
    out, _ = LocalDecoder(CFG, W, new).generate(REQS, Sampler())
    assert [c.tokens for c in out] == [c.tokens for c in ref]


def test_plan_reads_an_untied_gguf(tmp_path, capsys):
    path = tmp_path / "untied.gguf"
    write_gguf(path, CFG, W)
    assert read_config(path).tie_embeddings is False
    assert main(["plan", "--model", str(path), "--spec", "tiny", "--mesh", "16x16", "--tile", "8x8",
                 "--kv-tokens", "32", "--requests", "2"]) == 0
    assert "head" in capsys.readouterr().out


def test_a_streaming_decode_streams_the_untied_heads_table():
    from waferrt.scheduler.placement import plan_streaming, streaming_mesh

    p = plan_streaming(CFG, TINY, streaming_mesh(CFG, TINY, KV), kv=KV)
    ref, _ = generate_reference(CFG, W, REQS, Sampler())
    out, _ = LocalDecoder(CFG, W, p).generate(REQS, Sampler())
    assert [c.tokens for c in out] == [c.tokens for c in ref]


def test_the_heads_table_is_held_widened_once_and_the_embeddings_at_the_storage_dtype():
    """float16: the head's table is cut straight into float32 (its values rounded to float16: what the cores
    hold), never held at both widths; the untied embedding's table only gives rows and stays float16."""
    from waferrt.decode.setup import DecodeSetup, pack_stage, stage_weights

    p = plan(CFG, TINY, MESH, kv=KV, options=PlanOptions(dtype="float16"))
    setup = DecodeSetup.from_placement(p)
    packed = {setup.stages()[s].kind.value: pack_stage(setup, s, raw) for s, raw in stage_weights(setup, W)
              if setup.stages()[s].kind is not StageKind.LAYER}
    embed, head = packed["embed"]["table"], packed["head"]["table"]
    assert embed.dtype == np.float16 and head.dtype == np.float32
    assert np.array_equal(np.sort(head[head != 0]), np.sort(W.head.astype(np.float16).astype(np.float32).ravel()))
    assert np.array_equal(np.sort(embed[embed != 0].astype(np.float32)),
                          np.sort(W.embed.astype(np.float16).astype(np.float32).ravel()))
