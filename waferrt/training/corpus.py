"""The training corpus the project makes itself, and the batcher that cuts it into training rows.

Contract: ``project_text(root)`` is the project's own documentation -- README.md, then docs/*.md in name
order -- joined by blank lines (no download); FileNotFoundError names what is missing (an install without
the source tree has no docs: give a text file instead). ``Corpus(ids)`` is the token ids of such a text,
encoded by the model's own tokenizer (the caller's ``encode``: this floor reads no model files).
``Batcher(corpus, batch, seq, seed)`` draws rows: ``rows(step)`` gives (batch, seq + 1) int64 ids, each row a
window of the corpus starting at a seeded random offset (numpy's PCG64 seeded [seed, step]), so the same
seed gives the same batches in any process, in any order of asking.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


def project_text(root: Path) -> str:
    """README.md and docs/*.md of the source tree at `root`, joined by blank lines."""
    files = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    missing = [str(f) for f in files if not f.is_file()]
    if missing or len(files) < 2:
        raise FileNotFoundError(f"the training corpus is the project's own docs, but {missing or root / 'docs'} "
                                "is missing; run from a source checkout of waferrt")
    return "\n\n".join(f.read_text(encoding="utf-8") for f in files)


@dataclass(frozen=True, eq=False)
class Corpus:
    """Token ids (n,) int64 of a training text."""

    ids: np.ndarray

    def __post_init__(self) -> None:
        if self.ids.ndim != 1 or not np.issubdtype(self.ids.dtype, np.integer):
            raise ValueError(f"Corpus ids must be a 1-d integer array, got {self.ids.dtype}{self.ids.shape}")

    @classmethod
    def encode(cls, text: str, encode) -> Corpus:
        """The ids of `text` by the tokenizer's `encode` (text -> list of ids)."""
        return cls(np.asarray(encode(text), dtype=np.int64))


@dataclass(frozen=True, eq=False)
class Batcher:
    """Seeded training rows of a corpus: B sequences of S + 1 tokens (inputs and their next tokens)."""

    corpus: Corpus
    batch: int
    seq: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch < 1 or self.seq < 1:
            raise ValueError(f"a batch is B >= 1 sequences of S >= 1 tokens, got B={self.batch}, S={self.seq}")
        if self.corpus.ids.size < self.seq + 1:
            raise ValueError(f"the corpus has {self.corpus.ids.size} tokens, fewer than a sequence of S + 1 = "
                             f"{self.seq + 1}; give a smaller --seq")

    def rows(self, step: int) -> np.ndarray:
        """The rows of training step `step` (0, 1, ...): (B, S + 1) int64."""
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, self.corpus.ids.size - self.seq, size=self.batch)  # (B,)
        return np.stack([self.corpus.ids[s: s + self.seq + 1] for s in starts])
