"""A lost link: cpu-2 runs as a ``helix worker`` inside a network namespace this test
creates, joined to this one by a veth pair; setting the veth down cuts it off like a region's link
going away (no process dies, polls just time out). Its requests move once it is suspect and finish
elsewhere; when the link comes back (it was declared dead meanwhile) the same process answers again
and gets traffic. Traffic stays on the veth pair (addresses in 10.213.0.0/16 exist only on it).
Skipped where network namespaces cannot be made."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from coordinator.health import HealthConfig
from coordinator.runtime import RuntimeConfig

from tests.builders.serve_stack import ServeCluster
from tests.builders.serving import PROMPTS
from tests.builders.traffic import MAX_TOKENS, VIA_2, finish, in_flight_on, submit_all, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


@pytest.fixture
def netns():
    """(namespace, host-side veth, host address, namespace address); torn down even on failure."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("needs root and iproute2 for a network namespace")
    tag = os.getpid() % 100_000
    ns, host_if, ns_if = f"hxns{tag}", f"hxh{tag}", f"hxn{tag}"
    subnet = f"10.213.{tag % 250}"
    if _ip("netns", "add", ns, check=False).returncode != 0:
        pytest.skip("cannot create a network namespace here")
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", ns)
        _ip("addr", "add", f"{subnet}.1/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("netns", "exec", ns, "ip", "addr", "add", f"{subnet}.2/30", "dev", ns_if)
        _ip("netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns, host_if, f"{subnet}.1", f"{subnet}.2"
    finally:
        _ip("link", "del", host_if, check=False)   # also removes its peer
        _ip("netns", "del", ns, check=False)


def test_cut_link_moves_requests_and_the_node_rejoins_when_it_is_back(tiny_model, plan3, netns):
    ns, host_if, host_addr, ns_addr = netns
    ckpt, model = tiny_model
    from coordinator.textcodec import TextCodec
    from tests.builders.serving import hf_greedy
    codec = TextCodec(str(ckpt))
    prompts = [tuple(codec.encode(p)) for p in PROMPTS]
    reference = {p: hf_greedy(model, p, MAX_TOKENS) for p in prompts}
    runtime = RuntimeConfig(stats_interval_s=0.1, request_timeout_s=60,
                            health=HealthConfig(suspect_after_s=1.0, dead_after_s=4.0))
    with ServeCluster(ckpt, plan3, runtime, host=host_addr, process_prefix=("ip", "netns", "exec", ns),
                      process_host=ns_addr) as cluster:
        coord, worker = cluster.coord, cluster.process("cpu-2")
        assert coord.workers["cpu-2"].data_address.startswith(f"tcp://{ns_addr}")
        pending = submit_all(coord, prompts, 32)
        until(lambda: in_flight_on(coord, "cpu-2"), 60, "a request generating through cpu-2")
        _ip("link", "set", host_if, "down")                            # the link is cut
        until(lambda: coord.node_states()["cpu-2"] == "suspect", 5, "cpu-2 suspect")
        finish(pending, prompts, reference)                   # moved once suspect, all correct
        assert coord.requests_moved >= 1
        until(lambda: coord.node_states()["cpu-2"] == "dead", 10, "cpu-2 dead")
        assert worker.poll() is None                                  # nobody died: only the link
        before = coord.pipeline_counts[VIA_2]
        _ip("link", "set", host_if, "up")                             # the link is back
        until(lambda: coord.node_states()["cpu-2"] == "ok", 90, "cpu-2 answers again")
        finish(submit_all(coord, prompts, 24), prompts, reference)
        assert coord.pipeline_counts[VIA_2] > before
