"""The decode's stages, named: which kind each is, which layer, on which region of cores.

Contract (pure): an item passes embed -> layer 0 -> ... -> layer L-1 -> head, each stage on a region.
:class:`StageKind` names the three kinds; its value is the word saved files, traces and ``--json``
outputs carry ("embed", "layer", "head": write ``kind.value``, read ``StageKind(word)``). A
:class:`Stage` is one of them: its kind, its region and, for a layer, its index (None for the embedding
and the head); ``name`` is what traces call its runs ("embed", "layer 3", "head"), ``what`` what messages
call what its cores hold. :func:`chain` is the
one place a chain of stages is made -- the decode's (``DecodeSetup.stages``), the planner's
(``scheduler.speed.placement_stages``) and the estimator's floor plans (``estimator.wafer.Floor.stages``)
all call it. An :class:`Entry` is one token entering a stage: the stage's kind and region and the region
it comes from (None at the first stage), what ``decode.cost.token_cost`` prices (the same for every
layer on equal regions, so it leaves out the layer's index); :func:`entries` gives every stage's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from waferrt.core.mesh import Region


class StageKind(Enum):
    """What a stage does: look up the embedding rows, run one layer, or compute the logits."""

    EMBED = "embed"
    LAYER = "layer"
    HEAD = "head"


@dataclass(frozen=True)
class Stage:
    """One stage of the chain: its kind, its region, its layer's index (a layer stage only)."""

    kind: StageKind
    region: Region
    layer: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, StageKind):
            raise TypeError(f"a stage's kind is a StageKind (StageKind.LAYER, ...), not {self.kind!r}")
        if (self.kind is StageKind.LAYER) != (self.layer is not None):
            given = "no layer index" if self.layer is None else f"layer {self.layer}"
            raise ValueError(f"a {self.kind.value} stage with {given}: write Stage(StageKind.LAYER, region, i) for "
                             "layer i, Stage(StageKind.EMBED or StageKind.HEAD, region) for the others")

    @property
    def name(self) -> str:
        """"layer <i>" for a layer, else the kind's word: what a trace calls the stage's runs."""
        return f"layer {self.layer}" if self.kind is StageKind.LAYER else self.kind.value

    @property
    def what(self) -> str:
        """What its cores hold, for a message: "layer <i>", or "the embedding/head" (they share a table)."""
        return self.name if self.kind is StageKind.LAYER else "the embedding/head"

    def entry(self, src: Region | None) -> Entry:
        """A token entering this stage from a stage on `src` (None: it is the first stage)."""
        return Entry(self.kind, src, self.region)


@dataclass(frozen=True)
class Entry:
    """A token entering a stage of `kind` on `region` from `src`, the previous stage's region (None at the
    first stage; equal to `region` between layers stacked on one region: nothing moves)."""

    kind: StageKind
    src: Region | None
    region: Region
    _hash: int = field(init=False, repr=False, compare=False)  # kept: an Entry keys token_cost's cache

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.kind, self.src, self.region)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):  # made again where it lands: a str's (and so an enum's) hash differs per process
        return Entry, (self.kind, self.src, self.region)


def chain(embed: Region, layers: Sequence[Region], head: Region) -> tuple[Stage, ...]:
    """The embedding on `embed`, layer i on layers[i], the head on `head`, in the order an item passes them."""
    mid = tuple(Stage(StageKind.LAYER, r, i) for i, r in enumerate(layers))
    return (Stage(StageKind.EMBED, embed), *mid, Stage(StageKind.HEAD, head))


def entries(stages: Sequence[Stage]) -> list[Entry]:
    """Every stage entered from the one before it (the first from nowhere)."""
    return [st.entry(stages[s - 1].region if s else None) for s, st in enumerate(stages)]
