"""A worker that registers again while its node still looks alive (restarted before anyone declared
it dead, or a second process started by mistake) replaces the old one without losing a request: the
node's requests move first, then the new process serves. A repeated registration of the same
process changes nothing. In-process stack (three WorkerServers, the coordinator)."""

from __future__ import annotations

from coordinator.runtime import WorkerHandle
from worker.server import WorkerServer

from tests.builders.serving import PROMPTS, hf_greedy
from tests.builders.stack import local_stack
from tests.builders.traffic import MAX_TOKENS, VIA_2, finish, in_flight_on, submit_all, until


def test_a_new_process_for_a_live_node_loses_no_request(tiny_model):
    ckpt, model = tiny_model
    with local_stack(ckpt) as stack:
        coord = stack.coordinator
        prompts = [tuple(coord.codec.encode(p)) for p in PROMPTS]
        reference = {p: hf_greedy(model, p, MAX_TOKENS) for p in prompts}
        pending = submit_all(coord, prompts, 32)
        until(lambda: in_flight_on(coord, "cpu-2"), 60, "a request generating through cpu-2")
        assert coord.node_states()["cpu-2"] == "ok"
        replacement = WorkerServer("cpu-2", str(ckpt), torch_threads=1)
        try:
            handle = WorkerHandle("cpu-2", replacement.control.address, replacement.data.address)
            coord.rejoin(handle)
            finish(pending, prompts, reference)      # every request ends with the reference output
            assert coord.requests_moved >= 1
            until(lambda: coord.node_states()["cpu-2"] == "ok", 30, "the new cpu-2 answering")
            moved = coord.requests_moved
            coord.rejoin(handle)                     # the same process again: a no-op
            assert coord.requests_moved == moved and coord.workers["cpu-2"] == handle
            before = coord.pipeline_counts[VIA_2]
            finish(submit_all(coord, prompts, 16), prompts, reference)
            assert coord.pipeline_counts[VIA_2] > before   # the new process serves
        finally:
            replacement.shutdown()
