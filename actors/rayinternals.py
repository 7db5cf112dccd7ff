"""Ray's internals this runtime needs, in one place: each has no public API in Ray 2.60 (the version tested).

Contract: thin functions over ``ray._private`` / ``ray._raylet``, each with the reason a public API does not
do; the rest of the code calls these, never Ray's private modules (tests/unit/test_seams.py checks). A Ray
upgrade that moves one breaks here, in one file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable


def bootstrap_address() -> str:
    """The HOST:PORT that Ray address 'auto' means (ConnectionError: no Ray cluster on this machine). Why:
    ``ray.init`` resolves 'auto' only by connecting, and the caller wants to probe the port first with a
    deadline (actors.session.check_address)."""
    import ray._private.services as services

    return services.canonicalize_bootstrap_address_or_die("auto")


def auth_mode_name() -> str:
    """This process's Ray authentication mode ('token' or 'disabled'). Why: Ray 2.60 has no public getter."""
    from ray._private.authentication.authentication_utils import get_authentication_mode_name
    from ray._raylet import get_authentication_mode

    return get_authentication_mode_name(get_authentication_mode())


def reread_config() -> None:
    """This process's Ray config read again (after RAY_AUTH_MODE changed in the environment). Why: Ray reads
    it once at import; a node started later from ray.cluster_utils would otherwise start without the token."""
    from ray._raylet import Config

    Config.initialize("")


def ensure_token() -> None:
    """The auth token made when there is none (~/.ray/auth_token), as ``ray.init`` makes it. Why: the nodes a
    LocalCluster starts need it before any ``ray.init`` runs."""
    from ray._private.authentication.authentication_token_setup import ensure_token_if_auth_enabled

    ensure_token_if_auth_enabled(None, create_token_if_missing=True)


@contextlib.contextmanager
def single_machine_nodes():
    """Inside it, Ray nodes started here take 127.0.0.1 as their address (ENABLE_RAY_CLUSTER off). Why: it is
    Ray 2.60's only switch that binds a node's GCS, raylet, agents and workers to loopback."""
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def on_driver_messages(handler: Callable[[dict, bool], None]) -> None:
    """The cluster's messages that Ray's driver prints to stdout from a thread ("(raylet) A worker died ...")
    go to `handler(data, ignore_prefix)` instead. Why: log_to_driver=False does not stop them."""
    import ray._private.worker as ray_worker

    ray_worker.print_to_stdstream = handler
