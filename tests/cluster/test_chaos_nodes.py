"""``waferrt chaos --nodes 3``: the command starts three Ray nodes on this machine (waferrt.actors.localcluster),
spreads the tiles over them and draws node losses among the other kinds; every node loss that fires takes its
tiles along, they are restarted on the nodes left, and the tokens equal the fault-free run's.

The command runs in a subprocess (a LocalCluster starts its own Ray, never the test session's, in a temp dir of
its own that it removes); the tiny model on 3x2 tiles of 8x8 cores, two tiles per node. Takes ~40 s.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from waferrt.actors.localcluster import TMP_PREFIX

ARGS = ["chaos", "--model", "tiny", "--mesh", "24x16", "--nodes", "3", "--kinds", "node,tile,core", "--faults", "4",
        "--seed", "5", "--max-new-tokens", "10", "--requests", "3", "--json"]


@pytest.mark.cluster
def test_chaos_loses_whole_nodes_and_the_tokens_stay_the_same():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_TMPDIR")}
    before = set(glob.glob(f"/tmp/{TMP_PREFIX}*"))
    proc = subprocess.run([sys.executable, "-m", "waferrt.cli", *ARGS], env=env, capture_output=True, text=True,
                          timeout=300)
    left = set(glob.glob(f"/tmp/{TMP_PREFIX}*")) - before
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["identical"] and report["error"] is None, report
    assert "--nodes 3" in report["again"]
    lost = [f for f in report["faults"] if f["kind"] == "node" and f["outcome"] != "did not fire"]
    assert lost and any("restarted tile" in f["action"] for f in lost), report["faults"]
    assert all(f["outcome"] == "recovered" for f in lost), lost
    assert not left, left  # the cluster's temp dir is gone
    assert "starting 3 Ray nodes on this machine" in proc.stderr
