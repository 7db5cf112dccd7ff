"""What a Wafer and its kernels accept from the host, checked before anything runs.

Contract: :func:`check_host_args` refuses a kernel argument (``wafer.run(kernel, **args)``) larger than
:data:`HOST_ARG_BYTES`: arguments reach every core free of cost and SRAM, so data belongs in DSM tensors;
:func:`unknown_keywords` words the refusal of a keyword ``Wafer(...)`` does not take, pointing a Launch
field (``timeout``, ``address``, ``max_tiles``) at ``launch=waferrt.Launch(...)``. Pure.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

HOST_ARG_BYTES = 1024  # the most one array (or bytes) given to wafer.run as a kernel's argument may hold


def check_host_args(args: dict) -> None:
    """A kernel's arguments reach every core free of cost and of SRAM: small values only (a scalar, a shape,
    a few hundred bytes). Data goes into DSM tensors, booked and paid for."""
    for name, value in args.items():
        nbytes = (value.nbytes if isinstance(value, np.ndarray)
                  else len(value) if isinstance(value, (bytes, bytearray)) else 0)
        if nbytes > HOST_ARG_BYTES:
            raise ValueError(
                f"wafer.run's argument {name}= holds {nbytes:,} bytes; a kernel's arguments reach every core free of "
                f"cost and SRAM, so they are limited to {HOST_ARG_BYTES:,} bytes each. Put the data in a DSM tensor "
                f"(wafer.dsm.alloc({name!r}, shape); wafer.dsm.put({name!r}, array)), pass its name, and read each "
                f"core's block with ctx.load({name!r}) in the kernel")


def unknown_keywords(unknown: dict, launch_type) -> str:
    """What Wafer(...) says of keywords it does not take: `launch_type`'s (waferrt.Launch) go inside
    launch=Launch(...)."""
    names = ", ".join(sorted(unknown))
    launch = sorted(set(unknown) & {f.name for f in fields(launch_type)})
    hint = (f"waferrt.Launch takes {', '.join(launch)} (how the tiles are started): write "
            f"Wafer(..., launch=waferrt.Launch({', '.join(f'{k}={unknown[k]!r}' for k in launch)}))" if launch else
            "Wafer takes spec, mesh, tile, backend and launch (waferrt.Launch(address, timeout, max_tiles))")
    return f"Wafer() got unknown keyword(s) {names}: {hint}"
