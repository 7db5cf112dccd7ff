"""Several Ray nodes on this one machine, so that a node can be lost on purpose (``ray.cluster_utils.Cluster``).

Contract: ``with LocalCluster(n) as cluster:`` starts a head node and n - 1 worker nodes (separate raylets, one
CPU each) under a private temp dir -- a fresh ``RAY_TMPDIR`` in /tmp when none is set, removed on exit -- so it never
meets another Ray of the machine (nor stops one: it stops only what it started), and joins this driver to it
(``waferrt.actors.session.ray_init``: Ray's noise kept off the terminal); its nodes listen on loopback only
(``session.loopback``) and require Ray's token (``session.token_auth_for_what_starts_here``).
``cluster.address`` is its address,
``cluster.nodes`` the node ids, the head's (this driver's) first, ``cluster.node_infos()`` the same as the
scheduler's NodeInfo. ``remove(node)`` removes the node of that id at once (its raylet killed, as a lost machine
would go; the head is refused: it hosts this driver) -- a NodeLoss's ``node_loss`` callback is
``lambda i: cluster.remove(placement.nodes[i].name)`` --, ``restore()`` starts a fresh node in the place of every
removed one (new ids) and returns their indices. Leaving the block shuts this driver's Ray and the cluster
down. Used by ``waferrt chaos --nodes N`` and ``benchmarks/chaos.py``.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from .session import loopback, ray_init, ray_shutdown, token_auth_for_what_starts_here

TMP_PREFIX = "waferrt-ray-"  # the cluster's temp dir (when RAY_TMPDIR is not set), removed on exit


class LocalCluster:
    def __init__(self, nodes: int):
        if nodes < 1:
            raise ValueError(f"a cluster has at least one node (the head), not {nodes}")
        self.size = nodes
        self.nodes: list[str] = []
        self._cluster, self._handles, self._tmp = None, [], None

    def __enter__(self) -> LocalCluster:
        import ray

        if ray.is_initialized():
            raise RuntimeError("Ray is already running in this process: a LocalCluster starts its own nodes and "
                               "joins them; shut that Ray down first (ray.shutdown())")
        if "RAY_TMPDIR" not in os.environ:  # short: Ray's socket paths under it must stay within 107 bytes
            short = "/tmp" if os.path.isdir("/tmp") else None
            self._tmp = os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix=TMP_PREFIX, dir=short)
        try:
            from ray.cluster_utils import Cluster

            token_auth_for_what_starts_here()  # its nodes require Ray's token (ray.cluster_utils does not ask)
            with loopback():  # one machine: every node listens on 127.0.0.1 only
                self._cluster = Cluster(initialize_head=True,
                                        head_node_args={"num_cpus": 1, "include_dashboard": False})
                self._handles = [self._cluster.head_node, *(self._cluster.add_node(num_cpus=1)
                                                            for _ in range(self.size - 1))]
            ray_init(self._cluster.address)
            self._cluster.wait_for_nodes()
        except BaseException:
            self.__exit__()
            raise
        self.nodes = [h.node_id for h in self._handles]
        return self

    @property
    def address(self) -> str:
        return self._cluster.address

    def node_infos(self) -> tuple:
        """The nodes as the scheduler plans over them (one CPU each), the driver's first."""
        from waferrt.scheduler import NodeInfo

        return tuple(NodeInfo(n, 1) for n in self.nodes)

    def remove(self, node: str) -> None:
        """Remove the node of this id now, without a graceful shutdown (nothing when it is gone already)."""
        i = self.nodes.index(node)
        if i == 0:
            raise ValueError("node 0 is the head: it hosts this driver and cannot be removed")
        if self._handles[i] is not None:
            self._cluster.remove_node(self._handles[i], allow_graceful=False)
            self._handles[i] = None

    def restore(self) -> list[int]:
        """A fresh node in the place of every removed one; the indices that were restored."""
        back = [i for i, h in enumerate(self._handles) if h is None]
        for i in back:
            with loopback():
                self._handles[i] = self._cluster.add_node(num_cpus=1)
            self.nodes[i] = self._handles[i].node_id
        if back:
            self._cluster.wait_for_nodes()
        return back

    def __exit__(self, *exc) -> None:
        ray_shutdown()
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None
        if self._tmp is not None:
            os.environ.pop("RAY_TMPDIR", None)
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
