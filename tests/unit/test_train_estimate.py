"""Training on paper (waferrt.estimator.train) and the wafer template (core.template): figures by hand, the
parts tied to their owners, the one-die presets unchanged, and the planner's choice."""

import dataclasses

import pytest

from waferrt.core.spec import WSE2, WSE3
from waferrt.core.template import TEMPLATES, DieLinks, WaferTemplate, template_by_name
from waferrt.core.topology import Topology
from waferrt.core.train_cost import HeadTooLarge, TrainShape
from waferrt.estimator.train import (
    STATE_BYTES,
    TrainJob,
    activation_bytes,
    estimate_train,
    line_d2d_seconds,
    model_flops_per_token,
    pipeline,
    tensor_stream,
    weight_streaming,
)
from waferrt.estimator.train_layer import Grid, Work, pass_cost
from waferrt.model.config import LlamaConfig
from waferrt.model.zoo import model_by_name

SMALL = LlamaConfig(vocab_size=100, dim=8, n_layers=2, n_heads=2, n_kv_heads=1, hidden_dim=16, max_seq_len=64)


def test_the_flops_and_bytes_by_hand():
    # a layer: q, o 8x8; k, v 8x4; three 8x16 FFN matrices; two norms of 8 = 64*2 + 32*2 + 384 + 16 = 592
    assert SMALL.layer_params(active=True) == 592
    # 3 x (2 x (2 x 592 + 100 x 8) + 2 layers x 2 x 32 positions x 8)
    assert model_flops_per_token(SMALL, 32) == 3 * (2 * (2 * 592 + 800) + 2 * 2 * 32 * 8)
    assert activation_bytes(SMALL, "bfloat16") == 2 * (6 * 8 + 2 * 4 + 3 * 16)


def test_the_one_die_presets_are_the_specs_unchanged():
    assert TEMPLATES["wse2"].spec is WSE2 and TEMPLATES["wse3"].spec is WSE3
    assert TEMPLATES["wse2"].d2d_bisection_bytes_per_s() == float("inf")
    dojo = TEMPLATES["dojo"]
    assert dojo.mesh == (90, 100) and dojo.cores == 25 * 360 and dojo.spec.full_mesh == (90, 100)
    assert dojo.d2d_bisection_bytes_per_s() == 10e12  # Hot Chips 34: "10 TB/s on-tile bisection bandwidth"
    d1 = dojo.die  # AI Day 2021: 512 GB/s per node and direction; 362 TFLOPS bfloat16 on 354 nodes
    assert d1.link_bytes_per_cycle * d1.clock_hz == 512e9
    assert d1.flops_per_cycle_at("bfloat16") * d1.clock_hz * 354 == pytest.approx(362e12, rel=0.002)


def test_a_template_refuses_dies_without_links():
    with pytest.raises(ValueError, match=r"2x1 dies need die-to-die links"):
        WaferTemplate("two", WSE2.replace(full_mesh=(10, 10)), (2, 1))
    with pytest.raises(ValueError, match="unknown wafer template 'wse9'"):
        template_by_name("wse9")


def test_weight_streaming_streams_the_weights_in_twice_and_the_gradients_out_each_pass():
    config, _ = model_by_name("smollm2-135m")
    job, t = TrainJob(config, TrainShape(64, 1024)), TEMPLATES["wse2"]
    st = weight_streaming(job, t)
    passes = int(st.detail.split()[0])
    assert st.breakdown.io == pytest.approx(passes * 3 * config.params() * 2 / WSE2.ingress_bytes_per_s)
    mb = 64 // passes  # every pass runs the emulator's closed forms on the wafer (estimator.train_layer)
    kernels = pass_cost(WSE2, Work(config, config.n_layers, mb, 1024, "bfloat16"), Grid(*WSE2.full_mesh))
    compute, fabric = kernels.seconds(WSE2, "bfloat16")
    assert (st.breakdown.compute, st.breakdown.fabric) == (passes * compute, passes * fabric)
    assert kernels.side < 750 and kernels.grad_sync.cycles > 0  # smaller squares, their gradients summed
    assert st.step_s == max(st.breakdown.compute + st.breakdown.fabric, st.breakdown.io)


def test_the_squares_side_is_chosen_with_the_die_to_die_traffic_it_makes():
    """On dies joined by slow links (1 GB/s an edge), the side whose kernels are fastest on the fabric (32)
    makes more squares whose gradients' ring crosses the edges: the pass takes the side for which kernels
    and die-to-die together take least (64), not the fabric's own choice."""
    from waferrt.estimator.train import _d2d, _kernels
    from waferrt.estimator.train_layer import pass_costs

    config, _ = model_by_name("smollm2-135m")
    t = WaferTemplate("slow-d2d", WSE2.replace(name="die", full_mesh=(64, 64)), (4, 4), DieLinks(1e9, 1e-7))
    work, grid = Work(config, config.n_layers, 64, 256, "bfloat16"), Grid(*t.spec.full_mesh)
    total = {c.side: sum(c.seconds(t.spec, "bfloat16")) + _d2d(t, grid, c, c.seconds(t.spec, "bfloat16")[1])
             for c in pass_costs(t.spec, work, grid)}
    assert pass_cost(t.spec, work, grid).side == 32 and min(total, key=total.get) == 64
    assert _kernels(TrainJob(config, TrainShape(64, 256)), t, work, grid).seconds == pytest.approx(total[64])


def test_the_die_edges_bound_a_ring_that_crosses_them():
    t = TEMPLATES["temp"]  # dies of 64x64 cores, 4 TB/s per edge, 200 ns
    assert line_d2d_seconds(t, 64, 1e6) == 0.0  # inside one die
    assert line_d2d_seconds(t, 128, 1e6) == pytest.approx(2 * 127 / 128 * 1e6 * 64 / 4e12 + 2 * 127 * 200e-9)


def test_a_resident_strategy_that_cannot_hold_the_weights_says_so():
    config, _ = model_by_name("llama3-8b")
    est = estimate_train(TrainJob(config, TrainShape(256, 2048), label="Llama3-8B"), TEMPLATES["wse2"])
    ws, pp, ts = est.strategies
    assert ws.fits and not pp.fits and not ts.fits and est.chosen is ws
    assert "do not fit in the wafer's 36.6 GB" in ts.detail
    assert ws.breakdown.bound == "fabric"  # not the I/O: a square recomputes the layers it cannot keep (recompute_cost)
    assert 0 < ws.mfu < 1 and ws.tokens_per_s == pytest.approx(256 * 2048 / ws.step_s)


def test_the_pipeline_pays_its_bubble_and_keeps_the_optimizer_state_when_it_fits():
    config, _ = model_by_name("smollm2-135m")
    job, t = TrainJob(config, TrainShape(256, 2048)), TEMPLATES["wse2"]
    st = pipeline(job, t)
    r, m = int(st.detail.split()[0]), int(st.detail.split()[2])
    assert config.n_layers % r == 0 and r >= 2 and "optimizer state on the wafer" in st.detail
    b = st.breakdown  # every part over the m + r - 1 slots; a slot lasts its kernels or its die edges
    assert st.step_s == pytest.approx(max(b.compute + b.fabric, b.d2d) + b.io)
    assert f"bubble {(r - 1) / (m + r - 1):.0%}" in st.detail
    assert config.params() * STATE_BYTES <= t.sram_bytes() / 2


def test_tensor_stream_gathers_over_the_dies_and_one_die_has_no_d2d():
    config, _ = model_by_name("smollm2-135m")
    job = TrainJob(config, TrainShape(64, 1024))
    assert tensor_stream(job, TEMPLATES["wse2"]).breakdown.d2d == 0.0
    temp = TEMPLATES["temp"]
    slow = temp.replace(d2d=DieLinks(temp.d2d.bytes_per_s / 4, temp.d2d.latency_s))
    fast, slow = tensor_stream(job, temp), tensor_stream(job, slow)  # a quarter the rate: 4x the busiest edge's time
    extra = 3 * fast.layout.busiest_bytes / temp.d2d.bytes_per_s
    assert slow.breakdown.d2d - fast.breakdown.d2d == pytest.approx(extra)


def test_a_torus_shortens_the_fabric_and_the_planner_says_why():
    config, _ = model_by_name("smollm2-135m")
    job = TrainJob(config, TrainShape(64, 1024), label="SmolLM2")
    mesh = estimate_train(job, TEMPLATES["watos"])
    torus = estimate_train(job, template_by_name("watos", Topology("torus")))
    assert all(b.breakdown.fabric <= a.breakdown.fabric for a, b in zip(mesh.strategies, torus.strategies, strict=True))
    assert mesh.chosen.step_s == min(s.step_s for s in mesh.strategies if s.fits)
    assert mesh.why.startswith(f"the shortest step, bound by {mesh.chosen.breakdown.bound}")
    memory = estimate_train(job, TEMPLATES["watos"], "memory")
    assert memory.chosen.sram_per_core == min(s.sram_per_core for s in memory.strategies if s.fits)
    assert "Llama" not in mesh.text() and "chosen (throughput)" in mesh.text()


def test_a_job_checks_its_numbers():
    with pytest.raises(ValueError, match="more than the model's context of 64"):
        TrainJob(SMALL, TrainShape(1, 65))
    with pytest.raises(ValueError, match="TrainShape.batch must be a whole number >= 1"):
        TrainJob(SMALL, TrainShape(0, 8))
    with pytest.raises(TypeError, match="TrainShape"):
        TrainJob(SMALL, 2, 8)
    with pytest.raises(ValueError, match="one of throughput, memory"):
        estimate_train(TrainJob(SMALL, TrainShape(1, 8)), TEMPLATES["wse2"], "latency")
    assert dataclasses.replace(TrainJob(SMALL, TrainShape(2, 8)), dtype="float32").shape.tokens == 16


def test_a_pass_over_die_edges_loads_them_and_one_die_does_not():
    config, _ = model_by_name("smollm2-135m")
    job, temp = TrainJob(config, TrainShape(64, 1024)), TEMPLATES["temp"]  # 8x8 dies of 64x64 cores
    assert weight_streaming(job, TEMPLATES["wse2"]).breakdown.d2d == 0.0
    slow = temp.replace(d2d=DieLinks(temp.d2d.bytes_per_s / 4, temp.d2d.latency_s))
    fast_d2d, slow_d2d = (weight_streaming(job, t).breakdown.d2d for t in (temp, slow))
    assert 0 < fast_d2d < slow_d2d and weight_streaming(job, slow).breakdown.compute == \
        weight_streaming(job, temp).breakdown.compute  # the edges' rate changes the edges' time only


def test_squares_too_small_for_the_heads_jobs_are_not_taken():
    """SmolLM2, 4 sequences of 8,192 on WSE-2: the pipeline's 31x31 sub-squares cannot hold the head's jobs even
    in chunks (core.train_cost.HeadTooLarge); the grid takes a larger square, and every strategy answers."""
    config, _ = model_by_name("smollm2-135m")
    est = estimate_train(TrainJob(config, TrainShape(4, 8192)), TEMPLATES["wse2"])
    assert all(s.fits for s in est.strategies)
    work = Work(config, config.n_layers // 6, 1, 8192, "bfloat16")  # the last of 6 stages, with the head
    with pytest.raises(HeadTooLarge, match="even one word a core"):
        pass_cost(WSE2, work, Grid(125, 994), 31)
    assert pass_cost(WSE2, work, Grid(125, 994)).side > 31
