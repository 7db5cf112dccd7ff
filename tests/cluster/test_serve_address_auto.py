"""``waferrt serve --address auto`` joins a running Ray cluster -- one this test starts, and no other.

A subprocess starts a one-node cluster (``ray.cluster_utils.Cluster``) with a private RAY_TMPDIR: Ray writes
the cluster's address there, so ``--address auto`` in the server (which inherits the environment) finds this
cluster even when other Ray clusters run on the machine, and stopping it (``cluster.shutdown()``) stops only
what it started. The server places the small GGUF's tiles on that cluster, answers a greedy completion with
the text ``waferrt generate --reference`` gives, says ``ok`` on /health, and is stopped before the cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from serving import FLAGS, reference, tiny_gguf

SCRIPT = r"""
import json, sys
import httpx
from ray.cluster_utils import Cluster
from waferrt.actors.session import token_auth_for_what_starts_here
from waferrt.testing.served import serving

model, flags = sys.argv[1], json.loads(sys.argv[2])
token_auth_for_what_starts_here()  # the node requires Ray's token, as waferrt's own Ray does
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False})
report = {}
try:
    with serving(["--address", "auto", "--model", model, *flags], deadline_s=300) as srv:
        body = {"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        r = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=300)
        report = {"status": r.status_code, "text": r.json()["choices"][0]["text"],
                  "health": httpx.get(f"{srv.url}/health", timeout=30).text,
                  "joined": "joined a Ray cluster of 1 node(s) at auto" in srv.log()}
finally:
    cluster.shutdown()
print(json.dumps(report))
"""


@pytest.mark.cluster
def test_serve_with_address_auto_joins_the_cluster_this_test_started(tmp_path):
    model = tiny_gguf(tmp_path)
    flags = [f for f in FLAGS]
    flags[flags.index("--tile") + 1] = "16x8"  # two tiles (on a cluster the mesh is cut as planned)
    tmp = tempfile.mkdtemp(prefix="wsa-", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(TMPDIR=tmp, RAY_TMPDIR=tmp, WAFERRT_CACHE=str(tmp_path / "cache"))
    try:
        proc = subprocess.run([sys.executable, "-c", SCRIPT, model, json.dumps(flags)], env=env,
                              capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"status": 200, "text": reference(model, ["hello world"], 8)[0], "health": "ok",
                      "joined": True}, report
