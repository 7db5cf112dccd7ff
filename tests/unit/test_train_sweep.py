"""The training co-exploration (waferrt.estimator.train_sweep): the area model by hand, every design within
one WSE-2's area, the best design per strategy, and `waferrt sweep --train`'s table and PNG."""

import json

import pytest

from waferrt.cli import main
from waferrt.core.template import TEMPLATES
from waferrt.core.topology import Topology
from waferrt.core.train_cost import TrainShape
from waferrt.estimator.sweep import AREA_BUDGET_MM2, LOGIC_UM2, core_area_um2
from waferrt.estimator.train import STRATEGIES, TrainJob
from waferrt.estimator.train_sweep import PHY_MM2_PER_TBPS, TrainDesign, TrainGrid, best_per_strategy, train_sweep
from waferrt.model.zoo import model_by_name

SMALL_GRID = TrainGrid(dies=((1, 1), (2, 2)), sram_bytes=(48 * 1024, 96 * 1024), half_flops_per_cycle=(8.0,),
                       d2d_bytes_per_s=(1e12, 4e12), topologies=(Topology("mesh"), Topology("torus")))


def test_the_area_model_by_hand():
    wse2_like = TrainDesign((1, 1), 48 * 1024, 8.0, 1e12, Topology())
    assert wse2_like.core_um2() == core_area_um2(48 * 1024) and wse2_like.phy_mm2() == 0
    w, h = wse2_like.die_mesh()  # one WSE-2's area of WSE-2 cores: its 850,000 (rounding down)
    assert 849_000 <= w * h <= 850_000 and abs(w - h) <= 1
    fast = TrainDesign((2, 2), 48 * 1024, 16.0, 4e12, Topology())
    assert fast.core_um2() == pytest.approx(core_area_um2(48 * 1024) + LOGIC_UM2 / 2)
    assert fast.phy_mm2() == 2 * 4 * PHY_MM2_PER_TBPS * 4  # 4 inner edges of a 2x2, a PHY on each side, 4 TB/s
    dw, dh = fast.die_mesh()
    assert 4 * dw * dh * fast.core_um2() / 1e6 + fast.phy_mm2() <= AREA_BUDGET_MM2


def test_the_grid_and_the_best_per_strategy():
    assert len(SMALL_GRID.designs()) == 2 * 2 + 2 * 2 * 2  # one die: no d2d to vary
    config, label = model_by_name("smollm2-135m")
    points = train_sweep(TrainJob(config, TrainShape(64, 1024), label=label), TEMPLATES["wse2"], SMALL_GRID)
    best = best_per_strategy(points)
    for s in STRATEGIES:
        assert best[s].tokens_per_s(s) == max(p.tokens_per_s(s) for p in points)
    assert {p.design.topology.kind for p in points} == {"mesh", "torus"}


def test_sweep_train_writes_its_table_and_png(tmp_path, capsys):
    png = tmp_path / "train.png"
    argv = ["sweep", "--train", "--model", "smollm2-135m", "--global-batch", "64", "--seq", "1024", "--dies",
            "1x1,2x2", "--sram", "48,96", "--flops", "8", "--d2d", "1,4", "--topology", "mesh,torus", "--png", str(png)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "best for pipeline:" in out and "<- " in out and png.stat().st_size > 10_000
    assert main(argv + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows["designs"]) == 12 and set(rows["best"]) == set(STRATEGIES)
