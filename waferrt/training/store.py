"""The off-wafer memory of a training run (Cerebras' MemoryX): the weights, their AdamW state, the updates.

Contract: ``ParamStore(config, weights, hp)`` keeps a float32 copy of every weight (a tied head stays the
embedding), AdamW's moments (zero) and the hyper-parameters. It serves what streams into the wafer --
``rows(inputs)`` (only the embedding rows of the batch's tokens), ``layer(i)`` (a LayerWeights),
``head()`` (the final norm and the head's table) -- and takes what streams out: ``push_layer(i, grads,
push)`` (a layer's weight gradients, applied at once: nothing else of the step reads that layer again) and
``push_top(top, push)`` (the final norm's and the head's gradients and the embedding rows' gradients,
scattered into the table here, off the wafer). Every push carries a :class:`Push` (its step, its payload's
CRC, its attempt: a push of another attempt than ``begin_step``'s is dropped); the CRC is checked here
(``faults.check_payload``: CorruptGradient) before ``adamw_update`` runs on the named weights.
``last_grads`` holds the last step's gradients by weight name (``backward.named_arrays``' names), what a
test compares with the reference's. ``weights()`` is a LlamaWeights view of the current weights;
``snapshot()`` / ``restore(snap)`` copy the weights and the moments out and back; ``begin_step()`` keeps
such a copy and ``rollback()`` returns to it (the last good state a faulted step is redone from).
Pure: no Ray (the Ray actor wrapping it lives in actors/training.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from waferrt.model.backward import check_dense, named_arrays
from waferrt.model.config import LlamaConfig
from waferrt.model.weights import LayerWeights, LlamaWeights, assemble

from .adamw import AdamW, Moments, adamw_update
from .faults import check_payload


@dataclass(frozen=True, eq=False)
class TopGrads:
    """What streams out at the end of a step besides the layers': the final norm's gradient (dim,), the
    head's (vocab, dim) and the gradient of the embedding rows (B, S, dim) of the inputs (B, S)."""

    final_norm: np.ndarray
    head: np.ndarray
    rows: np.ndarray
    inputs: np.ndarray

    def __post_init__(self) -> None:
        if self.rows.shape[:-1] != self.inputs.shape:
            raise ValueError(f"TopGrads: rows {self.rows.shape} are not one per input token {self.inputs.shape}")

    def arrays(self) -> dict[str, np.ndarray]:
        return {"final_norm": self.final_norm, "head": self.head, "rows": self.rows, "inputs": self.inputs}


@dataclass(frozen=True)
class Push:
    """What a gradient payload carries besides its arrays: its optimizer step, its CRC, the attempt (epoch)."""

    step: int
    crc: int
    epoch: int = 0


class ParamStore:
    def __init__(self, config: LlamaConfig, weights: LlamaWeights, hp: AdamW | None = None):
        check_dense(config)
        weights.check(config)
        self.config, self.hp = config, hp or AdamW()
        self.params = {n: np.array(a, dtype=np.float32, copy=True) for n, a in named_arrays(weights).items()}
        self.moments = {n: Moments.zeros(a) for n, a in self.params.items()}
        self.last_grads: dict[str, np.ndarray] = {}
        self._good: dict = {}
        self.epoch = 0

    def rows(self, inputs: np.ndarray) -> np.ndarray:
        return self.params["embed"][inputs]  # (B, S, dim)

    def layer(self, i: int) -> LayerWeights:
        return LayerWeights(**{f: self.params[f"layers[{i}].{f}"] for f in LayerWeights.shapes(self.config)})

    def head(self) -> tuple[np.ndarray, np.ndarray]:
        return self.params["final_norm"], self.params["head" if "head" in self.params else "embed"]

    def begin_step(self, epoch: int) -> None:
        """Keep the weights and moments as they are now (the last good state a faulted step is redone from) and
        take only pushes of attempt `epoch` from now on (a dead tile's late pushes are dropped)."""
        self._good, self.epoch = self.snapshot(), epoch

    def rollback(self) -> None:
        """Back to the state begin_step kept (the updates a faulted step made are undone)."""
        self.restore(self._good)
        self.last_grads = {}

    def push_layer(self, i: int, grads: dict[str, np.ndarray], push: Push) -> None:
        if push.epoch == self.epoch:
            check_payload(grads, push.crc, f"layer {i}'s gradients of step {push.step}")
            self._apply({f"layers[{i}].{f}": g for f, g in grads.items()}, push.step)

    def push_top(self, top: TopGrads, push: Push) -> None:
        if push.epoch != self.epoch:
            return
        check_payload(top.arrays(), push.crc, f"the head's, final norm's and embedding rows' gradients of step "
                                              f"{push.step}")
        embed = np.zeros_like(self.params["embed"])  # the embedding's backward: a scatter-add of the rows
        np.add.at(embed, top.inputs.reshape(-1), top.rows.reshape(-1, top.rows.shape[-1]))
        grads = {"final_norm": top.final_norm}
        if "head" in self.params:
            grads["head"] = top.head
        else:
            embed += top.head  # tied: the head's gradient is the embedding's too
        grads["embed"] = embed
        self._apply(grads, push.step)

    def _apply(self, grads: dict[str, np.ndarray], step: int) -> None:
        unknown = sorted(set(grads) - set(self.params))
        if unknown:
            raise KeyError(f"gradients for {unknown[0]}, which the model has no weight of; name them as "
                           "backward.named_arrays does (e.g. 'layers[0].wq')")
        for name, g in grads.items():
            adamw_update(self.params[name], g, self.moments[name], step, self.hp)
            self.last_grads[name] = g

    def weights(self) -> LlamaWeights:
        return assemble(self.config, self.params.items())

    def snapshot(self) -> dict:
        return {n: (a.copy(), self.moments[n].m.copy(), self.moments[n].v.copy()) for n, a in self.params.items()}

    def restore(self, snap: dict) -> None:
        for n, (a, m, v) in snap.items():
            self.params[n][...] = a
            self.moments[n].m[...], self.moments[n].v[...] = m, v
