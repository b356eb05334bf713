"""Worker servers and the live coordinator in this process (no Ray): real ZeroMQ, real gRPC."""

from __future__ import annotations

import time

import pytest

from coordinator.requests import Delta, Done
from coordinator.runtime import Coordinator, QueueFull, RuntimeConfig, WorkerHandle
from helix.core.errors import HelixUserError
from helix.net.control import WORKER_SERVICE, ControlClient, ControlError
from helix.net.sampling import SamplingParams
from worker.server import WorkerServer

from tests.builders.serving import BRANCHING_KV_TOKENS, PROMPTS, hf_greedy, with_kv


@pytest.fixture(scope="module")
def served(tiny_model, plan3):
    ckpt, _ = tiny_model
    servers = [WorkerServer(p.node, str(ckpt)) for p in plan3.placements]
    coord = Coordinator(plan3, str(ckpt), RuntimeConfig(max_waiting_requests=2, stats_interval_s=0.1))
    coord.attach([WorkerHandle(s.node, s.control.address, s.data.address) for s in servers])
    yield coord, servers
    coord.close()
    for s in servers:
        s.shutdown()


def _collect(handle, timeout_s=30.0):
    ids, text, done = [], "", None
    for ev in handle.events(timeout_s=timeout_s):
        if isinstance(ev, Delta):
            ids.extend(ev.token_ids)
            text += ev.text
        else:
            done = ev
    return ids, text, done


def test_greedy_tokens_match_transformers_over_two_pipelines(served, tiny_model):
    coord, _ = served
    _, model = tiny_model
    prompts = [coord.codec.encode(p) for p in PROMPTS]
    handles = [coord.submit(ids, SamplingParams(temperature=0, max_tokens=6 + i % 5))
               for i, ids in enumerate(prompts)]
    for i, (ids, h) in enumerate(zip(prompts, handles)):
        got, text, done = _collect(h)
        want = hf_greedy(model, ids, 6 + i % 5)
        assert got == want, f"prompt {i}"
        assert text == coord.codec.decode(want)
        assert done.completion_tokens == len(want) and done.finish_reason in ("stop", "length")
    assert set(coord.pipeline_counts) == {("cpu-0", "cpu-1"), ("cpu-0", "cpu-2")}


def test_stop_string_cuts_text_and_frees_kv(served):
    coord, servers = served
    ids = coord.codec.encode(PROMPTS[0])
    _, full, _ = _collect(coord.submit(ids, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)))
    assert len(full) > 4
    stop = full[2:4]
    _, text, done = _collect(coord.submit(ids, SamplingParams(temperature=0, max_tokens=12,
                                                              ignore_eos=True), stop=[stop]))
    assert done.finish_reason == "stop" and text == full[:full.find(stop)]
    _wait_kv_free(servers)



def test_stop_token_ends_the_request_where_it_first_appears(served):
    coord, servers = served
    ids = coord.codec.encode(PROMPTS[5])
    full, _, _ = _collect(coord.submit(ids, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)))
    stop_id = full[3]
    got, _, done = _collect(coord.submit(ids, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                                             stop_token_ids=(stop_id,))))
    assert got == full[:full.index(stop_id) + 1] and done.finish_reason == "stop"
    _wait_kv_free(servers)

def _wait_kv_free(servers, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(s.stats().kv_blocks_used == 0 for s in servers):
            return
        time.sleep(0.05)
    raise AssertionError({s.node: s.stats().kv_blocks_used for s in servers})


def test_cancel_mid_stream_frees_kv_on_every_stage(served):
    """Cancel after the first streamed token: the request ends 'abort' and every stage frees its KV.
    The tiny model can finish all 400 tokens before a starved test thread calls cancel (the events
    queue does not wait for the reader); such a run proves nothing about cancel, so it is tried again."""
    coord, servers = served
    for _ in range(5):
        h = coord.submit(coord.codec.encode(PROMPTS[2]), SamplingParams(temperature=0, max_tokens=400,
                                                                          ignore_eos=True))
        events = h.events(timeout_s=30)
        assert isinstance(next(events), Delta)
        kv_in_use = any(s.stats().kv_blocks_used > 0 for s in servers)
        h.cancel()
        done = [ev for ev in events if isinstance(ev, Done)]
        assert len(done) == 1
        _wait_kv_free(servers)
        if done[0].finish_reason == "abort":
            assert kv_in_use, "a running request held no KV"
            return
        assert done[0].finish_reason == "length"
    pytest.fail("400 tokens always finished before cancel reached the coordinator")


def test_seeded_sampling_is_reproducible(served):
    coord, _ = served
    ids = coord.codec.encode(PROMPTS[1])
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=123, max_tokens=8, ignore_eos=True)
    a, b = (_collect(coord.submit(ids, params))[0] for _ in range(2))
    assert a == b and len(a) == 8


def test_bad_requests_are_user_errors(served):
    coord, _ = served
    with pytest.raises(HelixUserError, match="context"):
        coord.submit([5] * 500, SamplingParams(max_tokens=100))
    with pytest.raises(HelixUserError, match="empty"):
        coord.submit([], SamplingParams())


def test_full_queue_raises_queue_full(served):
    coord, servers = served
    # Mask every node by reporting its KV as full, then fill the 2-place queue.
    with coord._lock:
        for n in coord.stats:
            coord.scheduler.kv.observe(n, 10 * coord.stats[n].kv_capacity_token_layers)
        waiting = [coord.submit([1, 5, 6], SamplingParams(max_tokens=2)) for _ in range(2)]
        with pytest.raises(QueueFull):
            coord.submit([1, 5, 6], SamplingParams(max_tokens=2))
    for h in waiting:
        h.cancel()
    coord.poll_stats()   # real usage again


def test_worker_control_service(served):
    _, servers = served
    client = ControlClient(servers[1].control.address, WORKER_SERVICE)
    stats = client.call("Stats")
    assert stats["node"] == "cpu-1" and (stats["start"], stats["end"]) == (2, 8)
    assert stats["kv_blocks_total"] > 0 and stats["kv_blocks_free"] + stats["kv_blocks_used"] == stats["kv_blocks_total"]
    assert client.call("Health")["configured"] is True
    with pytest.raises(ControlError, match="INVALID_ARGUMENT"):
        client.call("Configure", {"start": 6, "end": 12})
    client.close()


def test_drained_node_gets_no_new_requests(served):
    """Runs last among the ``served`` tests: cpu-2 stays drained."""
    coord, servers = served
    ControlClient(servers[2].control.address, WORKER_SERVICE).call("Drain")
    assert servers[2].stats().draining
    coord.poll_stats()
    before = coord.pipeline_counts.copy()
    for _ in range(4):
        _collect(coord.submit(coord.codec.encode(PROMPTS[4]), SamplingParams(temperature=0, max_tokens=2)))
    new = coord.pipeline_counts - before
    assert new == {("cpu-0", "cpu-1"): 4}

def test_worker_that_cannot_load_its_slice_stops_startup_with_node_and_reason(tiny_model, plan3, tmp_path):
    import shutil
    ckpt, _ = tiny_model
    bad = tmp_path / "truncated"
    shutil.copytree(ckpt, bad)
    st = bad / "model.safetensors"
    st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])   # later layers' bytes are gone
    servers = [WorkerServer(p.node, str(bad)) for p in plan3.placements]
    coord = Coordinator(plan3, str(bad))
    try:
        with pytest.raises(HelixUserError, match=r"worker 'cpu-\d' failed to load its slice \[\d, \d\)") as exc:
            coord.attach([WorkerHandle(s.node, s.control.address, s.data.address) for s in servers])
        assert "file is truncated" in str(exc.value)
    finally:
        coord.close()
        for s in servers:
            s.shutdown()


def test_whole_model_node_beside_a_two_stage_pipeline(tiny_model):
    """A node holding every layer (it feeds its own tokens back) next to cpu-2 [0,4) -> cpu-1 [4,8)."""
    from helix.core.plan import ArcFlow, Plan
    from helix.core.slices import LayerSlice
    ckpt, model = tiny_model
    plan = Plan(model="tiny-llama", num_layers=8,
                placements=(LayerSlice("cpu-0", 0, 8), LayerSlice("cpu-1", 4, 8),
                            LayerSlice("cpu-2", 0, 4)),
                arc_flows=(ArcFlow("coordinator", "cpu-0", 1.0), ArcFlow("cpu-0", "coordinator", 1.0),
                           ArcFlow("coordinator", "cpu-2", 1.0), ArcFlow("cpu-2", "cpu-1", 1.0),
                           ArcFlow("cpu-1", "coordinator", 1.0)),
                max_flow_tokens_per_s=2.0, method="test")
    plan = with_kv(plan, BRANCHING_KV_TOKENS)
    servers = [WorkerServer(p.node, str(ckpt)) for p in plan.placements]
    coord = Coordinator(plan, str(ckpt))
    try:
        coord.attach([WorkerHandle(s.node, s.control.address, s.data.address) for s in servers])
        prompts = [coord.codec.encode(p) for p in PROMPTS[:4]]
        handles = [coord.submit(ids, SamplingParams(temperature=0, max_tokens=5)) for ids in prompts]
        for ids, h in zip(prompts, handles):
            assert _collect(h)[0] == hf_greedy(model, ids, 5)
        assert coord.pipeline_counts == {("cpu-0",): 2, ("cpu-2", "cpu-1"): 2}
        _wait_kv_free(servers)
    finally:
        coord.close()
        for s in servers:
            s.shutdown()


def test_live_scheduler_never_enters_a_layer0_node_mid_pipeline():
    """cpu-0 holds every layer: reachable only from the coordinator, even when cpu-1 is masked and
    the fallback would otherwise send cpu-2 [0,4) -> cpu-0 (entering at layer 4)."""
    from coordinator.kv_estimator import KVEstimator
    from coordinator.pipeline import RequestInfo
    from coordinator.runtime import live_scheduler
    from helix.core.plan import ArcFlow, Plan
    from helix.core.slices import LayerSlice
    plan = Plan(model="tiny-llama", num_layers=8,
                placements=(LayerSlice("cpu-0", 0, 8), LayerSlice("cpu-1", 4, 8),
                            LayerSlice("cpu-2", 0, 4)),
                arc_flows=(ArcFlow("coordinator", "cpu-2", 1.0), ArcFlow("cpu-2", "cpu-1", 1.0),
                           ArcFlow("cpu-1", "coordinator", 1.0)),
                max_flow_tokens_per_s=1.0, method="test")
    kv = KVEstimator({"cpu-0": 1e9, "cpu-1": 1e9, "cpu-2": 1e9})
    sched = live_scheduler(plan, kv)
    assert sched.schedule(RequestInfo(0, 10, 10)).nodes == ("cpu-2", "cpu-1")
    kv.observe("cpu-1", 1e9)   # cpu-1 full: only the whole-model node can take requests now
    picks = {sched.schedule(RequestInfo(i, 10, 10)).nodes for i in range(1, 5)}
    assert picks == {("cpu-0",)}
