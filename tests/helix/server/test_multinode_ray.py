"""``helix serve --address`` on a real multi-node Ray cluster on this machine.

Three Ray nodes (``ray.cluster_utils.Cluster``): the head on this machine's own address and two more
on 127.0.0.2 and 127.0.0.3 (all of 127/8 is loopback on Linux, so each node has an address of its own,
neither the head's nor 127.0.0.1). Each declares one plan node's ``helix_node:<name>``. Checked: every
worker runs on the Ray node that declared its resource (the node id, asked inside the actor), binds
and reports that node's address, the pipelines (cpu-0 -> cpu-1 | cpu-2) answer exactly as the
single-node stack and as ``transformers``; a plan node nobody offers fails within the node
timeout, named, with the ``ray start`` line to run and the cluster's real head address (from the
launcher and from the real CLI); a worker killed five times comes back and serves each time (the
launcher's supervisor starts a new actor, paced by a short back-off: no restart count caps it); and
when a worker's machine is gone the node is reported lost (``/health``, ``/metrics``, ``helix
nodes``) until another machine offering its resource joins, where the worker starts and rejoins
from the new machine's address.

The cluster writes its address file into a temp dir of its own (``RAY_TMPDIR``), so a plain
``ray.init()`` elsewhere on this machine never joins it.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from helix.cli import main
from helix.client import Client
from helix.core.errors import HelixUserError
from helix.net.control import WORKER_SERVICE, ControlClient
from helix.server.http import HttpThread
from helix.server.launcher import LaunchConfig, RayLauncher, _check_coordinator_reachable
from helix.server.restarts import RestartPolicy
from helix.server.stack import ServeOptions, ServeStack

from tests.builders.cli import run_helix
from tests.builders.ray_cluster import ray_cluster
from tests.builders.serving import PROMPTS, branching_plan, hf_greedy, two_stage_plan
from tests.builders.stack import local_stack
from tests.builders.traffic import VIA_2, until

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(sys.platform != "linux",
                                 reason="nodes on 127.0.0.2/3 need Linux (all of 127/8 is loopback)")]

#: Plan node -> the address of the Ray node that offers it; cpu-0 is on the head (this machine's).
NODE_IPS = {"cpu-1": "127.0.0.2", "cpu-2": "127.0.0.3"}
MAX_TOKENS = 8
#: Restarts paced for a test: a short back-off, lost after 5 s without a worker coming up.
RESTARTS = RestartPolicy(backoff_initial_s=0.2, backoff_max_s=1.0, lost_after_s=5.0, interval_s=0.2)


@pytest.fixture(scope="module")
def cluster():
    """(Cluster, {plan node: the Ray node that declared its resource}); the driver is connected."""
    with ray_cluster(("cpu-0",), NODE_IPS) as c:
        yield c


def _actor(node: str):
    """The live worker actor of ``node``, found by its name (as any Ray user would)."""
    named = [a for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].startswith(f"helix-worker-{node}-")]
    assert len(named) == 1, named
    return ray.get_actor(named[0]["name"], namespace=named[0]["namespace"])


def _node_id(_worker) -> str:
    return ray.get_runtime_context().get_node_id()


def _host(address: str) -> str:
    return address.removeprefix("tcp://").rpartition(":")[0]


def _generate(grpc_address: str, prompts: list[list[int]]) -> list[list[int]]:
    with Client(grpc_address) as client:
        return [list(client.generate(ids, temperature=0, max_tokens=MAX_TOKENS).token_ids)
                for ids in prompts]


@pytest.fixture(scope="module")
def stack(cluster, tiny_model):
    """``helix serve --address`` in this process (the launcher the CLI uses) on the cluster."""
    c, _ = cluster
    options = ServeOptions(model_name="tiny", launch=LaunchConfig(address=c.address,
                                                                  node_timeout_s=30,
                                                                  restarts=RESTARTS))
    s = ServeStack(branching_plan(), str(tiny_model[0]), options).start()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def prompts(stack) -> list[list[int]]:
    return [stack.coordinator.codec.encode(p) for p in PROMPTS[:6]]


def test_each_worker_runs_on_its_node_at_its_address_and_serves_as_one_node(
        cluster, stack, prompts, tiny_model):
    _, ray_nodes = cluster
    ckpt, model = tiny_model
    for node, ray_node in ray_nodes.items():
        assert ray.get(_actor(node).__ray_call__.remote(_node_id), timeout=30) == ray_node.node_id
        worker = stack.coordinator.workers[node]
        assert _host(worker.control_address) == ray_node.node_ip_address, worker
        assert _host(worker.data_address) == ray_node.node_ip_address, worker
    assert {_host(stack.coordinator.workers[n].data_address) for n in NODE_IPS} == \
        set(NODE_IPS.values())   # not 127.0.0.1 by assumption
    served = _generate(stack.grpc_address, prompts)
    # Both pipelines carried requests: every node's data plane was used at its own address.
    for node, worker in stack.coordinator.workers.items():
        stats = ControlClient(worker.control_address, WORKER_SERVICE, 10).call("Stats")
        assert stats["steps_total"] > 0, node
    assert served == [hf_greedy(model, ids, MAX_TOKENS) for ids in prompts]
    with local_stack(ckpt) as single:
        assert _generate(single.grpc.address, prompts) == served


def test_a_missing_node_is_named_with_its_ray_start_line_within_the_timeout(cluster, tiny_model):
    c, _ = cluster
    launcher = RayLauncher(LaunchConfig(address=c.address, node_timeout_s=2))
    t0 = time.monotonic()
    try:
        with pytest.raises(HelixUserError) as err:
            launcher.start(["cpu-0", "eu-t4-9", "eu-t4-8"], str(tiny_model[0]))
    finally:
        launcher.shutdown()
    assert 2 <= time.monotonic() - t0 < 15
    message = str(err.value)
    for node in ("eu-t4-9", "eu-t4-8"):
        assert f"ray start --address={c.address} --resources='{{\"helix_node:{node}\": 1}}'" in message
    assert "cpu-0" not in message   # offered: not named


def test_helix_serve_node_timeout_fails_fast_with_the_line_to_run(cluster, tiny_model, tmp_path):
    c, _ = cluster
    plan = tmp_path / "plan.yaml"
    two_stage_plan(nodes=("cpu-0", "eu-t4-9")).save(plan)
    t0 = time.monotonic()
    result = run_helix(["serve", str(plan), "--model", str(tiny_model[0]), "--port", "0",
                        "--grpc-port", "0", "--address", c.address, "--node-timeout", "3"])
    took = time.monotonic() - t0
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "eu-t4-9" in errors[0] and "3 s" in errors[0], result.stderr
    assert f"  ray start --address={c.address} --resources='{{\"helix_node:eu-t4-9\": 1}}'" in \
        result.stderr.splitlines()
    assert "workers ready" not in result.stdout
    assert took < 90   # Python and Ray's client start-up, plus the 3 s (was a fixed 120 s)


def test_a_loopback_coordinator_is_refused_when_a_worker_is_on_another_machine():
    here = ray.util.get_node_ip_address()
    _check_coordinator_reachable({"cpu-0": (here,), "cpu-1": ("127.0.0.2",)}, "127.0.0.1:50051")
    _check_coordinator_reachable({"far": ("10.9.9.9",)}, f"{here}:50051")   # reachable address
    with pytest.raises(HelixUserError) as err:
        _check_coordinator_reachable({"cpu-0": (here,), "far": ("10.9.9.9",)}, "127.0.0.1:50051")
    assert "far (10.9.9.9)" in str(err.value) and "--host" in str(err.value)
    assert "cpu-0" not in str(err.value)


def test_a_worker_killed_five_times_comes_back_and_serves_each_time(stack, prompts, tiny_model):
    coord = stack.coordinator
    want = [hf_greedy(tiny_model[1], ids, MAX_TOKENS) for ids in prompts]
    for k in range(1, 6):
        old = stack.launcher.worker_pid("cpu-2")
        os.kill(old, signal.SIGKILL)
        until(lambda: coord.restarts["cpu-2"] == k and coord.node_states()["cpu-2"] == "ok", 120,
              f"cpu-2 back after kill {k}")
        assert stack.launcher.worker_pid("cpu-2") != old
        before = coord.pipeline_counts[VIA_2]
        assert _generate(stack.grpc_address, prompts) == want
        assert coord.pipeline_counts[VIA_2] > before, k   # the new process serves
    assert stack.supervisor.books["cpu-2"].restarts == 5


def test_a_worker_whose_machine_is_gone_is_lost_until_a_new_machine_offers_it(
        cluster, stack, prompts, tiny_model, capsys):
    """cpu-2's machine leaves: its worker cannot be restarted, so cpu-2 is reported lost (health
    stays 200 on cpu-0 -> cpu-1, with two thirds of the capacity); another machine (127.0.0.4)
    offering helix_node:cpu-2 joins: the waiting worker starts there, binds and registers that
    machine's address (asked inside the actor, not the launcher's old answer), the coordinator
    routes to it again and the outputs stay transformers'. Last in the module: it removes a node."""
    import httpx
    c, ray_nodes = cluster
    _, model = tiny_model
    coord = stack.coordinator
    want = [hf_greedy(model, ids, MAX_TOKENS) for ids in prompts]
    http = HttpThread(stack.app)
    try:
        c.remove_node(ray_nodes.pop("cpu-2"))
        until(lambda: coord.node_states()["cpu-2"] == "lost", 90, "cpu-2 reported lost")
        h = httpx.get(http.url + "/health", timeout=30)
        body = h.json()
        assert h.status_code == 200 and body["status"] == "degraded", body
        assert body["nodes"]["cpu-2"] == "lost"
        assert body["capacity_fraction"] == pytest.approx(2 / 3, abs=1e-3)
        assert "its machine is gone" in body["down"]["cpu-2"]["reason"], body
        metrics = httpx.get(http.url + "/metrics", timeout=10).text
        assert 'helix:node_state{model_name="tiny",node="cpu-2",state="lost"} 1.0' in metrics
        assert 'helix:cluster_capacity_fraction{model_name="tiny"} 0.66' in metrics
        capsys.readouterr()
        assert main(["nodes", "--server", http.url]) == 0
        line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("cpu-2"))
        assert "lost, 0 request(s) left" in line and "its machine is gone" in line, line
        assert _generate(stack.grpc_address, prompts) == want   # cpu-0 -> cpu-1 serves meanwhile
    finally:
        http.stop()
    spare = c.add_node(num_cpus=0, node_ip_address="127.0.0.4", resources={"helix_node:cpu-2": 1})
    deadline = time.monotonic() + 120
    while coord.node_states()["cpu-2"] != "ok" or \
            _host(coord.workers["cpu-2"].data_address) != "127.0.0.4":
        assert time.monotonic() < deadline, (coord.node_states(), coord.workers["cpu-2"])
        time.sleep(0.2)
    assert ray.get(_actor("cpu-2").__ray_call__.remote(_node_id), timeout=30) == spare.node_id
    before = coord.pipeline_counts[("cpu-0", "cpu-2")]
    assert _generate(stack.grpc_address, prompts) == want
    assert coord.pipeline_counts[("cpu-0", "cpu-2")] > before
    assert "cpu-2" not in coord.lost and coord.capacity_fraction == 1.0
