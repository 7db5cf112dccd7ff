"""The project's own models as GGUF files: a named shape cut to a few layers, with seeded random weights.

Contract: :class:`Cut` says what to write (a named shape of ``zoo.MODELS``, how many layers, the vocabulary,
the seed, the storage dtype); ``Cut.config()`` is the model's LlamaConfig and :func:`write_cut(path, cut)`
writes it as a llama GGUF (``gguf_writer``), one tensor generated at a time
(``weights.synthetic_tensors``), and returns the config. Every dimension but the layers and the vocabulary is
the named model's. One thing is cut on purpose, and said in the file's name by the caller:

- the vocabulary (``vocab``, default the shape's own): a real vocabulary's table is rows of the same kind
  as a smaller one's; a cut keeps the file and the embedding region small;
- nothing else: the output head is the shape's own (Llama3-8B's untied: an ``output.weight`` of its own, which
  the planner places in a region of its own, ``scheduler.types.Placement.head``; SmolLM2's tied).

``dtype`` is what the tensors are written as (:data:`VALUE_DTYPES`): float16 (the default: F16 tensors, half
the file) or float32. A wafer that stores its weights in float16 (``--dtype float16``) then holds exactly the
values the numpy reference computes with (the reference reads them back as float32), so the two give the same
tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .config import LlamaConfig
from .weights import synthetic_tensors
from .zoo import MODELS

VALUE_DTYPES = ("float16", "float32")  # what the tensors are written as: F16 or F32


@dataclass(frozen=True)
class Cut:
    """A named model shape cut to `layers` layers and `vocab` tokens (0: the shape's own), seeded weights."""

    shape: str  # a name of zoo.MODELS (case-insensitive)
    layers: int
    vocab: int = 0
    seed: int = 0
    dtype: str = "float16"

    def __post_init__(self) -> None:
        if self.shape.lower() not in MODELS:
            raise ValueError(f"shape {self.shape!r} is not a named model; use one of {', '.join(sorted(MODELS))}")
        for name in ("layers", "vocab", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} is a whole number, got {value!r}")
        full = MODELS[self.shape.lower()].config
        if not 1 <= self.layers <= full.n_layers:
            raise ValueError(f"layers {self.layers} is not 1..{full.n_layers} ({self.shape} has {full.n_layers})")
        if not (self.vocab == 0 or 256 <= self.vocab <= full.vocab_size):
            raise ValueError(f"vocab {self.vocab} is not 256..{full.vocab_size} (the 256 byte tokens at least, "
                             f"{self.shape}'s {full.vocab_size} at most), or 0 for the shape's own")
        if self.dtype not in VALUE_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(VALUE_DTYPES)} (F16 or F32 tensors)")
        if self.seed < 0:
            raise ValueError(f"seed {self.seed} is negative; use a whole number >= 0")

    def config(self) -> LlamaConfig:
        """The named shape with this cut's layers and vocabulary (its head tied or untied as the shape's own)."""
        full = MODELS[self.shape.lower()].config
        return replace(full, n_layers=self.layers, vocab_size=self.vocab or full.vocab_size)

    def describe(self) -> str:
        full = MODELS[self.shape.lower()]
        c = self.config()
        tied = ", head tied to the embedding" if full.config.tie_embeddings else ", untied output head"
        return (f"{full.label} cut to {c.n_layers} of {full.config.n_layers} layers, vocab {c.vocab_size} of "
                f"{full.config.vocab_size}{tied}: dim {c.dim}, heads {c.n_heads}/{c.n_kv_heads}, head_dim "
                f"{c.head_dim}, hidden {c.hidden_dim}, rope theta {c.rope_theta:g}; {c.params() / 1e9:.2f} B "
                f"parameters, seed {self.seed}, {self.dtype} values")


def write_cut(path: str | Path, cut: Cut) -> LlamaConfig:
    """Write `cut` as a llama GGUF at `path` (module docstring); its config."""
    from .gguf_writer import write_tensors

    config = cut.config()
    dtype = np.dtype(cut.dtype)
    write_tensors(Path(path), config, ((name, a.astype(dtype, copy=False))
                                       for name, a in synthetic_tensors(config, cut.seed)), dtype)
    return config
