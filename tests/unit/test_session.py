"""The Ray session helpers that need no Ray: the address check against loopback servers (one that answers
like gRPC, one that does not, none at all) and the sweep of ipc directories left by dead drivers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import pytest
from loopback import answering

from waferrt.actors.session import ClusterUnreachable, check_address, did_not_start, new_ipc_dir, parse_address


def test_a_grpc_server_passes_the_check_and_others_do_not():
    settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty HTTP/2 SETTINGS frame, as gRPC sends first
    with answering(settings) as address:
        assert check_address(address) == address
        assert check_address(f"ray://{address}") == f"ray://{address}"
    with answering(b"HTTP/1.1 400 Bad Request\r\n\r\n") as address:
        with pytest.raises(ClusterUnreachable, match="is not a Ray cluster.*GCS port, 6379.*ray start --head"):
            check_address(address)
    with pytest.raises(ClusterUnreachable, match=r"no Ray cluster at Ray address '127\.0\.0\.1:1'.*ray up cluster"):
        check_address("127.0.0.1:1", timeout=2.0)


@pytest.mark.parametrize("address, parsed", [("10.0.0.5:6379", ("10.0.0.5", 6379)),
                                             ("ray://head:10001", ("head", 10001)), ("[::1]:6379", ("::1", 6379))])
def test_addresses_parse(address, parsed):
    assert parse_address(address) == parsed


@pytest.mark.parametrize("address", ["head", "head:", ":6379", "head:port", "head:70000"])
def test_bad_addresses_show_the_forms(address):
    with pytest.raises(ValueError, match=r"is not HOST:PORT \(e\.g\. 10\.0\.0\.5:6379\), ray://HOST:PORT or 'auto'"):
        parse_address(address)


def test_ipc_dirs_of_dead_drivers_are_removed_and_no_others(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    gone = tmp_path / f"waferrt-{dead_pid}-abc123"
    kept = [tmp_path / f"waferrt-{os.getpid()}-live", tmp_path / "waferrt-oldstyle", tmp_path / "other-1-x"]
    for d in [gone, *kept]:
        d.mkdir()
        (d / "t0_0").write_text("")
    mine = new_ipc_dir()
    assert not gone.exists() and all(d.exists() for d in kept)
    assert os.path.basename(mine).startswith(f"waferrt-{os.getpid()}-") and os.path.dirname(mine) == str(tmp_path)


def test_rays_startup_timeout_is_one_line_naming_the_load_and_no_other_error_is_taken_for_it():
    """Ray 2.60 raises a bare Exception when its raylet does not register within 30 s (a loaded machine): the
    CLI prints a ClusterUnreachable as one line, exit 2, instead of Ray's traceback."""
    ray_says = ("The current node timed out during startup. This could happen because some of the raylet failed "
                "to startup or the GCS has become overloaded.")
    e = did_not_start(Exception(ray_says))
    assert isinstance(e, ClusterUnreachable)
    assert re.fullmatch(r"Ray did not start on this machine: its raylet did not register within Ray's own 30 s "
                        r"\(load average \d+\.\d on \d+ cores\); run again when the machine is less busy, or join a "
                        r"running Ray with --address", str(e)), str(e)
    assert did_not_start(RuntimeError("Maybe you called ray.init twice by accident?")) is None
