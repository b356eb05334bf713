"""A real multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``) for the tests that
place workers on Ray nodes of their own (nodes on 127.0.0.2, 127.0.0.3, ...: all of 127/8 is
loopback on Linux, so each node has an address of its own)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def ray_cluster(head_nodes: tuple[str, ...], others: dict[str, str] | None = None,
                prefix: str = "hxr") -> Iterator[tuple[object, dict[str, object]]]:
    """(Cluster, {plan node: the Ray node that declared its ``helix_node:`` resource}), the driver
    connected. The head offers ``head_nodes``; each of ``others`` (plan node -> IP) gets a node of
    its own. No CPUs anywhere: the workers ask for none, and Ray then starts no idle worker
    processes. The cluster writes its address file into a temp dir of its own (``RAY_TMPDIR``), so
    a plain ``ray.init()`` elsewhere on this machine never joins it; everything is undone after."""
    import ray
    from ray.cluster_utils import Cluster
    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "RAY_AUTH_MODE")}
    tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")   # short: Ray's socket paths must fit 107 bytes
    os.environ.update(RAY_TMPDIR=tmp, RAY_AUTH_MODE="disabled")
    c = None
    try:
        c = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=0, resources={f"helix_node:{n}": 1 for n in head_nodes},
            include_dashboard=False))
        nodes = {n: c.head_node for n in head_nodes}
        for name, ip in (others or {}).items():
            nodes[name] = c.add_node(num_cpus=0, node_ip_address=ip,
                                     resources={f"helix_node:{name}": 1})
        ray.init(address=c.address, logging_level="WARNING")
        yield c, nodes
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if c is not None:
            c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)
