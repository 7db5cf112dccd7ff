"""Training's GEMMs on the wafer: a training step's forward, dX and dW for Llama3-8B-shaped matrices at WSE-2 scale.

Contract: ``python benchmarks/train_kernels.py [--tokens 4096,16384] [--sides 360,720]`` prints, from one run
(no Ray, a few seconds):

1. the three products of one GEMM emulated on an 8x8 mesh of four tiles (forward MeshGEMM, dX = dY W^T and
   dW = X^T dY by the transposed variant, waferrt.kernels.gemm / gemm_backward): each equal to numpy, its
   booked cycles next to its closed form's (waferrt.core.train_cost; equal);
2. at WSE-2 scale, from those closed forms, 16-bit values: for each of a Llama3-8B layer's four GEMMs (QKV,
   output, gate+up, down) and each number of tokens per step and grid side, the modelled time of the
   forward, dX and dW and their compute efficiencies (useful flops over modelled time), then a layer's and
   the 32 layers' GEMM time per step and the step's efficiency.

Exits non-zero if an emulated product differs from numpy or from its closed form.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import numpy as np

from waferrt.core.cost import flop_cycles
from waferrt.core.gemm_cost import GemmShape
from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import WSE2
from waferrt.core.train_cost import TRAIN_GEMMS, train_efficiency, train_gemm_costs
from waferrt.fabric.loop import simulate
from waferrt.kernels.gemm import Grid, collect, meshgemm, place
from waferrt.kernels.gemm_backward import gather, grad_input, grad_weight, scatter

DTYPE = "float16"
DIM, HIDDEN, KV_DIM, LAYERS = 4096, 14336, 1024, 32  # Llama3-8B
LAYER_GEMMS = {"qkv": (DIM, DIM + 2 * KV_DIM), "o": (DIM, DIM), "gate_up": (DIM, 2 * HIDDEN), "down": (HIDDEN, DIM)}


def emulated() -> bool:
    mesh, (m, k, n) = MeshSpec(8, 8, 4, 4), (64, 48, 40)
    rng = np.random.default_rng(0)
    X, W, dY = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (m, n)))
    grid, shape = Grid.of(mesh.region), mesh.region.shape
    x, w = place("meshgemm", grid, shape, X, W)
    dy = scatter("C", grid, shape, dY)
    runs = {"forward": (meshgemm, dict(a=x, b=w), lambda c: collect("meshgemm", grid, c, m, n), X @ W, "meshgemm"),
            "grad_input": (grad_input, dict(dy=dy, w=w[:, :, 0]), lambda c: gather("A", grid, c, (m, k)), dY @ W.T,
                           "grad_input"),
            "grad_weight": (grad_weight, dict(x=x[:, :, 0], dy=dy), lambda c: gather("B", grid, c, (k, n)), X.T @ dY,
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="4096,16384", help="tokens per step (batch x sequence), comma-separated")
    ap.add_argument("--sides", default="360,720", help="square grids' sides, comma-separated")
    args = ap.parse_args(argv)
    try:
        tokens, sides = ([int(v) for v in s.split(",")] for s in (args.tokens, args.sides))
    except ValueError:
        ap.error(f"--tokens and --sides are comma-separated whole numbers, got {args.tokens!r} and {args.sides!r}")
    ok = emulated()
    at_scale(tokens, sides)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
