"""The scheduler's value types: what a plan is made of, with no algorithm attached.

Contract: frozen, hashable values that import nothing else of the scheduler (the algorithms -- placement,
search, report, repair, serial -- import these, never the other way round). :class:`Placement` says where
every tensor of a Llama model sits: layer i -> its region, the tied embedding/head region, spare cores kept
for repair, tile -> Ray node, and ``kv_tokens``, the K/V positions per request that every layer region holds
(computed by the planner and stored). ``group`` layers share a region (``Strategy``: layer i is on
``layers[i]``, the same region for every layer of its group: their weights and K/V stacked on the same
cores). :class:`KVReserve` is the K/V the planner must reserve, :class:`NodeInfo` a Ray node,
:class:`Workload` what the budgets take together (model, K/V reserve, dtype, layers per region),
:class:`PlanError` the planner's "does not fit" with what would, :class:`Strategy` how the layers share the
wafer (layers per region)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from waferrt.core.arith import whole
from waferrt.core.dtypes import check_dtype
from waferrt.core.layout import Layout
from waferrt.core.mesh import Coord, MeshSpec, Region, TileId
from waferrt.core.spec import HardwareSpec
from waferrt.decode.decoding import Decoding
from waferrt.decode.layout import kv_layout, layer_layouts
from waferrt.model.config import LlamaConfig
from waferrt.model.sparse import DENSE, AttentionMode


class PlanError(ValueError):
    """The model cannot be placed as asked; the message says why and what would work."""


@dataclass(frozen=True)
class NodeInfo:
    """One Ray node that hosts tile actors."""

    name: str
    cpus: int

    def __post_init__(self) -> None:
        whole("NodeInfo.cpus", self.cpus, least=None)
        if not isinstance(self.name, str) or not self.name or self.cpus < 1:
            raise ValueError(f"a Ray node needs a name and at least 1 CPU, got {self.name!r} with "
                             f"{self.cpus}")


@dataclass(frozen=True)
class KVReserve:
    """KV cache to reserve in every layer region: `tokens` positions for each of `requests` requests."""

    tokens: int
    requests: int

    def __post_init__(self) -> None:
        whole("KVReserve.tokens", self.tokens, least=None)
        whole("KVReserve.requests", self.requests, least=None)
        if self.tokens < 1 or self.requests < 1:
            raise ValueError(f"KV reserve needs tokens >= 1 and requests >= 1, got {self.tokens} tokens x "
                             f"{self.requests} requests")


@dataclass(frozen=True)
class Workload:
    """What the planner budgets together: the model, the K/V reserved in every layer region (`kv.tokens`
    positions for each of `kv.requests` requests), the storage dtype, and how many layers a region runs
    (their weight blocks and K/V stacked on the same cores), and the attention (sparse: its cores also hold
    the top-K's lists, decode.layout.topk_booking)."""

    config: LlamaConfig
    kv: KVReserve
    dtype: str = "float32"
    layers: int = 1
    attention: AttentionMode = DENSE

    def __post_init__(self) -> None:
        if not isinstance(self.config, LlamaConfig) or not isinstance(self.kv, KVReserve):
            raise TypeError(f"a Workload is a LlamaConfig and a KVReserve, got {type(self.config).__name__} and "
                            f"{type(self.kv).__name__}")
        check_dtype(self.dtype)
        whole("Workload.layers", self.layers)
        if self.layers > self.config.n_layers:
            raise ValueError(f"a region runs at most the model's {self.config.n_layers} layers, got {self.layers}")

    def holding(self, tokens: int, requests: int | None = None) -> Workload:
        """The same workload with `tokens` K/V positions per request (and `requests` requests)."""
        return replace(self, kv=KVReserve(tokens, self.kv.requests if requests is None else requests))


class StrategyKind(StrEnum):
    """How the layers share the wafer (Strategy.kind); its value is the word ``--strategy`` takes and the
    reports and ``--json`` outputs write."""

    LAYER = "layer"
    TENSOR = "tensor"
    GROUPED = "grouped"


@dataclass(frozen=True)
class Strategy:
    """How a model's layers share the wafer: every layer region runs `group` consecutive layers, its cores
    holding the weight blocks (and K/V) of all of them; a token passes the regions in turn.

    Its ``kind`` is the word ``--strategy`` takes (``strategies.parse_strategy``): "layer", group 1, each
    layer its own region (layer-pipelined regions: what ``plan`` places by default); "tensor", group =
    n_layers, WaferLLM-style wafer-scale tensor parallelism (one large region runs every layer, its GEMVs
    spread over all its cores); "grouped", anything between (n_layers / group regions)."""

    group: int
    n_layers: int

    def __post_init__(self) -> None:
        if not 1 <= self.group <= self.n_layers:
            raise ValueError(f"a strategy groups 1..{self.n_layers} layers per region, got {self.group}")

    @property
    def kind(self) -> StrategyKind:
        if self.group == 1:
            return StrategyKind.LAYER
        return StrategyKind.TENSOR if self.group == self.n_layers else StrategyKind.GROUPED

    @property
    def regions(self) -> int:
        """Layer regions: n_layers / group, the last one holding the rest."""
        return -(-self.n_layers // self.group)

    def describe(self) -> str:
        if self.kind is StrategyKind.LAYER:
            return f"layer ({self.n_layers} layer regions, one layer each)"
        if self.kind is StrategyKind.TENSOR:
            return f"tensor (one region runs all {self.n_layers} layers)"
        return f"grouped ({self.regions} regions of {self.group} layers)"


DEFAULT_NODES = (NodeInfo("local", 2),)


@dataclass(frozen=True)
class PlanOptions:
    """How ``plan`` (and ``plan_streaming``, ``default_mesh``, ``strategies.choose``) places a model besides
    the model, the spec, the mesh and the K/V: the storage `dtype`, the `strategy` (None: one layer per
    region), the Ray `nodes` to spread the tiles over, the `dead_links` to route around, and whether to
    `balance` the weight bytes over the tiles (False: fill every tile in chain order); the decode's `attention`
    (sparse: room for the top-K's lists on every layer region's cores)."""

    dtype: str = "float32"
    strategy: Strategy | None = None
    nodes: tuple[NodeInfo, ...] = DEFAULT_NODES
    dead_links: frozenset[tuple[Coord, Coord]] = frozenset()
    balance: bool = True
    attention: AttentionMode = DENSE

    def __post_init__(self) -> None:  # any collections in, hashable ones kept (plan checks what they hold)
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "dead_links", frozenset(self.dead_links))


@dataclass(frozen=True)
class Placement:
    config: LlamaConfig
    spec: HardwareSpec
    mesh: MeshSpec
    dtype: str
    kv: KVReserve
    layers: tuple[Region, ...]  # layer i -> its region
    embed: Region  # embedding table + final norm (+ the output head when tied: the same table)
    spare: frozenset[Coord]  # whole free layer-shaped slots kept for repair (up to one per layer)
    tile_nodes: tuple[tuple[TileId, str], ...]  # sorted by tile
    kv_tokens: int  # K/V positions per request per layer every layer region holds (>= kv.tokens)
    nodes: tuple[NodeInfo, ...] = DEFAULT_NODES
    dead_links: frozenset[tuple[Coord, Coord]] = frozenset()
    group: int = 1  # layers per region (Strategy.group)
    streaming: bool = False  # the weights stream in from off-wafer memory (placement.plan_streaming)
    experts: str = "er"  # where an MoE layer's experts sit in its region (waferrt.decode.moe_layout.MAPPINGS)
    balance: int = 0  # NI-Balancer: an MoE layer looks at its routing histogram every `balance` micro-batches
    # (0: never)
    head: Region | None = None  # an untied output head's own region (its table + final norm); None: tied, the
    # head runs on `embed`

    @property
    def head_region(self) -> Region:
        """Where the output head runs: its own region when untied, else the embedding's."""
        return self.embed if self.head is None else self.head

    def tables(self) -> tuple[Region, ...]:
        """The regions holding an embedding-shaped table: the embedding's, and an untied head's."""
        return (self.embed,) if self.head is None else (self.embed, self.head)

    @property
    def strategy(self) -> Strategy:
        return Strategy(self.group, self.config.n_layers)

    @property
    def decoding(self) -> Decoding:
        """What the decode's closed forms (decode.cost) need of this placement: model, dtype, expert mapping."""
        return Decoding(self.config, self.dtype, experts=self.experts)

    def node_of(self, tile: TileId) -> str:
        for t, name in self.tile_nodes:
            if t == tile:
                return name
        raise ValueError(f"{tile} is not a tile of this placement's mesh ({self.mesh})")

    def layer_layouts(self, i: int) -> dict[str, Layout]:
        """The decode layouts of layer i's weights over its region."""
        return layer_layouts(self.config, self.layers[i], self.dtype)

    def kv_layout(self, i: int) -> Layout:
        """Layout of one request's K (or V) cache of layer i, at the full capacity ``kv_tokens``."""
        return kv_layout(self.config, self.layers[i], self.kv_tokens, self.dtype)

    def regions(self) -> tuple[tuple[str, Region], ...]:
        """('embed', region) then every layer region once, in chain order: ('layer i', region), or ('layers
        i-j', region) for a group sharing one, then ('head', region) when the head is untied. A streaming
        placement has one region, named for all of them."""
        named = self.layer_regions()
        if self.streaming:
            return ((f"embed+{named[0][0]}+head", self.embed),)
        return (("embed", self.embed),) + named + ((("head", self.head),) if self.head is not None else ())

    def layer_regions(self) -> tuple[tuple[str, Region], ...]:
        """Every layer region once, in chain order, named ('layer i', or 'layers i-j' for a group sharing one)."""
        out: list[tuple[str, Region, int, int]] = []
        for i, r in enumerate(self.layers):
            if out and out[-1][1] == r:
                out[-1] = (out[-1][0], r, out[-1][2], i)
            else:
                out.append(("", r, i, i))
        return tuple((f"layer {a}" if a == b else f"layers {a}-{b}", r) for _, r, a, b in out)


OBJECTIVES = ("latency", "throughput")


@dataclass(frozen=True)
class Objective:
    """What the planner is asked for: the best strategy for `goal` ("latency": one request's time per token,
    "throughput": tokens/s with the K/V's requests in flight) among `tried` (None: every strategy worth
    trying), and (`advise`) when none fits, a search for what would (a sweep only needs "no")."""

    goal: str = "latency"
    tried: tuple[Strategy, ...] | None = None
    advise: bool = True

    def __post_init__(self) -> None:
        if self.goal not in OBJECTIVES:
            raise ValueError(f"objective is one of {OBJECTIVES}, got {self.goal!r}")
        if isinstance(self.tried, Strategy) or (self.tried is not None and not self.tried):
            raise ValueError(f"tried is a list of strategies (e.g. [Strategy(1, n_layers)], or "
                             f"strategies.parse_strategy's), or None for every strategy; got {self.tried!r}")
        if self.tried is not None:
            object.__setattr__(self, "tried", tuple(self.tried))  # any sequence in, a hashable tuple kept
