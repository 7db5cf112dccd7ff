"""Shared test fixtures.

Contract: ``ray_session`` (session scope) starts ONE local Ray for the whole test session the first time a
test asks for it -- tests/unit never does, so the unit tier runs without Ray -- and shuts it down at the
end (a reaper, waferrt.actors.reaper, stops that Ray when the session is killed instead). A ``Wafer``
opened while it runs joins that Ray and leaves it running when it closes. Tests that need
their own Ray (tests/cluster) run it in a subprocess so they never meet this one. ``smollm2_cut`` (session
scope) is a function n -> (config, weights) of SmolLM2-135M cut to its first n layers, the asking test
skipped when SmolLM2 is not installed.

While the session runs, up to 12 tiles a closed Wafer leaves are kept for the next Wafer of the same Ray
(``WAFERRT_KEEP_TILES``, waferrt.actors.pool; set it to 0 to run without).

SIGTERM stops the session (a CI timeout, a user's kill): ray.init puts in a handler of Ray's that turns the
signal into a SystemExit inside whichever test runs -- one failed test, and the session goes on -- so the
handling the session started with (the default: the process ends) is given back after ray_session's
ray.init and before every test (a test may have started a Ray of its own, e.g. an in-process CLI command).

Under pytest-xdist (the README's command runs two workers, ``-n 2 --dist loadgroup``) each worker has its own
``ray_session``; a test file runs whole on one worker (its module fixtures set up once), and tests/cluster's files
run one after another on one worker (each starts Ray nodes of its own).
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest

# Ray must not find (and join) some other cluster through the environment.
os.environ.pop("RAY_ADDRESS", None)
# A closed Wafer's healthy tiles serve the next one (waferrt.actors.pool): most tests open a Wafer of their own,
# and a new tile actor costs a worker process (about a CPU-second). test_lifecycle turns it off to check what
# a Wafer leaves by default; WAFERRT_KEEP_TILES=0 in the environment runs the whole suite without it.
os.environ.setdefault("WAFERRT_KEEP_TILES", "12")


_SIGTERM = signal.getsignal(signal.SIGTERM)  # the session's own SIGTERM handling (what ray.init replaces)


def pytest_runtest_setup(item):
    signal.signal(signal.SIGTERM, _SIGTERM)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """Each test's xdist group: its file, or "cluster" for tests/cluster (see the contract)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        parts = Path(str(item.fspath)).parts
        group = "tests/cluster" if parts[-2] == "cluster" else "/".join(parts[-2:])
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_configure(config):
    config.addinivalue_line("markers", "cluster: several Ray nodes on this machine (a subprocess, ~15 s); "
                                       "deselect with -m 'not cluster'")


@pytest.fixture(scope="session")
def ray_session():
    import ray

    if ray.is_initialized():  # someone else's Ray (e.g. a plugin): use it, leave it alone
        yield ray
        return
    # num_cpus=2: tile actors take no CPU resource, so this only bounds plain tasks; the dashboard and
    # driver log forwarding are off to keep start-up (~4 s) and the test output quiet.
    ray.init(address="local", num_cpus=2, log_to_driver=False, logging_level=logging.ERROR,
             include_dashboard=False, configure_logging=True)
    signal.signal(signal.SIGTERM, _SIGTERM)  # Ray's would turn a SIGTERM into one test's SystemExit
    from waferrt.actors.reaper import start_reaper, stop_reaper
    from waferrt.actors.session import auth_mode

    reaper = start_reaper()  # a killed session (a CI timeout) leaves none of its Ray running
    assert auth_mode() == "token", "the tests' Ray runs without token authentication (RAY_AUTH_MODE)"
    try:
        yield ray
    finally:
        ray.shutdown()
        stop_reaper(reaper)


@pytest.fixture(scope="session")
def smollm2_cut():
    import dataclasses

    from waferrt.model import load_model

    try:
        config, weights, _ = load_model()
    except FileNotFoundError as e:
        pytest.skip(str(e))

    def cut(n: int):
        return dataclasses.replace(config, n_layers=n), dataclasses.replace(weights, layers=weights.layers[:n])
    return cut
