"""The Ray session of a Wafer: starting or joining Ray quietly and within a deadline, and the Wafer's
ipc directory.

Contract: :func:`check_address` checks that a Ray address ('auto', HOST:PORT, ray://HOST:PORT) answers as a
gRPC server within a deadline (a plain socket: nothing of Ray is imported for HOST:PORT) and otherwise
raises :class:`ClusterUnreachable` naming the address and how to start a cluster. :func:`ray_init` starts an
embedded Ray (address None: :class:`RayDidNotStart`, naming the machine's load, when Ray's own startup wait
runs out) or joins one (checked first; a few connection attempts, not Ray's twenty),
keeping Ray's noise off the user's terminal (:func:`ray_shutdown` stops the one it started): a SIGTERM
handler the program set before is kept (Ray's own would exit without closing the Wafer, after a C++ stack
dump), and the cluster's error messages ("(raylet) A worker died ...") go to the ``waferrt.ray`` logger
instead of stdout. :func:`cluster_nodes` lists a cluster's live nodes. :func:`new_ipc_dir` makes a Wafer's
``waferrt-<pid>-*`` directory and removes those whose process died. Ray is imported inside the functions:
checking a HOST:PORT address imports nothing of Ray."""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import threading

from . import rayinternals
from .reaper import start_reaper, stop_reaper

# one BLAS thread per worker process: the tiles share the machine's cores (workers_inherit says whether
# the workers already have it; else every tile actor asks for it)
BLAS_ENV = {v: "1" for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")}
CONNECT_TIMEOUT_S = 5.0  # how long a Ray address may take to answer before ClusterUnreachable
START_A_CLUSTER = ("start one with `RAY_AUTH_MODE=token ray start --head` on its head machine (it prints the "
                   "address to give: HOST:6379), or `ray up cluster.yaml` for a cloud cluster; or give no address "
                   "to run Ray inside this process")
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # preface + SETTINGS
IPC_DIR = re.compile(r"waferrt-(\d+)-\w+")  # a Wafer's ipc directory, named after its driver's pid
_REAPER = None  # the watchdog of the Ray that ray_init started or joined (waferrt.actors.reaper)


class ClusterUnreachable(ConnectionError):
    """No Ray cluster answers at the address given; the message names it and how to start one."""


class InsecureRay(ClusterUnreachable):
    """Ray would run, or runs, without its token authentication: refused (the message says what to set)."""


class RayDidNotStart(ClusterUnreachable):
    """An embedded Ray did not come up: its raylet did not register within Ray's own startup wait (a fixed
    30 s in Ray 2.60), which a heavily loaded machine can outlast; the message names the load."""


class NodesGone(ClusterUnreachable):
    """A placement puts tiles on Ray nodes this cluster does not have (alive); the message names them."""


def parse_address(address: str) -> tuple[str, int]:
    """(host, port) of 'HOST:PORT' or 'ray://HOST:PORT'; a ValueError that shows the forms otherwise."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"Ray address {address!r} is not HOST:PORT (e.g. 10.0.0.5:6379), ray://HOST:PORT or "
                         "'auto'")
    return host.strip("[]"), int(port)


def check_address(address: str, timeout: float = CONNECT_TIMEOUT_S) -> str:
    """The HOST:PORT a Ray address ('auto', HOST:PORT or ray://HOST:PORT) points to, once something there
    answered as a gRPC server (Ray's GCS and client server are) within `timeout` seconds; otherwise
    ClusterUnreachable naming the address tried and how to start a cluster (ValueError: not an address)."""
    target = address
    if address == "auto":
        try:
            target = rayinternals.bootstrap_address()
        except ConnectionError:
            raise ClusterUnreachable(f"Ray address 'auto': no running Ray cluster was found on this machine; "
                                     f"{START_A_CLUSTER}") from None
    _probe_grpc(address, *parse_address(target), timeout)
    return target


def _probe_grpc(address: str, host: str, port: int, timeout: float) -> None:
    """Connect to host:port and check that it speaks HTTP/2 (gRPC), all within `timeout` seconds."""
    tried = f"Ray address {address!r} ({host}:{port})"
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            if os.environ.get("RAY_USE_TLS", "0") not in ("", "0"):
                return  # TLS: the server speaks only after a handshake; the connect is all we check
            s.sendall(_HTTP2_HELLO)
            reply = s.recv(9)
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise ClusterUnreachable(f"no Ray cluster at {tried}: {why} within {timeout:g} s; "
                                 f"{START_A_CLUSTER}") from None
    if len(reply) < 9 or reply[3] != 0x4:  # a gRPC server answers the preface with a SETTINGS frame
        raise ClusterUnreachable(f"something listens at {tried} but it is not a Ray cluster (it does not answer "
                                 "as a gRPC server); a cluster's address is its head's GCS port, 6379 unless "
                                 f"`ray start --head --port` chose another; {START_A_CLUSTER}")


def workers_inherit_blas_env() -> bool:
    """Do this Ray's workers already run with one BLAS thread (an embedded Ray started here)?"""
    return all(os.environ.get(k) == v for k, v in BLAS_ENV.items())


def ray_init(address: str | None) -> bool:
    """Start (address None: a new embedded local Ray, never some cluster found on the machine) or join
    Ray quietly, within a deadline when joining; True when this call started it (and so must stop it).
    A SIGTERM handler the program set before is kept (Ray would install one that exits without closing
    the Wafer)."""
    import ray

    if ray.is_initialized():
        return False
    _refuse_auth_off()
    target = None if address is None else check_address(address)
    term = signal.getsignal(signal.SIGTERM)
    knob = "RAY_gcs_server_port_wait_time_s"  # connection attempts when joining: a few, not Ray's twenty
    retries = {} if target is None or knob in os.environ else {knob: "3"}
    os.environ.update(retries)
    if target is None:  # an embedded Ray's workers inherit this environment: its idle workers can host tiles
        os.environ.update(BLAS_ENV)
        token_auth_for_what_starts_here()
    try:
        with loopback(target is None or _is_loopback(target)):
            ray.init(address=address or "local", log_to_driver=False, logging_level=logging.ERROR,
                     include_dashboard=False, configure_logging=True,
                     runtime_env=None if target is None else {"env_vars": BLAS_ENV})
    except (ConnectionError, RuntimeError) as e:
        if target is None:
            raise
        raise ClusterUnreachable(f"Ray could not join the cluster at {address!r} ({target}): "
                                 f"{str(e).splitlines()[0]}; {START_A_CLUSTER}") from None
    except Exception as e:  # noqa: BLE001 - Ray's startup timeout is a bare Exception
        if target is None and (failed := did_not_start(e)) is not None:
            raise failed from None
        raise
    finally:
        for key in retries:
            os.environ.pop(key, None)
    _check_auth_on(address)
    global _REAPER
    _REAPER = start_reaper()
    if callable(term) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, term)
    _quiet_ray_messages()
    return True


def did_not_start(error: Exception) -> RayDidNotStart | None:
    """Ray's own startup timeout (its message is all that tells it from other errors) as a one-line error
    naming the machine's load and what to do; None for any other error."""
    if "timed out during startup" not in str(error):
        return None
    load = f"load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "its load"
    return RayDidNotStart(f"Ray did not start on this machine: its raylet did not register within Ray's own 30 s "
                          f"({load} on {os.cpu_count()} cores); run again when the machine is less busy, or join "
                          f"a running Ray with --address")


def ray_shutdown() -> None:
    """Stop the Ray that :func:`ray_init` started here (it returned True)."""
    import ray

    global _REAPER
    ray.shutdown()
    if _REAPER is not None:
        reaper, _REAPER = _REAPER, None
        stop_reaper(reaper)


def auth_mode() -> str:
    """This process's Ray authentication mode: 'token' or 'disabled' (Ray 2.60's RAY_AUTH_MODE)."""
    return rayinternals.auth_mode_name()


def _refuse_auth_off() -> None:
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None and mode.lower() != "token":
        raise InsecureRay(f"RAY_AUTH_MODE={mode} turns off Ray's token authentication, and then anyone who can "
                          "reach this machine's Ray ports can run code in it; unset RAY_AUTH_MODE (or set it to "
                          "token)")


def token_auth_for_what_starts_here() -> None:
    """Every Ray process started from here on (an embedded Ray, a LocalCluster's nodes) requires Ray's token:
    RAY_AUTH_MODE=token in this process's environment (they inherit it; ray.cluster_utils nodes would start
    without it otherwise), and the token made when there is none (~/.ray/auth_token, as ray.init makes it).
    InsecureRay when RAY_AUTH_MODE says otherwise."""
    _refuse_auth_off()
    if os.environ.get("RAY_AUTH_MODE") is None:
        os.environ["RAY_AUTH_MODE"] = "token"
        rayinternals.reread_config()  # this process's Ray config reads the mode again
    rayinternals.ensure_token()
    _owner_only(os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token"))


def _owner_only(token_file: str) -> None:
    """The token file readable by its owner alone (Ray writes it with the umask's mode, often 0644: every user
    of the machine could read it and call this user's Ray)."""
    try:
        if os.stat(token_file).st_mode & 0o077:
            os.chmod(token_file, 0o600)
    except OSError:  # the token is in RAY_AUTH_TOKEN, or the file is not ours to change
        pass


def _check_auth_on(address: str | None) -> None:
    """Ray runs with token authentication, or InsecureRay (after shutting this driver's Ray down)."""
    import ray

    if auth_mode() != "token":
        ray.shutdown()
        where = "the embedded Ray" if address is None else f"the Ray cluster at {address!r}"
        raise InsecureRay(f"{where} runs without token authentication (RAY_AUTH_MODE={auth_mode()}); start it "
                          "with RAY_AUTH_MODE=token (Ray 2.60's default; `ray get-auth-token --generate` makes "
                          "the token)")


def _is_loopback(target: str) -> bool:
    import ipaddress

    host = parse_address(target)[0]
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


@contextlib.contextmanager
def loopback(on: bool = True):
    """Inside it, Ray nodes started on this machine (an embedded Ray, a LocalCluster's) take 127.0.0.1 as their
    address, so that their GCS, raylet, agents and workers bind to loopback instead of every interface (Ray
    2.60 does so for a node whose address is loopback; it picks the machine's outward address unless
    ENABLE_RAY_CLUSTER is off); a driver joining them must look for them there too (`on` for a loopback
    address)."""
    if not on:
        yield
        return
    with rayinternals.single_machine_nodes():
        yield


def _quiet_ray_messages() -> None:
    """Ray's driver prints the cluster's error messages ("(raylet) A worker died ...") to stdout from a
    thread, whatever log_to_driver says; send them to the ``waferrt.ray`` logger instead."""
    log = logging.getLogger("waferrt.ray")

    def to_log(data: dict, ignore_prefix: bool) -> None:
        for line in data.get("lines", ()):
            log.info("(%s) %s", data.get("pid"), line)

    rayinternals.on_driver_messages(to_log)


def cluster_nodes(address: str) -> list[tuple[str, int]]:
    """Join the Ray cluster at `address`; (node id, CPUs) of every live node."""
    import ray

    ray_init(address)
    return [(n["NodeID"], max(1, int(n["Resources"].get("CPU", 1)))) for n in ray.nodes() if n["Alive"]]


def new_ipc_dir() -> str:
    """A fresh directory for a Wafer's ipc sockets, ``waferrt-<pid>-*`` under the temp dir, after removing
    those whose process is gone: a driver killed with SIGKILL could not remove its own."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "waferrt-*-*")):
        m = IPC_DIR.fullmatch(os.path.basename(path))
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"waferrt-{os.getpid()}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True
