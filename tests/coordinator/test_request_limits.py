"""The one check of a request against the served model and pipelines (pure: no workers)."""

from __future__ import annotations

import pytest

from coordinator.pipeline import Topology
from coordinator.requests import RequestLimits, max_kv_tokens
from helix.core.errors import HelixUserError
from helix.core.plan import COORDINATOR
from tests.builders.plans import make_plan
from helix.net.sampling import SamplingParams

# cpu-0 [0,4) feeds cpu-1 [2,8) or cpu-2 [4,8).
PLAN = make_plan(8, {"cpu-0": (0, 4), "cpu-1": (2, 8), "cpu-2": (4, 8)},
                 {(COORDINATOR, "cpu-0"): 3.0, ("cpu-0", "cpu-1"): 2.0, ("cpu-0", "cpu-2"): 1.0,
                  ("cpu-1", COORDINATOR): 2.0, ("cpu-2", COORDINATOR): 1.0})


def _limits(tokens: dict[str, float]) -> dict[str, tuple[float, int]]:
    """Token-layer limits from per-node token limits."""
    layers = {p.node: p.end - p.start for p in PLAN.placements}
    return {n: (t * layers[n], layers[n]) for n, t in tokens.items()}


def test_max_kv_tokens_is_the_widest_pipelines_narrowest_stage():
    topo = Topology.from_plan(PLAN, flows_only=False)
    assert max_kv_tokens(topo, _limits({"cpu-0": 1000, "cpu-1": 100, "cpu-2": 500})) == 500
    assert max_kv_tokens(topo, _limits({"cpu-0": 1000, "cpu-1": 100})) == 100   # cpu-2 excluded
    assert max_kv_tokens(topo, _limits({"cpu-0": 80, "cpu-1": 100, "cpu-2": 500})) == 80
    assert max_kv_tokens(topo, _limits({"cpu-1": 100, "cpu-2": 500})) == 0      # no first stage
    # 0.9 x 128 tokens x 4 layers: 115 tokens fit (460.8 >= 460), 116 do not.
    assert max_kv_tokens(topo, {n: (0.9 * 128 * 4, 4) for n in ("cpu-0", "cpu-2")}) == 115


LIMITS = RequestLimits(vocab_size=100, max_context_tokens=64, max_kv_tokens=40)


@pytest.mark.parametrize("prompt,params,match", [
    ([], SamplingParams(), "empty"),
    ([1, 100], SamplingParams(), r"integers in \[0, 100\).*\[100\]"),
    ([1, -1], SamplingParams(), r"\[-1\]"),
    ([1, True], SamplingParams(), r"\[True\]"),
    ([1, 2.0], SamplingParams(), r"\[2.0\]"),
    ([1], SamplingParams(stop_token_ids=(5, 100)), r"stop_token_ids \[100\] outside"),
    ([1], SamplingParams(logprobs=21), r"logprobs must be in \[0, 20\]"),
    ([1] * 10, SamplingParams(max_tokens=60), "context of 64"),
    ([1] * 10, SamplingParams(max_tokens=31), "KV cache for 41 tokens.*more than 40"),
])
def test_bad_requests_are_refused_with_the_reason(prompt, params, match):
    with pytest.raises(HelixUserError, match=match):
        LIMITS.check(prompt, params)


def test_a_request_at_every_bound_passes():
    assert LIMITS.check([0, 99] * 5, SamplingParams(max_tokens=30, stop_token_ids=(99,),
                                                    logprobs=20)) == (0, 99) * 5


def test_no_max_tokens_means_the_end_of_the_context_or_of_the_kv():
    limits = RequestLimits(vocab_size=100, max_context_tokens=512, max_kv_tokens=400)
    unset = SamplingParams(max_tokens=None)
    assert limits.resolve(30, unset).max_tokens == 370            # the KV ends before the context
    roomy = RequestLimits(vocab_size=100, max_context_tokens=512, max_kv_tokens=4096)
    assert roomy.resolve(30, unset).max_tokens == 482             # the context's end, as vLLM
    capped = RequestLimits(100, 512, 4096, default_max_tokens=40)  # generation_config.json
    assert capped.resolve(30, unset).max_tokens == 40
    assert capped.resolve(500, unset).max_tokens == 12
    assert roomy.resolve(30, SamplingParams(max_tokens=7)).max_tokens == 7   # the request's own
    with pytest.raises(HelixUserError, match="leaves no room to generate"):
        roomy.resolve(512, unset)
    roomy.check(range(1, 31), roomy.resolve(30, unset))           # a resolved request passes


def test_reservations_follow_the_mean_of_served_lengths():
    from coordinator.kv_estimator import OutputLengthMean
    mean = OutputLengthMean(232, window=4)
    assert mean.reservation(16) == 16 and mean.reservation(10_000) == 232
    for _ in range(40):
        mean.observe(50)
    assert mean.mean == pytest.approx(50, abs=0.01)                # follows the served mix
    mean.observe(0)
    assert mean.reservation(10_000) == 38 and mean.reservation(1) == 1   # ceil(37.5)
