"""Training's GEMMs on the wafer: a training step's forward, dX and dW for Llama3-8B-shaped matrices at WSE-2 scale.

Contract: ``python benchmarks/train_kernels.py [--tokens 4096,16384] [--sides 360,720]`` prints, from one run
(no Ray, a few seconds):

1. the three products of one GEMM emulated on an 8x8 mesh of four tiles (forward MeshGEMM, dX = dY W^T and
   dW = X^T dY by the transposed variant, waferrt.kernels.gemm / gemm_backward): each equal to numpy, its
   booked cycles next to its closed form's (waferrt.core.train_cost; equal);
2. at WSE-2 scale, from those closed forms, 16-bit values: for each of a Llama3-8B layer's four GEMMs (QKV,
   output, gate+up, down) and each number of tokens per step and grid side, the modelled time of the
   forward, dX and dW and their compute efficiencies (useful flops over modelled time), then a layer's and
   the 32 layers' GEMM time per step and the step's efficiency;
3. with ``--smollm2``: a SmolLM2-135M-shaped block's whole backward (waferrt.training.block, seeded weights, 32
   tokens) emulated on 32x32 WSE-2 cores: each gradient against float64 finite differences (a random
   direction each), what it books op by op against its closed form, its modelled time (~15 s).

Exits non-zero if an emulated product or gradient differs from numpy, the differences or its closed form.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys

import numpy as np

from waferrt.core.cost import Cost, flop_cycles
from waferrt.core.gemm_cost import GemmShape
from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import WSE2
from waferrt.core.train_cost import TRAIN_GEMMS, TrainShape, block_backward_parts, train_efficiency, train_gemm_costs
from waferrt.decode.decoding import ELEMENTWISE_FLOPS
from waferrt.fabric.loop import simulate
from waferrt.kernels.gemm import Grid, collect, meshgemm, place
from waferrt.kernels.gemm_backward import gather, grad_input, grad_weight, scatter
from waferrt.model import synthetic_llama
from waferrt.model.zoo import model_by_name
from waferrt.runtime import Wafer
from waferrt.training.block import block_backward, block_forward, finite_difference

DTYPE = "float16"
DIM, HIDDEN, KV_DIM, LAYERS = 4096, 14336, 1024, 32  # Llama3-8B
LAYER_GEMMS = {"qkv": (DIM, DIM + 2 * KV_DIM), "o": (DIM, DIM), "gate_up": (DIM, 2 * HIDDEN), "down": (HIDDEN, DIM)}


def emulated() -> bool:
    mesh, (m, k, n) = MeshSpec(8, 8, 4, 4), (64, 48, 40)
    rng = np.random.default_rng(0)
    X, W, dY = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (m, n)))
    grid = Grid.of(mesh.region)
    x, w = place("meshgemm", grid, mesh.region, X, W)
    dy = scatter("C", grid, mesh.region, dY)
    runs = {"forward": (meshgemm, dict(a=x, b=w), lambda c: collect("meshgemm", grid, c, m, n), X @ W, "meshgemm"),
            "grad_input": (grad_input, dict(dy=dy, w=w[:, :, 0]), lambda c: gather("A", grid, c, m, k), dY @ W.T,
                           "grad_input"),
            "grad_weight": (grad_weight, dict(x=x[:, :, 0], dy=dy), lambda c: gather("B", grid, c, k, n), X.T @ dY,
                            "grad_weight")}
    want = train_gemm_costs(WSE2, grid.shape(m, k, n))
    print(f"1. emulated on {mesh.width}x{mesh.height} cores ({len(mesh.tiles_of(mesh.region))} tiles), X {m}x{k}, "
          f"W {k}x{n}, float32, {WSE2.name} costs")
    print(f"   {'product':<12}{'numpy':>8}{'booked cycles':>15}{'closed form':>13}")
    ok = True
    for name, (kernel, args, read, numpy, op) in runs.items():
        c, cost = simulate(mesh, WSE2, mesh.region, kernel, **args)
        good = np.allclose(read(c), numpy, rtol=1e-3, atol=1e-3)
        ok &= good and cost[op] == want[name]
        print(f"   {name:<12}{'equal' if good else 'WRONG':>8}{cost[op].cycles:>15,.0f}{want[name].cycles:>13,.0f}")
    return ok


def at_scale(tokens: list[int], sides: list[int]) -> None:
    us = lambda c: c.seconds(WSE2) * 1e6  # noqa: E731
    print(f"\n2. at {WSE2.name} scale from the closed forms, Llama3-8B's layer GEMMs in {DTYPE}: time (us) and "
          "compute efficiency of each product")
    print(f"   {'tokens':>7}{'cores':>10}  {'gemm':<8}" + "".join(f"{p + ' us':>16}{'eff':>6}" for p in TRAIN_GEMMS))
    for t, side in itertools.product(tokens, sides):
        layer = dict.fromkeys(TRAIN_GEMMS, 0.0)
        for name, (k, n) in LAYER_GEMMS.items():
            shape = GemmShape(t, k, n, side, side)
            costs, eff = train_gemm_costs(WSE2, shape, DTYPE), train_efficiency(WSE2, shape, DTYPE)
            layer = {p: layer[p] + us(costs[p]) for p in TRAIN_GEMMS}
            print(f"   {t:>7}{f'{side}x{side}':>10}  {name:<8}"
                  + "".join(f"{us(costs[p]):>16,.1f}{eff[p]:>6.0%}" for p in TRAIN_GEMMS))
        flops = 3 * 2 * t * sum(k * n for k, n in LAYER_GEMMS.values()) / (side * side)
        step = sum(layer.values())
        print(f"   {'':>17}  {'layer':<8}" + "".join(f"{layer[p]:>16,.1f}{'':>6}" for p in TRAIN_GEMMS)
              + f"   step {step:,.0f} us a layer, {LAYERS * step / 1e3:,.1f} ms for {LAYERS} layers, "
                f"{flop_cycles(WSE2, flops, DTYPE) / WSE2.clock_hz * 1e6 / step:.0%} efficient")


def smollm2() -> bool:
    config = dataclasses.replace(model_by_name("smollm2-135m")[0], n_layers=1)
    layer, tokens, side = synthetic_llama(config, seed=0).layers[0], 32, 32
    rng = np.random.default_rng(0)
    x, dy = (rng.standard_normal((tokens, config.dim)).astype(np.float32) for _ in range(2))
    _, saved = block_forward(config, layer, x)
    with Wafer(spec="wse2", mesh=(side, side), tile=(side // 2, side // 2), backend="local") as wafer:
        dx, grads = block_backward(wafer, config, layer, saved, dy)
        booked = wafer.cost().by_op
    print(f"\n3. SmolLM2-135M's block backward on {side}x{side} {WSE2.name} cores, {tokens} tokens: each gradient "
          "along a random direction against float64 finite differences")
    ok = True
    for name, g in dict(grads, x=dx).items():
        u = rng.standard_normal(g.shape)
        got, fd = float((g * u).sum()), finite_difference(config, layer, x, dy, name, u)
        ok &= abs(got - fd) <= 1e-4 * abs(fd)
        print(f"   {name:<10}{got:>16.6f}{fd:>16.6f}  {abs(got - fd) / abs(fd):.1e}")
    want = block_backward_parts(WSE2, config, TrainShape(1, tokens), side, ELEMENTWISE_FLOPS["softmax"])
    same = set(booked) == set(want) and all(
        dataclasses.replace(c, cycles=0) == dataclasses.replace(want[op], cycles=0)
        and abs(c.cycles - want[op].cycles) <= 1e-9 * c.cycles for op, c in booked.items())
    total = sum(booked.values(), Cost())
    print(f"   booked op by op {'=' if same else '!='} train_cost.block_backward_parts; modelled "
          f"{total.seconds(WSE2) * 1e6:,.1f} us, {total.link_bytes / 1e6:,.1f} MB over the links")
    return ok and same


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="4096,16384", help="tokens per step (batch x sequence), comma-separated")
    ap.add_argument("--sides", default="360,720", help="square grids' sides, comma-separated")
    ap.add_argument("--smollm2", action="store_true", help="also emulate a SmolLM2-135M block's backward (~15 s)")
    args = ap.parse_args(argv)
    try:
        tokens, sides = ([int(v) for v in s.split(",")] for s in (args.tokens, args.sides))
    except ValueError:
        ap.error(f"--tokens and --sides are comma-separated whole numbers, got {args.tokens!r} and {args.sides!r}")
    ok = emulated()
    at_scale(tokens, sides)
    if args.smollm2:
        ok &= smollm2()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
