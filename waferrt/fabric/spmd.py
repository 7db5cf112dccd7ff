"""Running a kernel on one tile, the way every runner does (a Ray tile actor, the local wafer, ``simulate``).

Contract: :func:`run_kernel` runs ``kernel(ctx, **args)`` on one tile with what it prints captured, then the
end-of-kernel check with the neighbour tiles of the region: each sends the others the list of primitives it
ran (with their lines) under the tag ``<tag>:end`` and reads theirs. A data message found where the end was
due is a message that no primitive of this tile received; two lists that differ are primitives that not
every tile joined: both :class:`~waferrt.fabric.kernel.NotSpmd`, naming the rule, both tiles and the line.
A kernel that returns a value (unless the runner wants one: ``simulate``) is
:class:`~waferrt.fabric.view.KernelMisuse`. Any exception leaves as :class:`~waferrt.fabric.debug.KernelFailed`
(the error, the kernel's line, the tile, the output so far) after an ``<tag>:abort`` to the neighbour
tiles, so that one waiting for this tile stops at once with :class:`NeighbourFailed` instead of at the
fabric's deadline. :func:`root_cause` picks, of several tiles' errors, the one that caused the others;
:func:`show_output` prints what the tiles printed, each line labelled by its tile. Pure.
"""

from __future__ import annotations

import sys

import numpy as np

from waferrt.core.mesh import Dir

from .debug import KernelFailed, Site, TileOutput, user_site
from .kernel import Context
from .links import FabricError, FabricTimeout, TagMismatch
from .misuse import RULE, KernelMisuse, NeighbourFailed, NotSpmd, TileHung, decode_calls, peer_of


def run_kernel(ctx: Context, kernel, args: dict, tile, returns: bool = False):
    """Run `kernel` on this tile: (its return value, what it printed). Raises KernelFailed."""
    name = getattr(kernel, "__name__", type(kernel).__name__)
    with TileOutput.capture() as printed:
        try:
            value = kernel(ctx, **args)
            if value is not None and not returns:
                raise KernelMisuse(
                    f"kernel {name!r} returned a {type(value).__name__}: a kernel returns nothing, its results stay "
                    "on the wafer -- ctx.store(name, value) into a DSM tensor, then wafer.dsm.get(name) on the host")
            _end(ctx, tile)
        except BaseException as e:  # noqa: BLE001 - carried to the host with where it happened
            site = getattr(e, "site", None) or user_site(e.__traceback__) or _def_site(kernel)
            _abort(ctx)
            raise KernelFailed(e, site, tile, name, printed()) from None
        return value, printed()


def _def_site(kernel) -> Site | None:
    code = getattr(kernel, "__code__", None)
    return None if code is None else Site(code.co_filename, code.co_firstlineno, code.co_name)


def _sides(ctx: Context) -> list[Dir]:
    """The neighbour tiles that hold cores of the region, by side."""
    return [d for comm in (ctx.x, ctx.y) for d in (comm.fwd, comm.fwd.opposite) if comm.links and comm.has_tile(d)]


def _end(ctx: Context, tile) -> None:
    sides = _sides(ctx)
    if not sides:
        return
    links, mine = ctx.x.links, "\n".join(f"{what}\t{line}" for what, line in ctx.calls)
    for d in sides:
        links.send(d, f"{ctx.tag}:end", [np.frombuffer(mine.encode(), np.uint8)])
    for d in sides:
        theirs = decode_calls(_recv_end(links, d, ctx.tag, tile))
        if [w for w, _ in theirs] != [w for w, _ in ctx.calls]:  # the same primitives; their lines may differ
            raise _diverged(ctx.calls, theirs, tile, d)


def _recv_end(links, d: Dir, tag: str, tile) -> list:
    try:
        return links.recv(d, f"{tag}:end")
    except TagMismatch as e:
        if e.got.endswith(":abort"):
            raise NeighbourFailed(f"{tile}: its {d.name} neighbour {peer_of(tile, d)} failed (see its error)") from None
        raise NotSpmd(f"{tile} ended the kernel with a message from its {d.name} neighbour {peer_of(tile, d)} that "
                      f"no primitive here received ({e.got!r}, a primitive along {e.got.rpartition(':')[2][:1]}): "
                      f"that tile ran a primitive this one did not; {RULE}") from None


def _diverged(mine: list[tuple[str, str]], theirs: list[tuple[str, str]], tile, d: Dir) -> NotSpmd:
    """The tiles parted at the first primitive where their lists differ; the error's site is that primitive's
    line of the kernel (this tile's, or the neighbour's where this tile ran nothing more)."""
    i = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a[0] != b[0]), min(len(mine), len(theirs)))
    here = " at ".join(mine[i]) if i < len(mine) else "nothing more (the kernel ended)"
    there = " at ".join(theirs[i]) if i < len(theirs) else "nothing more (the kernel ended)"
    e = NotSpmd(f"{tile} and its {d.name} neighbour {peer_of(tile, d)} parted at primitive {i + 1}: here {here}, "
                f"there {there}; {RULE}")
    e.site = _line_site((mine if i < len(mine) else theirs)[i][1])
    return e


def _line_site(where: str) -> Site | None:
    """A primitive's recorded line ("file:line") as a Site with the line's text."""
    file, _, line = where.rpartition(":")
    if not line.isdigit():
        return None
    import linecache

    return Site(file, int(line), "kernel", linecache.getline(file, int(line)).strip())


def _abort(ctx: Context) -> None:
    """Tell the neighbour tiles that this tile's kernel failed (best effort: the fabric may be what failed)."""
    for d in _sides(ctx):
        try:
            ctx.x.links.send(d, f"{ctx.tag}:abort", [np.zeros(0, np.uint8)])
        except Exception:  # noqa: BLE001,S110 - a neighbour that is gone does not need telling
            pass


def root_cause(errors: dict[int, BaseException]) -> BaseException:
    """Of the tiles' errors (by call index), the one that caused the others: a tile's own error before a
    fabric error that a neighbour saw while waiting for it; a protocol error before a timeout. KernelFailed
    is unwrapped (the kernel's own error, located)."""
    errors = {i: e.unwrap() if isinstance(e, KernelFailed) else e for i, e in errors.items()}

    def rank(i: int) -> tuple[int, int]:
        e = errors[i]
        if isinstance(e, NeighbourFailed):  # always a consequence: the neighbour's own error is the cause
            return 3, i
        return (2 if isinstance(e, FabricTimeout) else 1 if isinstance(e, FabricError) else 0), i

    root = errors[min(errors, key=rank)]
    if isinstance(root, TileHung):  # say what its neighbours waited for
        waited = next((e for e in errors.values() if isinstance(e, FabricTimeout)), None)
        if waited is not None and str(waited) not in getattr(root, "__notes__", ()):
            root.add_note(str(waited))
    return root


def show_output(outputs: list[tuple[object, str]], out=None) -> None:
    """Print what each tile's kernel printed, every line labelled ``[tile(x,y)]``, tile by tile."""
    out = out or sys.stdout
    for tile, text in outputs:
        for line in text.splitlines():
            print(f"[{tile}] {line}", file=out)
