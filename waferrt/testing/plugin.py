"""The pytest plugin for fault-injection suites, installed with waferrt (entry point ``pytest11``).

Contract:

- ``wafer`` (fixture): a :class:`~waferrt.Wafer` opened for the test and closed after it, on the closest
  ``@pytest.mark.wafer(spec=..., mesh=..., tile=..., timeout=..., backend=...)`` (module or class
  ``pytestmark`` too; default: the ``tiny`` spec, 8x8 cores in 2x2 tiles of 4x4 cores, a 10 s fabric
  deadline, the ``--wafer-backend`` option's backend). ``backend="ray"`` (the default): Ray starts once for
  the session (a running one is joined and left running); ``backend="local"``: the tiles run in the test's
  process, no Ray (same results, costs and fault outcomes; a TileCrash or NodeLoss needs Ray).
- ``--wafer-backend ray|local``: the backend of every ``wafer`` whose marker does not name one.
- ``@pytest.mark.faults(CoreFailure((3, 4)), ..., at_step=5)``: those faults (waferrt.faults values) are
  injected into the ``wafer`` fixture before the test body runs; ``at_step=N`` replaces their triggers by
  ``Trigger(step=N)`` (they fire as the N-th kernel command of their tile starts). ``wafer.session.log``
  says what fired and what found it. A test with the marker and without the ``wafer`` fixture is an error.
- ``fault_plan`` (fixture): ``fault_plan(n, kinds=("core", "link"), steps=5, mesh=None)`` draws a seeded
  random :class:`~waferrt.faults.FaultPlan` for the test's wafer mesh (the marker's, without opening it);
  ``fault_plan.seed`` is the test's seed, drawn from the campaign's seed and the test's node id.
- ``--fault-seed S``: the campaign's seed (default: a fresh one each session, shown in the header). The
  report of a failing test that drew plans or armed faults prints the seed and the command that replays
  it, and the fault log of its wafer.

Cheap to load in every pytest session: this module imports only pytest and the standard library; the
runtime (and Ray) are imported when a fixture is used.
"""

from __future__ import annotations

import argparse
import random
import zlib

import pytest

DEFAULTS = {"spec": "tiny", "mesh": (8, 8), "tile": (4, 4), "timeout": 10.0, "backend": "ray"}
SEED = pytest.StashKey[int]()


def _seed(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"--fault-seed is a whole number >= 0 (what a failing test's report "
                                         f"printed), got {text!r}")
    return int(text)


def pytest_addoption(parser) -> None:
    group = parser.getgroup("waferrt", "waferrt fault injection")
    group.addoption("--fault-seed", type=_seed, default=None, metavar="S",
                    help="replay a fault campaign: the seed of the random fault plans (fault_plan fixture); a "
                         "failing test's report prints the one it ran with")
    group.addoption("--wafer-backend", choices=("ray", "local"), default=None,
                    help="the backend of the `wafer` fixture when its marker names none: ray (tile actors, the "
                         "default) or local (the tiles in the test's process, no Ray: fast)")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "wafer(spec='tiny', mesh=(8, 8), tile=(4, 4), timeout=10.0, backend='ray'): "
                                       "the wafer the `wafer` fixture opens (waferrt)")
    config.addinivalue_line("markers", "faults(*faults, at_step=None): inject these waferrt.faults into the "
                                       "`wafer` fixture; at_step=N makes each fire at the N-th kernel command")
    seed = config.getoption("fault_seed", None)
    config.stash[SEED] = random.SystemRandom().randrange(2**31) if seed is None else seed


def pytest_report_header(config) -> str:
    seed = config.stash[SEED]
    return f"waferrt fault seed: {seed} (replay with --fault-seed {seed})"


def _options(node) -> dict:
    """The Wafer arguments of the closest ``wafer`` marker over the defaults."""
    marker = node.get_closest_marker("wafer")
    backend = node.config.getoption("wafer_backend", None) or DEFAULTS["backend"]
    options = {**DEFAULTS, "backend": backend, **(marker.kwargs if marker else {})}
    unknown = set(options) - set(DEFAULTS)
    if marker and (marker.args or unknown):
        pytest.fail(f"@pytest.mark.wafer takes keyword arguments {sorted(DEFAULTS)}, got "
                    f"{marker.args or sorted(unknown)}", pytrace=False)
    return options


def _marked_faults(node) -> list:
    """The faults of the test's ``faults`` marker, with their trigger replaced if it gives ``at_step``."""
    import dataclasses

    from waferrt.faults.model import BY_KIND, Trigger

    marker = node.get_closest_marker("faults")
    if marker is None:
        return []
    at_step = marker.kwargs.get("at_step")
    extra = set(marker.kwargs) - {"at_step"}
    if extra or (at_step is not None and (not isinstance(at_step, int) or at_step < 1)):
        pytest.fail(f"@pytest.mark.faults takes fault values and at_step=N (N >= 1, the kernel command at which "
                    f"they fire); got {sorted(extra) or f'at_step={at_step!r}'}", pytrace=False)
    faults = []
    for f in marker.args:
        if type(f) not in BY_KIND.values():
            pytest.fail(f"@pytest.mark.faults takes fault values such as waferrt.faults.CoreFailure((3, 4)); got "
                        f"{f!r} ({type(f).__name__})", pytrace=False)
        faults.append(f if at_step is None else dataclasses.replace(f, when=Trigger(step=at_step)))
    return faults


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """The markers are checked before any fixture is set up (no wafer is opened for a test written wrong)."""
    if item.get_closest_marker("faults") is not None and "wafer" not in getattr(item, "fixturenames", ()):
        pytest.fail(f"{item.nodeid}: @pytest.mark.faults injects its faults into the `wafer` fixture; add a "
                    "`wafer` argument to the test", pytrace=False)
    _marked_faults(item)
    _options(item)


@pytest.fixture(scope="session")
def waferrt_ray():
    """Ray for the session's wafers: started once (embedded) and stopped at the end, or joined if running."""
    from waferrt.actors.session import ray_init, ray_shutdown

    started = ray_init(None)
    yield
    if started:
        ray_shutdown()


@pytest.fixture
def wafer(request):
    """A Wafer for this test (see the ``wafer`` marker), with the ``faults`` marker's faults injected."""
    from waferrt.runtime import Launch, Wafer

    faults, options = _marked_faults(request.node), _options(request.node)
    if options["backend"] == "ray":
        request.getfixturevalue("waferrt_ray")
    launch = Launch(timeout=options.pop("timeout"))  # the marker names the timeout alone
    with Wafer(**options, launch=launch) as w:
        for f in faults:
            w.inject(f)
        yield w


class FaultPlans:
    """Draws seeded random fault plans for one test: ``plans(n, kinds, steps, mesh)``."""

    def __init__(self, campaign: int, nodeid: str, mesh):
        self.campaign, self.nodeid, self.mesh = campaign, nodeid, mesh
        self.drawn = 0

    @property
    def seed(self) -> int:
        """The seed of this test's first plan (the next ones follow from it)."""
        return self._seed(0)

    def _seed(self, i: int) -> int:
        return zlib.crc32(f"{self.campaign}:{self.nodeid}:{i}".encode())

    def __call__(self, n: int = 1, kinds=("core", "link"), steps: int = 5, mesh=None, policy: str = "tolerant"):
        """A FaultPlan of `n` faults of `kinds`, each firing at a kernel command in [1, `steps`], on `mesh`
        (default: the wafer fixture's; or a waferrt.faults.Targets, see waferrt.faults.FaultPlan.random)."""
        from waferrt.faults.model import FaultPlan

        plan = FaultPlan.random(self._seed(self.drawn), n, mesh or self.mesh, kinds=tuple(kinds), steps=steps,
                                policy=policy)
        self.drawn += 1
        return plan


@pytest.fixture
def fault_plan(request) -> FaultPlans:
    """Seeded random fault plans for this test: ``fault_plan(n, kinds=..., steps=...)`` (``--fault-seed``)."""
    from waferrt.core.mesh import MeshSpec

    o = _options(request.node)
    return FaultPlans(request.config.stash[SEED], request.node.nodeid, MeshSpec(*o["mesh"], *o["tile"]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    faulty = "fault_plan" in getattr(item, "fixturenames", ()) or item.get_closest_marker("faults") is not None
    if not (report.failed and faulty):
        return
    seed = item.config.stash[SEED]
    lines = [f"fault seed {seed}; replay with: pytest --fault-seed {seed} {item.nodeid!r}"]
    session = getattr(getattr(item, "funcargs", {}).get("wafer"), "session", None)
    if session is not None:
        lines += ["fault log of the wafer:", session.log.table()]
    report.sections.append(("waferrt faults", "\n".join(lines)))
