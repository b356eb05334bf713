"""A Ray node that appears with a ``helix_node:<name>`` resource joins a running ``helix serve``
: a real multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``, as
test_multinode_ray), the serve stack on cluster_specs/local3.yaml planned without cpu-2, then a Ray
node on 127.0.0.3 offering ``helix_node:cpu-2`` is added: the stack starts its worker there, the
worker registers, the re-plan gives it a slice, and requests run through it with greedy outputs
equal to ``transformers``."""

from __future__ import annotations

import sys

import pytest

from coordinator.runtime import RuntimeConfig
from helix.net.sampling import SamplingParams
from helix.server.launcher import LaunchConfig
from helix.server.stack import ServeOptions, ServeStack
from helix.core.spec import load_cluster

from tests.builders.elastic import LOCAL3, plan_without
from tests.builders.ray_cluster import ray_cluster
from tests.builders.serving import PROMPTS, hf_greedy
from tests.builders.traffic import finish, submit_all, until

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(sys.platform != "linux",
                                 reason="a node on 127.0.0.3 needs Linux (all of 127/8 is loopback)")]

MAX_TOKENS = 8


@pytest.fixture(scope="module")
def cluster():
    """A Ray cluster whose head offers cpu-0 and cpu-1; the driver is connected."""
    with ray_cluster(("cpu-0", "cpu-1"), prefix="hxj") as (c, _nodes):
        yield c


def test_a_ray_node_offering_a_spec_node_joins_and_serves(cluster, tiny_model):
    spec = load_cluster(LOCAL3)
    options = ServeOptions(cluster=spec, launch=LaunchConfig(address=cluster.address),
                           runtime=RuntimeConfig(stats_interval_s=0.1, request_timeout_s=60))
    stack = ServeStack(plan_without(spec, "cpu-2"), tiny_model[0], options).start()
    try:
        coord = stack.coordinator
        assert set(coord.workers) == {"cpu-0", "cpu-1"} and stack.ray_joins is not None
        cluster.add_node(num_cpus=0, node_ip_address="127.0.0.3",
                         resources={"helix_node:cpu-2": 1})
        until(lambda: getattr(stack.elastic.joins.get("cpu-2"), "state", None) in ("serving", "failed",
                                                                                     "idle"),
              180, "cpu-2's worker started on the new Ray node and joined")
        assert stack.elastic.joins["cpu-2"].state == "serving", stack.elastic.joins["cpu-2"]
        assert stack.ray_joins.started == {"cpu-2"}
        assert coord.workers["cpu-2"].data_address.startswith("tcp://127.0.0.3:")   # on its node
        ids = [tuple(coord.codec.encode(p)) for p in PROMPTS]
        reference = {i: hf_greedy(tiny_model[1], i, MAX_TOKENS) for i in ids}
        finish(submit_all(coord, ids, 16, SamplingParams(temperature=0, max_tokens=MAX_TOKENS)),
               ids, reference)
        assert any("cpu-2" in nodes for nodes in coord.pipeline_counts)
        from starlette.testclient import TestClient
        joins = TestClient(stack.app).get("/admin/joins").json()["joins"]
        assert [(j["node"], j["state"]) for j in joins] == [("cpu-2", "serving")]
    finally:
        stack.close()
