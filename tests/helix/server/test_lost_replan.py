"""A node whose worker cannot be restarted is a departure to the re-plan trigger: the in-process
stack on ``helix plan``'s placement of cluster_specs/local3.yaml (cpu-0 whole; cpu-2 -> cpu-1)
loses cpu-2's worker; once it is reported lost, :meth:`Elastic.node_lost` re-plans without it, the
adopted plan is applied (the dead node leaves the plan at once: its requests had moved) and
greedy outputs are still ``transformers``'."""

from __future__ import annotations

import pytest

from coordinator.health import HealthConfig
from coordinator.runtime import RuntimeConfig
from helix.net.sampling import SamplingParams
from helix.server.elastic import Elastic
from helix.core.spec import load_cluster

from tests.builders.elastic import LOCAL3, plan_without
from tests.builders.serving import PROMPTS, hf_greedy
from tests.builders.stack import local_stack
from tests.builders.traffic import finish, submit_all, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_a_lost_node_leaves_the_plan_by_a_replan(tiny_model):
    ckpt, model = tiny_model
    spec = load_cluster(LOCAL3)
    config = RuntimeConfig(stats_interval_s=0.1, request_timeout_s=60,
                           health=HealthConfig(suspect_after_s=0.5, dead_after_s=2.0))
    with local_stack(ckpt, config, plan=plan_without(spec, None)) as s:
        coord = s.coordinator
        prompts = [tuple(coord.codec.encode(p)) for p in PROMPTS]
        reference = {p: hf_greedy(model, p, 12) for p in prompts}
        elastic = Elastic(coord, spec, apply_timeout_s=30)
        next(w for w in s.servers if w.node == "cpu-2").shutdown()
        until(lambda: coord.node_states()["cpu-2"] == "dead", 10, "cpu-2 dead")
        coord.mark_lost("cpu-2", "no live Ray node offers its resource (its machine is gone)")
        assert coord.node_status("cpu-2").state == "lost"
        elastic.node_lost("cpu-2", wait=True)
        (replan,) = elastic.replans
        assert replan["cause"] == "leave cpu-2" and replan["applied"], replan
        assert "cpu-2" not in coord.workers and "cpu-2" not in elastic.trigger.present
        assert {p.node for p in coord.plan.placements} == {"cpu-0", "cpu-1"}
        finish(submit_all(coord, prompts, 8, SamplingParams(temperature=0, max_tokens=12)),
               prompts, reference)
        until(lambda: coord.capacity_fraction == 1.0, 5, "the new plan's capacity serving")
