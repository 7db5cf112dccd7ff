"""Where ``waferrt generate`` (and ``chaos``) put a model: the plan on this machine or a joined cluster.

Contract: :func:`placement` plans the model (the strategy flags, --streaming, --experts/--balance of an MoE) over
:func:`ray_nodes` -- this machine, or every live node of the cluster at --address -- on the mesh given or the
default one cut into :func:`local_tiles` tiles here; it says what it placed (stderr) and returns the placement once
it admits every request and has at most --max-tiles tiles. Anything that does not fit, or a request no K/V slot
holds, is a :class:`~waferrt.cli.common.UsageError` naming what would.
"""

from __future__ import annotations

from .common import UsageError, check_max_tiles, say


def placement(args, config, mesh, requests, nodes=None):
    """Where the model goes (over `nodes`, the scheduler's NodeInfo; default: this machine, or --address's
    cluster), checked to hold every request's K/V; UsageError with the fix otherwise."""
    import dataclasses

    from waferrt.cli.model import default_mesh_cached
    from waferrt.core.spec import spec_by_name
    from waferrt.scheduler import KVReserve, PlanError

    from .strategy import placed

    spec = spec_by_name(args.spec)
    kv = KVReserve(args.kv_tokens, args.requests)
    nodes = nodes or ray_nodes(args.address)
    if args.streaming:
        p = streaming_placement(args, config, spec, kv, mesh, nodes)
        check_max_tiles(args, p.mesh)
        return admitted(p, requests)
    try:
        p, choice = placed(args, config, spec, kv, nodes,
                           lambda s: mesh or local_cut(args, default_mesh_cached(config, spec, kv, args.dtype, s,
                                                                                            args.attention)))
    except (PlanError, ValueError) as e:  # does not fit (the message says what would), or a bad --strategy N
        raise UsageError(str(e)) from None
    check_max_tiles(args, p.mesh)
    if choice is not None:
        say(f"strategy: {choice.why}")
        for row in choice.table().splitlines():
            say(f"  {row}")
    if config.moe:
        p = dataclasses.replace(p, experts=args.experts or "er", balance=args.balance)
    admitted(p, requests)
    experts = f", {config.n_experts} experts per layer region ({p.experts} mapping)" if config.moe else ""
    say(f"placed on {p.mesh} ({spec.name}, {args.dtype} storage): {p.strategy.describe()}, layer regions "
        f"{p.layers[0].w}x{p.layers[0].h} cores{experts}, KV {p.kv_tokens} tokens x {kv.requests} requests")
    return p


def local_tiles() -> int:
    """How many tile actors the default mesh runs in on this machine alone: one per core it may use (two
    tiles compute side by side on two cores; more wait for the scheduler at every hand-over). Measured on
    this 2-core VM (README, Performance): two tiles 0.94 of the anchor with 8 in flight, one tile 0.64,
    four 0.53."""
    import os

    return max(1, len(os.sched_getaffinity(0)))


def local_cut(args, mesh):
    """The default mesh as it runs fastest here: on this machine alone in local_tiles() tile actors, or
    --max-tiles when that is fewer (neighbouring tiles merged); on a cluster (--address) as planned."""
    return mesh if args.address else mesh.in_tiles(min(local_tiles(), args.max_tiles))


def admitted(p, requests):
    """The placement `p`, once it admits every request (UsageError with each refusal's reason otherwise)."""
    from waferrt.serving.admission import Admission, Request

    admission = Admission.for_placement(p)
    refused = [admission.submit(Request(i, len(r.prompt_ids), r.max_new_tokens)) for i, r in enumerate(requests)]
    if any(refused):
        raise UsageError("; ".join(r.reason for r in refused if r))
    return p


def streaming_placement(args, config, spec, kv, mesh, nodes):
    """--streaming: one region runs every stage and the weights stream in from MemoryX (waferrt.decode.streaming)."""
    from waferrt.scheduler import PlanError, PlanOptions
    from waferrt.scheduler.placement import plan_streaming, streaming_mesh

    if args.strategy or args.objective:
        raise UsageError("--streaming runs every stage on one region; leave out --strategy and --objective")
    try:
        p = plan_streaming(config, spec, mesh or streaming_mesh(config, spec, kv, args.dtype), kv=kv,
                           options=PlanOptions(dtype=args.dtype, nodes=nodes))
    except PlanError as e:
        raise UsageError(str(e)) from None
    sram = p.mesh.width * p.mesh.height * spec.sram_bytes
    say(f"weight streaming on {p.mesh} ({spec.name}, {args.dtype}): one {p.embed.w}x{p.embed.h} region runs every "
        f"stage; the mesh's SRAM is {sram / 1e6:,.0f} MB, the weights {config.params() * 4 / 1e6:,.0f} MB in float32 "
        f"stay off the wafer (MemoryX, {spec.ingress_bytes_per_s / 1e9:,.0f} GB/s modelled ingress)")
    return p


def ray_nodes(address: str | None):
    """The Ray nodes to spread the tiles over: this machine alone, or every live node of a joined cluster."""
    from waferrt.scheduler import NodeInfo

    if not address:
        return (NodeInfo("local", 2),)
    from waferrt.runtime import cluster_nodes

    nodes = tuple(NodeInfo(node, cpus) for node, cpus in cluster_nodes(address))
    say(f"joined a Ray cluster of {len(nodes)} node(s) at {address}")
    return nodes
