"""A placement's speed: the flow schedule of the closed forms its tiles book (the one model of it).

Contract (pure): ``placement_seconds(p, requests, context)`` -> (seconds of one request's token, seconds of a
step with `requests` in flight) for a planned Placement, from ``stage_seconds`` over its stages
(``placement_stages``), or ``streaming_seconds`` for a streaming placement; ``stages_alone_cycles`` is one token
alone at each stage, what the flow schedule (waferrt.decode.schedule) and any bound printed beside it are
derived from; ``run_bound_tokens_per_s(p, in_flight, positions, batch)`` the bound of a decode that ran, at the
positions its tokens held (a run of short requests beats a bound taken at the full K/V reserve), an MoE
layer's routed work at the cheapest share any routing gives a token (``moe_share_floor``). The
on-paper estimator (waferrt.estimator) times its floor plans with the same functions.
"""

from __future__ import annotations

from collections.abc import Sequence

from waferrt.core.cost import cycles_seconds
from waferrt.core.spec import HardwareSpec
from waferrt.decode.cost import lane_batches, step_cycles, token_cost
from waferrt.decode.decoding import Decoding
from waferrt.decode.routed_cost import cheapest_routed_cycles, routed_alone_cycles
from waferrt.decode.schedule import requests_round_seconds, round_bound_seconds
from waferrt.decode.stage import Stage, StageKind, chain, entries
from waferrt.decode.streaming import stream_step_cycles

from .types import Placement


def stage_seconds(spec: HardwareSpec, dec: Decoding, stages: Sequence[Stage], kv_tokens: int,
                  requests: int) -> tuple[float, float]:
    """(seconds of one request's token, seconds of one step with `requests` in flight) through `stages`
    (decode.stage.Stage, as decode.cost.step_cycles takes them: one per layer, the layers of a group on one
    region) on the wafer: the closed forms the tiles book; with several requests, a steady round of them
    decoding at their own pace, as the decode that ran is scheduled (waferrt.decode.schedule: a token's
    layers on one region run back to back, and the tokens take turns on it)."""
    alone = stages_alone_cycles(spec, dec, stages, kv_tokens)
    one = cycles_seconds(spec, sum(alone))
    if requests == 1:
        return one, one
    return one, requests_round_seconds(alone, [st.region for st in stages], requests, spec.clock_hz)


def stages_alone_cycles(spec: HardwareSpec, dec: Decoding, stages: Sequence[Stage], kv_tokens: int) -> list[float]:
    """The cycles of one token alone at each stage, in stage order: what a placement's speed (the flow
    schedule of decode.schedule) and its bound are derived from."""
    cycles = step_cycles(spec, dec, stages, kv_tokens, [1])
    return [c for (_, _), c in sorted(cycles.items())]


def placement_seconds(p: Placement, requests: int | None = None, context: int | None = None
                      ) -> tuple[float, float]:
    """stage_seconds of a planned Placement (its real regions: layer i on its region, g layers of a group on
    one region; the tied embedding/head region): what the emulator's tiles book running it, for one request
    and for `requests` in flight (default: the placement's K/V reserve), each holding `context` positions
    (default: the full reserve)."""
    if p.streaming:
        return streaming_seconds(p, requests or p.kv.requests, context or p.kv_tokens)
    return stage_seconds(p.spec, p.decoding, placement_stages(p), context or p.kv_tokens,
                         requests or p.kv.requests)


def run_bound_tokens_per_s(p: Placement, in_flight: int, positions: range, batch: int) -> float:
    """A bound of the modelled rate (tokens/s) of a decode on the non-streaming placement `p` with
    `in_flight` requests whose generated tokens came from the logits of `positions`, in micro-batches of at
    most `batch` tokens: the steady round's bound (decode.schedule.round_bound_seconds: a token's way through
    the chain, the busiest region's share) of tokens that take at every stage the fewest cycles any of
    `positions` takes there -- the cycles the flow schedule times the run with (decode.cost.token_cost,
    want=True), an MoE layer's routed work at the cheapest share of it any routing of a micro-batch gives
    (moe_share_floor)."""
    if not positions:
        raise ValueError("a run's bound needs the positions of its generated tokens; it generated none")
    stages = placement_stages(p)
    alone = [min(token_cost(p.spec, p.decoding, entry, pos, True).cycles
                 for pos in _cheapest(positions, entry.region.w)) + moe_share_floor(p, stage, batch)
             for stage, entry in zip(stages, entries(stages), strict=True)]
    return in_flight / round_bound_seconds(alone, [st.region for st in stages], in_flight, p.spec.clock_hz)


def moe_share_floor(p: Placement, stage: Stage, batch: int) -> float:
    """What a token's cycles at an MoE layer stage can be below token_cost's (which prices the typical token:
    decode.routed_cost.routed_alone_cycles): the run gives each token its share of its micro-batch's routed work
    (decode.program), at least decode.routed_cost.cheapest_routed_cycles over the micro-batch's tokens, for any
    micro-batch of 1 to `batch` tokens; 0 at any other stage."""
    dec = p.decoding
    if stage.kind is not StageKind.LAYER or not dec.config.moe:
        return 0.0
    share = min(cheapest_routed_cycles(p.spec, dec, stage.region, b) / b for b in range(1, batch + 1))
    return share - routed_alone_cycles(p.spec, dec, stage.region)


def _cheapest(positions: range, cols: int) -> tuple[int, ...]:
    """The positions of `positions` among which a token is cheapest on a region `cols` columns wide: its
    cycles (decode.cost.token_cost) grow with its context (cdiv(pos + 1, cols) positions per core) and drop
    only where no column shifts its K/V (pos % cols == 0): the first position, and the first without a shift."""
    still = positions.start + (-positions.start) % cols
    return (positions.start,) + ((still,) if still in positions else ())


def placement_stages(p: Placement) -> tuple[Stage, ...]:
    """A non-streaming placement's stages: the embedding, every layer, the head (on its own region if untied)."""
    return chain(p.embed, p.layers, p.head_region)


def streaming_seconds(p: Placement, requests: int, context: int) -> tuple[float, float]:
    """A streaming placement (one region runs every stage, every block streamed in: decode.streaming) as its
    tile books it: every stage lasts the longer of its compute and its block's stream; the micro-batches
    (decode.cost.lane_batches) take turns on the region, each streaming every block once. (seconds of one
    request's token, of a round of `requests` tokens)."""
    spec, dec = p.spec, p.decoding

    def batch(b: int) -> float:
        return stream_step_cycles(spec, dec, p.embed, context, b)

    return cycles_seconds(spec, batch(1)), cycles_seconds(spec, sum(batch(b) for b in lane_batches(requests)))
