from pathlib import Path

import pytest

from helix.core.plan import COORDINATOR
from helix.sim.build import build_simulator
from helix.sim.engine import SimConfig
from helix.sim.workload import TraceRequest
from helix.core.spec import load_cluster
from planner.build import build_problem
from tests.builders.sims import single24_plan

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def single24():
    return load_cluster(REPO / "cluster_specs" / "single24.yaml")


def test_token_ids_cost_the_bytes_the_planner_counts(single24):
    # LLaMA-2's 32k vocabulary fits in 16 bits: the planner sizes coordinator arcs at 2 bytes per
    # token id, so the simulator must put 2 bytes per id on those links too (it used 4).
    prompt, output = 100, 3
    sim = build_simulator(single24, single24_plan(single24), (TraceRequest(0.0, prompt, output),),
                          SimConfig(duration_s=None))
    assert sim.run().requests_completed == 1
    used = {k: b for k, (_, b) in sim.network.link_stats().items() if b > 0}
    (to_first,) = [k for k in used if k[0] == COORDINATOR]
    (from_last,) = [k for k in used if k[1] == COORDINATOR]
    links = build_problem(single24).links
    # The prompt, then every sampled token but the last fed back to stage 0; every token comes back.
    for arc, num_ids in ((to_first, prompt + output - 1), (from_last, output)):
        planner_bytes_per_id = single24.link(*arc).bandwidth_bytes_per_s / \
            links[arc].capacity_tokens_per_s
        assert planner_bytes_per_id == pytest.approx(2)
        assert used[arc] == pytest.approx(num_ids * planner_bytes_per_id)
