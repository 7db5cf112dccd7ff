"""What ``waferrt train`` reports: a step's row (the JSON's), its line, the run's summary, the gradient check.

Contract: :class:`Start` is what a run trains from, :class:`Where` where it trains (the spec, the --mesh
region), :class:`Modelled` a step's modelled seconds; :func:`row` is a step's figures (loss, wall and modelled
seconds, the recomputed forwards', the bytes streamed, tokens/s of both); :func:`text` its line on stdout;
:func:`summary` the run's last line (or the one JSON object of --json); :func:`copy` keeps the weights as a step
starts and :func:`grad_error` is the largest relative difference of the step's gradients from the numpy
reference's at them (--check of the mesh's), :func:`fd_error` from central differences of the reference's loss
at a few coordinates (--check of the reference's own backward, which the reference cannot check).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from waferrt.core.mesh import Region
from waferrt.core.spec import HardwareSpec

if TYPE_CHECKING:  # annotations only: `waferrt train` imports the model and training packages when it runs
    from waferrt.model.config import LlamaConfig
    from waferrt.model.weights import LlamaWeights
    from waferrt.training.adamw import AdamW


@dataclass(frozen=True)
class Start:
    """What a run trains from: the model's config, its weights before the first step, the optimizer."""

    config: LlamaConfig
    weights: LlamaWeights
    hp: AdamW


@dataclass(frozen=True)
class Where:
    """Where a run trains: the --spec wafer and the --mesh region of its cores."""

    spec: HardwareSpec
    region: Region


@dataclass(frozen=True)
class Modelled:
    """A step's modelled seconds: the whole step's, and of them the recomputed forwards'."""

    step_s: float
    recompute_s: float


def copy(config, weights):
    """A copy of the weights as they are now (the reference's gradients are taken at them)."""
    from waferrt.model.backward import named_arrays
    from waferrt.model.weights import assemble

    return assemble(config, ((n, np.array(a)) for n, a in named_arrays(weights).items()))


def grad_error(config, before, tokens, got: dict) -> float:
    """The largest difference of a weight's gradient from the reference's, relative to the largest entry of
    the reference's gradient of that weight."""
    from waferrt.model.backward import loss_and_grads

    want = loss_and_grads(config, before, tokens)[1]
    return max(float(np.max(np.abs(got[n] - g)) / max(float(np.max(np.abs(g))), 1e-30)) for n, g in want.items())


FD_EPS = 1e-2  # central differences in float32: ~1e-4 relative on tiny's largest entries (a step of 1e-3: ~1e-3)


def fd_error(config, before, tokens, got: dict) -> float:
    """An independent check of a step's gradients (the reference's own backward checked against itself
    proves nothing): for the first layer's wq, the last layer's w_down, the final norm and the embedding,
    the central difference of the reference's loss at `got`'s largest entry, FD_EPS either side; the largest
    difference relative to the difference's size."""
    from waferrt.model.backward import loss_and_grads, named_arrays
    from waferrt.model.weights import assemble

    arrays = named_arrays(before)

    def loss_at(name: str, at: tuple, step: float) -> float:
        moved = {n: (np.array(a) if n == name else a) for n, a in arrays.items()}
        moved[name][at] += np.float32(step)
        return loss_and_grads(config, assemble(config, moved.items()), tokens)[0]

    worst = 0.0
    for name in ("layers[0].wq", f"layers[{config.n_layers - 1}].w_down", "final_norm", "embed"):
        at = np.unravel_index(int(np.argmax(np.abs(got[name]))), got[name].shape)
        fd = (loss_at(name, at, FD_EPS) - loss_at(name, at, -FD_EPS)) / (2 * FD_EPS)
        worst = max(worst, abs(float(got[name][at]) - fd) / max(abs(fd), 1e-30))
    return worst


def row(i: int, report, wall: float, modelled: Modelled, shape) -> dict:
    """A step's row."""
    return {"step": i, "loss": report.loss, "wall_s": wall, "modelled_s": modelled.step_s,
            "modelled_recompute_s": modelled.recompute_s, "bytes_in": report.bytes_in, "bytes_out": report.bytes_out,
            "wall_tokens_per_s": shape.tokens / wall, "modelled_tokens_per_s": shape.tokens / modelled.step_s}


def text(row: dict, steps: int) -> str:
    return (f"step {row['step']:>{len(str(steps))}}/{steps}  loss {row['loss']:.4f}  wall {row['wall_s']:.3f} s "
            f"({row['wall_tokens_per_s']:,.0f} tok/s)  modelled {row['modelled_s'] * 1e3:.3f} ms "
            f"({row['modelled_tokens_per_s']:,.0f} tok/s"
            + (f"; recompute {row['modelled_recompute_s'] * 1e3:.3f} ms" if row["modelled_recompute_s"] else "") + ")"
            + (f"  gradients vs {row['grad_check']}: {row['grad_error']:.1e} relative" if "grad_error" in row else ""))


def summary(args, rows: list[dict], saved, where: Where) -> None:
    if args.json:
        print(json.dumps({"model": args.model, "streaming": args.streaming,
                          "mesh": f"{where.region.w}x{where.region.h}", "spec": where.spec.name, "steps": rows,
                          "saved": saved}))
        return
    wall = sum(r["wall_s"] for r in rows)
    print(f"trained {len(rows)} steps: loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f}; wall {wall:.2f} s; "
          f"modelled {rows[0]['modelled_s'] * 1e3:.3f} ms per step; streamed per step: "
          f"{rows[-1]['bytes_in'] / 1e6:.2f} MB in, {rows[-1]['bytes_out'] / 1e6:.2f} MB out"
          + ("" if args.streaming else " (resident: counted as if streamed, nothing crosses)"))
