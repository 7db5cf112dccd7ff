"""Does a request's arithmetic depend on the requests beside it? A deterministic check on SmolLM2 (no Ray).

    python benchmarks/row_independence.py                 # SmolLM2's first 2 layers and its head
    python benchmarks/row_independence.py --layers 30

Request A (a prompt of 100 tokens, then 4 decode steps) goes through SmolLM2's first ``--layers`` layers and
the head twice: alone in slot 0 (its prompt whole, then one token a step), and among others -- in slot 5, its
prompt cut in two chunks behind a 300-token prompt and a 7-token one, each decode step shared with two more
requests (so its row sits elsewhere, its micro-batches hold 3 to 300 rows, and the longest context beside it
is 300 positions against its own ~100). Every one of A's outputs -- each layer's activations and the logits --
must be bit-identical between the two runs: what makes a served request's tokens those of the same request
decoded alone, whatever else is in flight (waferrt.decode.net: why, and how). Prints, per output, how many of
A's rows differ and by how much; exits 1 when any does. tests/unit/test_row_independence.py runs it on one
layer.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np

from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.core.spec import WSE2
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.pack import Chunks, pack_embed, pack_layer
from waferrt.decode.shards import EmbedShard, LayerShard

LAYER_REGION, HEAD_REGION = Region(0, 0, 29, 16), Region(0, 0, 58, 64)  # SmolLM2's default placement's sizes
SLOTS, KV_TOKENS = 8, 522
LENGTHS = (100, 4, 300)  # A's prompt, its decode steps, the long prompt beside it


@dataclasses.dataclass
class Stack:
    """A model's first layers and its head on their regions, with their K/V caches."""

    layers: list
    head: EmbedShard
    split: Chunks  # the residual stream over a layer region's columns
    head_split: Chunks  # ... over the head region's

    @classmethod
    def of(cls, config, weights, n: int) -> Stack:
        dec = Decoding(config)
        layers = [LayerShard(dec, LAYER_REGION, pack_layer(config, weights.layers[i], LAYER_REGION),
                             KVCapacity(SLOTS, KV_TOKENS), Ledger(WSE2)) for i in range(n)]
        head = EmbedShard(config, HEAD_REGION, pack_embed(config, weights.embed, weights.final_norm, HEAD_REGION),
                          Ledger(WSE2))
        return cls(layers, head, Chunks(config.dim, LAYER_REGION.w), Chunks(config.dim, HEAD_REGION.w))

    def step(self, mb: list[tuple]) -> list[np.ndarray]:
        """One micro-batch of (request, slot, token, position) rows -> request A's rows of every layer's output,
        and their logits."""
        slots, toks, poss = (np.array(c, np.int64) for c in zip(*[r[1:] for r in mb], strict=True))
        mine = [i for i, row in enumerate(mb) if row[0] == "A"]
        x = self.split.split(self.head.lookup(toks).reshape(len(mb), -1))
        outs = []
        for shard in self.layers:
            x = shard.forward(x, slots, poss)
            outs.append(x[mine].copy())
        outs.append(self.head.logits(self.head_split.split(self.split.join(x[mine]))))
        return outs


def plans(prompt: list[int], decode: list[int], other: list[int]) -> tuple[list, list]:
    """Micro-batches of (request, slot, token, position): A alone, and A among others (the module docstring)."""
    n, k = len(prompt), len(prompt) // 2
    alone = [[("A", 0, t, p) for p, t in enumerate(prompt)]] + [[("A", 0, t, n + j)] for j, t in enumerate(decode)]
    first = [("B", 1, t, p) for p, t in enumerate(other)] + [("A", 5, t, p) for p, t in enumerate(prompt[:k])]
    second = [("C", 2, t, p) for p, t in enumerate(other[:7])] + [("A", 5, t, k + p) for p, t in enumerate(prompt[k:])]
    shared = [first, second]
    for j, t in enumerate(decode):
        shared.append([("B", 1, other[j], len(other) + j), ("A", 5, t, n + j), ("C", 2, other[-j - 1], 7 + j)])
    return alone, shared


def compare(config, weights, layers: int, lengths: tuple[int, int, int] = LENGTHS) -> list[tuple[str, int, int, float]]:
    """A alone against A among others: per output (each layer's, the logits), (name, A's rows that differ, A's
    rows, the largest difference)."""
    rng = np.random.default_rng(0)
    alone, shared = plans(*(rng.integers(0, config.vocab_size, n).tolist() for n in lengths))
    runs = []
    for plan in (alone, shared):
        stack = Stack.of(config, weights, layers)
        steps = [stack.step(mb) for mb in plan]
        runs.append([np.concatenate([s[i] for s in steps]) for i in range(layers + 1)])
    out = []
    for i, (a, b) in enumerate(zip(*runs, strict=True)):
        differ = int((~np.all(a.reshape(len(a), -1) == b.reshape(len(b), -1), axis=1)).sum())
        out.append(("logits" if i == layers else f"layer {i}", differ, len(a), float(np.abs(a - b).max())))
    return out


def main() -> int:
    from waferrt.model import load_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2, help="how many of the model's first layers (default 2)")
    args = ap.parse_args()
    config, weights, _ = load_model()
    rows = compare(config, weights, args.layers)
    for what, differ, n, most in rows:
        print(f"{what:9s} A's rows differing: {differ} of {n}, largest difference {most:.3g}")
    bad = sum(r[1] for r in rows)
    print("bit-identical" if not bad else "NOT bit-identical: A's arithmetic depends on its neighbours")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
