import pytest

from helix.sim.request import SimRequest
from helix.sim.worker import SimWorker
from worker.step_policy import PolicyConfig


def _layer_time(p, d, d_ctx, p_ctx):
    # Depends on the batch, so joining mid-slice changes the answer: 1 ms + 2 ms/prompt + 5 ms/decode.
    return 1e-3 + 2e-3 * p + 5e-3 * d


def test_request_entering_mid_slice_skips_early_layers():
    w = SimWorker("n", 10, 20, 10_000, _layer_time,
                  PolicyConfig(max_num_batched_tokens=512, self_feeding=False))
    w.admit(SimRequest(1, 0.0, 4, 2), 0, 10, 4)   # runs layers 10..19
    w.admit(SimRequest(2, 0.0, 3, 2), 1, 16, 3)   # enters at layer 16
    plan = w.policy.schedule()
    assert [c.num_tokens for c in plan.prefill_chunks] == [4, 3]
    # Layers 10-15: only request 1 (4 prompt tokens); layers 16-19: both (7 tokens).
    expected = 6 * _layer_time(4, 0, 0, 0) + 4 * _layer_time(7, 0, 0, 0)
    assert w.step_time_s(plan) == pytest.approx(expected)
    w.policy.complete(plan)
    w.drop(2)
    w.policy.feed(1)
    plan = w.policy.schedule()
    assert plan.decode_ids == (1,)
    assert w.step_time_s(plan) == pytest.approx(10 * _layer_time(0, 1, 4, 0))
