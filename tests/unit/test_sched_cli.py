"""`waferrt plan`: text, JSON, PNG and the dead-core re-plan, through the argparse wiring."""

from __future__ import annotations

import argparse
import json

import pytest

from waferrt.cli import plan as cli_plan
from waferrt.model.config import SMOLLM2_135M
from waferrt.model.gguf_loader import read_config
from waferrt.scheduler import placement_from_json


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="waferrt")
    cli_plan.add_parser(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["plan", *argv])
    code = args._run(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_text_plan_on_the_default_mesh(capsys):
    code, out, _ = _run(capsys)
    assert code == 0
    assert "SmolLM2-135M: 30 layers" in out and "174x128 cores in 2x2 tiles of 87x64" in out
    for words in ("SRAM per core", "hops layer->layer", "KV capacity", "cross Ray nodes", "tokens/s",
                  "layer 29"):
        assert words in out


def test_json_round_trips_and_png_and_replan_are_drawn(capsys, tmp_path):
    png = tmp_path / "plan.png"
    code, out, err = _run(capsys, "--json", "--dead", "10", "--seed", "3", "--png", str(png), "--nodes", "2")
    assert code == 0
    doc = json.loads(out)
    p = placement_from_json(doc["placement"])
    assert p.config == SMOLLM2_135M and doc["report"]["straddling"] == 0
    assert len(doc["replan"]["dead"]) == 10 and doc["replan"]["moves"]
    assert placement_from_json(doc["replan"]["placement"]).mesh.dead
    assert png.stat().st_size > 10_000 and (tmp_path / "plan-replan.png").stat().st_size > 10_000
    assert "drew" in err


def test_replan_text_and_a_failing_replan_exit_1(capsys):
    code, out, _ = _run(capsys, "--dead", "10", "--seed", "1")
    assert code == 0 and "re-plan around 10 dead cores: local" in out
    code, out, _ = _run(capsys, "--mesh", "150x128", "--tile", "75x64", "--dead", "400")
    assert code == 1 and "re-plan around 400 dead cores FAILED: cannot re-plan" in out


@pytest.mark.parametrize("argv, words", [
    (["--mesh", "64x64"], "does not fit"),
    (["--tile", "32x32"], "--tile needs --mesh"),
])
def test_bad_input_exits_2_with_a_reason(capsys, argv, words):
    code, _, err = _run(capsys, *argv)
    assert code == 2 and words in err


def test_help_teaches_with_examples(capsys):
    with pytest.raises(SystemExit):
        _run(capsys, "--help")
    assert "examples:" in capsys.readouterr().out


def test_gguf_metadata_gives_the_same_config():
    gguf_loader = pytest.importorskip("waferrt.model.gguf_loader")
    try:
        path = gguf_loader.smollm2_path()
    except FileNotFoundError:
        pytest.skip("SmolLM2 GGUF not installed")
    assert read_config(path) == SMOLLM2_135M


def test_the_default_mesh_here_is_cut_into_at_most_max_tiles():
    """generate's default mesh on this machine alone runs in one tile actor per core it may use, and in fewer
    when --max-tiles says so (it once planned two and refused its own plan with a TooManyTiles traceback);
    on a cluster (--address) it is the plan's."""
    import argparse

    from waferrt.cli.placing import local_cut, local_tiles
    from waferrt.core.mesh import MeshSpec

    mesh = MeshSpec(174, 128, 87, 64)  # SmolLM2's default: 2x2 tiles
    cut = local_cut(argparse.Namespace(address=None, max_tiles=1), mesh)
    assert (cut.tiles_x, cut.tiles_y) == (1, 1) and (cut.width, cut.height) == (174, 128)
    many = local_cut(argparse.Namespace(address=None, max_tiles=64), mesh)
    assert many.tiles_x * many.tiles_y == min(4, local_tiles())
    assert local_cut(argparse.Namespace(address="10.0.0.1:6379", max_tiles=1), mesh) == mesh


def test_the_default_mesh_search_gives_up_in_time_and_says_what_to_give():
    """A model far smaller than the spec's wafer (the tiny Llama on wse2, as a small GGUF given with --model and
    no --mesh) has thousands of meshes to try: the search stops at its deadline (here none: after the first
    try) with one line naming a --mesh/--tile the model was placed on and --spec; it once ran 15+ minutes."""
    import re

    import pytest

    from waferrt.cli.common import UsageError
    from waferrt.cli.model import searched_mesh
    from waferrt.core.mesh import MeshSpec
    from waferrt.core.spec import spec_by_name
    from waferrt.model import tiny_config
    from waferrt.scheduler import KVReserve, PlanOptions, plan

    config, spec = tiny_config(), spec_by_name("wse2")
    with pytest.raises(UsageError, match=r"no default mesh found for this model on wse2 in 0 s \(1 meshes tried.*"
                                         r"give --mesh (\d+)x(\d+) --tile (\d+)x(\d+) .*or a smaller --spec") as e:
        searched_mesh(config, spec, KVReserve(512, 8), PlanOptions(), deadline_s=0)
    w, h, tw, th = map(int, re.search(r"--mesh (\d+)x(\d+) --tile (\d+)x(\d+)", str(e.value)).groups())
    assert plan(config, spec, MeshSpec(w, h, tw, th), kv=KVReserve(512, 8)).mesh.width == w  # the advice runs
