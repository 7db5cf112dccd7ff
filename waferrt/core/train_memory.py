"""What a training step keeps in the cores' SRAM between a layer's forward and its backward, and which layers
it recomputes instead: closed forms per core of the side x side square the training kernels run on (float32).

Contract (the owners of these facts; ``training.kept`` runs them, ``training.cost`` and the estimator cost them):
- ``kept_core_bytes(config, shape, side) -> KeptBytes``: a layer's activations kept for its backward (its
  input x, h1, x2, h2 (T, dim); q and att per query head, k and v per K/V head (T, head_dim); gate, up, m
  (T, hidden): the blocks ``training.forward.forward_kernel`` leaves, in the layouts ``training.block``'s
  backward reads) and a recomputed layer's (its input x alone, the checkpoint its forward re-runs from).
- ``layer_job_core_bytes(config, shape, side)``: a layer's largest job besides what the step keeps -- its
  backward: the weights, RoPE's cos and sin and dy in; the gradients and dx out.
- ``keep_plan(spec, config, shape, side) -> KeepPlan``: every layer's forward runs before any backward, so
  the SRAM holds the kept activations of all layers at once, with the largest job on top (a layer's, or the
  head's in ``head_chunks`` chunks of the vocabulary). The plan keeps everything for as many layers as fit
  and keeps only x for the others, re-running their forward just before their backward (its cycles a
  forward's, ``KeepPlan.recomputed``). The recomputed are the first layers (0..recomputed-1): their backwards
  come last, when the later layers' activations are freed, so a recomputation never adds to the peak but
  when every layer is recomputed. The head takes the fewest chunks that fit in what the kept activations
  leave. ``KeepPlan.fits`` is False when not even all-recomputed fits (the kernels then raise BlockTooLarge
  naming the core and the bytes).
`shape` is the step's batch (``core.train_cost.TrainShape``): a core's block of its tokens is
``square_tokens(shape, side) / side`` (each sequence padded to slices, as the kernels lay it); the head runs
over the batch's tokens unpadded.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .arith import cdiv
from .gemm_cost import GemmShape
from .spec import HardwareSpec
from .train_cost import TrainShape, head_chunks, head_core_bytes, square_tokens

FLOAT32 = 4


@dataclass(frozen=True)
class KeptBytes:
    """Bytes per core one layer keeps from its forward to its backward: all its activations, or (recomputed)
    its input x alone."""

    layer: int
    checkpoint: int

    def __post_init__(self) -> None:
        if not 0 < self.checkpoint <= self.layer:
            raise ValueError(f"a layer keeps its input x ({self.checkpoint} bytes) within all it keeps "
                             f"({self.layer} bytes)")

    def held(self, kept: int, recomputed: int) -> int:
        """Bytes per core of `kept` layers' activations and `recomputed` layers' inputs."""
        return kept * self.layer + recomputed * self.checkpoint


def _blocks(config, shape: TrainShape, side: int) -> tuple[int, int, int, int]:
    """(mb, nb, hb, db): a core's block of the square's tokens, of dim, of hidden and of head_dim."""
    return tuple(cdiv(v, side) for v in (square_tokens(shape, side), config.dim, config.hidden_dim, config.head_dim))


def kept_core_bytes(config, shape: TrainShape, side: int, size: int = FLOAT32) -> KeptBytes:
    """A layer's kept bytes per core, all or x alone, values of `size` bytes (module doc)."""
    mb, nb, hb, db = _blocks(config, shape, side)
    heads = 2 * (config.n_heads + config.n_kv_heads)  # q and att, k and v
    return KeptBytes(size * (4 * mb * nb + heads * mb * db + 3 * mb * hb), size * mb * nb)


def layer_job_core_bytes(config, shape: TrainShape, side: int, size: int = FLOAT32) -> int:
    """Bytes per core of a layer's backward job besides the kept activations, values of `size` bytes (module
    doc)."""
    mb, nb, hb, db = _blocks(config, shape, side)
    weights = 2 * nb + 2 * (config.n_heads + config.n_kv_heads) * nb * db + 3 * nb * hb
    return size * (2 * weights + 2 * mb * db + 2 * mb * nb)  # weights and their gradients; cos, sin; dy, dx


@dataclass(frozen=True)
class KeepPlan:
    """A step's SRAM plan: layers 0..recomputed-1 keep x alone and run their forward again before their
    backward, the other `kept` keep all their activations; the head in `head_chunks` chunks; `peak` bytes a
    core holds at most (of `sram`)."""

    kept: int
    recomputed: int
    head_chunks: int
    peak: int
    sram: int

    @property
    def fits(self) -> bool:
        return self.peak <= self.sram

    def recomputes(self, layer: int) -> bool:
        return layer < self.recomputed

    def overflow(self, side: int, core: str, spec_name: str) -> str:
        """Why a plan that does not fit is refused, said once for the command line and the step: the square,
        the core, its bytes at the fullest (every layer recomputed) against its SRAM."""
        return (f"core {core} (and every other) of the {side}x{side} square would hold {self.peak:,} bytes at "
                f"its fullest even with every layer recomputed ({self.recomputed} layers keep only their input "
                f"x), more than its SRAM ({self.sram:,} bytes on {spec_name})")

    def __str__(self) -> str:
        layers = self.kept + self.recomputed
        if not self.recomputed:
            return f"all {layers} layers' activations kept on the tiles ({self.peak:,} of {self.sram:,} bytes a core)"
        which = "layer 0 keeps its input and is" if self.recomputed == 1 else \
            f"layers 0..{self.recomputed - 1} keep their input and are"
        return (f"{self.kept} of {layers} layers' activations kept on the tiles; {which} recomputed before the "
                f"backward ({self.peak:,} of {self.sram:,} bytes a core)")


@dataclass(frozen=True)
class Square:
    """A step's batch `shape` on a `side` x `side` square, values of `size` bytes (the kernels': float32)."""

    shape: TrainShape
    side: int
    size: int = FLOAT32

    def __post_init__(self) -> None:
        if min(self.side, self.size) < 1:
            raise ValueError(f"a square runs on >= 1 core a side at >= 1 byte a value, got {self}")


def _head(spec: HardwareSpec, config, square: Square, kept: int) -> tuple[int, int] | None:
    """(the head's chunks, the bytes a core holds as it runs) with `kept` layers' activations kept, or None when
    the head has no chunking that fits beside them."""
    per, shape = kept_core_bytes(config, square.shape, square.side, square.size), _head_shape(config, square)
    held = per.held(kept, config.n_layers - kept)
    try:
        chunks = head_chunks(spec.replace(sram_bytes=max(spec.sram_bytes - held, 1)), shape)
    except ValueError:
        return None
    job = layer_job_core_bytes(config, square.shape, square.side, square.size)
    return chunks, held + max(job, head_core_bytes(shape, chunks))


def _head_shape(config, square: Square) -> GemmShape:
    tokens = square.shape.tokens  # the head's rows: the batch's tokens, unpadded
    return GemmShape(tokens, config.vocab_size, config.dim, square.side, square.side)  # (tokens, vocab, dim)


def _peak(per: KeptBytes, recomputed: int, at_head: int, job: int) -> int:
    """The most a core holds: as the head runs (every layer's kept), or as the last recomputed layer (layer
    recomputed-1) has its activations back for its backward (the layers before it holding x, the later freed)."""
    return max(at_head, per.held(0, recomputed - 1) + per.layer + job) if recomputed else at_head


@lru_cache(maxsize=4096)  # the estimator's sweeps ask again for the same squares
def keep_plan(spec: HardwareSpec, config, shape: TrainShape, side: int, size: int = FLOAT32) -> KeepPlan:
    """The most layers kept that fit, the rest recomputed (module doc); all recomputed when none fits. `size`
    the bytes of a kept value (the kernels: float32; the estimator: its dtype's).
    The bytes as the head runs grow with the layers kept, those of the last recomputed layer's backward shrink:
    the most kept whose head fits (a bisection) is the plan, and if its recomputation does not fit, none does."""
    square, layers = Square(shape, side, size), config.n_layers
    per, job = kept_core_bytes(config, shape, side, size), layer_job_core_bytes(config, shape, side, size)

    def head_fits(kept: int) -> bool:
        head = _head(spec, config, square, kept)
        return head is not None and head[1] <= spec.sram_bytes

    if not head_fits(0):
        head = _head(spec, config, square, 0)
        chunks, at_head = head if head is not None else (1, per.held(0, layers) + job)
        return KeepPlan(0, layers, chunks, _peak(per, layers, at_head, job), spec.sram_bytes)
    lo, hi = 0, layers
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if head_fits(mid) else (lo, mid - 1)
    chunks, at_head = _head(spec, config, square, lo)
    return KeepPlan(lo, layers - lo, chunks, _peak(per, layers - lo, at_head, job), spec.sram_bytes)
