"""Drains and joins in the simulator (``SimConfig.drains`` / ``joins``), as the live
coordinator handles them: a drained node gets no new request after its time and its requests finish
(or move), a joined one gets requests only after its time; nothing is lost and every token counts
once; the phases report throughput before, during and after."""

import dataclasses

import pytest

from helix.sim.engine import NodeDrain, NodeFailure, NodeJoin, SimConfig
from tests.builders.sims import burst, make_sim
from tests.helix.sim.test_failures import _conserved, two_pipelines


def _run(drains=(), joins=(), failures=(), n=80, gap_s=0.1, scheduler="helix"):
    """Arrivals every ``gap_s`` (8 s of them by default) on two pipelines A->B and C->D."""
    workload = burst(n, 20, 30, gap_s)
    config = SimConfig(mode="online", duration_s=None, chunk_tokens=0, drains=drains, joins=joins,
                       failures=failures)
    sim = make_sim(two_pipelines(), workload, config, scheduler=scheduler)
    return sim, sim.run(), workload


@pytest.mark.parametrize("scheduler", ["helix", "swarm", "random"])
def test_a_drained_node_gets_no_new_request_and_its_requests_finish_in_place(scheduler):
    sim, r, workload = _run((NodeDrain("B", 2.0),), scheduler=scheduler)
    _conserved(r, workload)
    b = sim.workers["B"]
    assert b.routed >= 1 and b.last_routed_s <= 2.0                 # none after the drain
    assert r.requests_moved == 0                                     # they finished where they were
    assert sim.workers["D"].last_routed_s > 2.0                      # the other pipeline took over
    assert [p["label"] for p in r.phases] == ["before drain B", "after drain B", "after B drained"]
    assert 2.0 < r.phases[2]["start_s"] == sim.drained_s["B"] < r.duration_s   # empty once they did
    assert not b.requests and b.policy.blocks.num_used_blocks == 0
    assert r.node_requests["B"] == b.routed and r.node_requests["D"] > r.node_requests["B"]


def test_drain_with_move_empties_the_node_at_once_and_loses_nothing():
    sim, r, workload = _run((NodeDrain("B", 2.0, move=True),))
    _conserved(r, workload)
    assert r.requests_moved >= 1 and sim.drained_s["B"] == 2.0
    assert sim.workers["B"].busy_s < 2.0 + 1e-9 + 0.5   # at most the step it was in


def test_a_joined_node_gets_requests_only_after_it_joins():
    sim, r, workload = _run(joins=(NodeJoin("D", 3.0),))
    _conserved(r, workload)
    d = sim.workers["D"]
    assert d.routed >= 1 and d.first_routed_s >= 3.0
    assert sim.workers["C"].first_routed_s >= 3.0   # C's only pipeline needs D
    assert [p["label"] for p in r.phases] == ["before join D", "after join D"]
    before, after = r.phases
    assert before["end_s"] == after["start_s"] == 3.0


def test_phases_split_the_tokens_and_the_drain_slows_the_cluster():
    """Saturated (offline), KV for 9 requests per node: two pipelines, then one."""
    workload = burst(200, 20, 30)
    sim = make_sim(two_pipelines(), workload, SimConfig(duration_s=None, chunk_tokens=0,
                                                        drains=(NodeDrain("D", 5.0),)), kv_tokens=500)
    r = sim.run()
    _conserved(r, workload)
    total = sum(p["decode_tokens_per_s"] * (p["end_s"] - p["start_s"]) for p in r.phases)
    assert total == pytest.approx(r.tokens_generated)
    before, during, after = r.phases
    assert before["end_s"] == during["start_s"] == 5.0 and during["end_s"] == after["start_s"]
    # B alone serves the last layers now (A->B, and C->B by the fallback hops): its steps interleave
    # two first stages' batches, so the loss is less than half (deterministic: 48 -> 36 tokens/s).
    assert 0 < after["decode_tokens_per_s"] < 0.8 * before["decode_tokens_per_s"]


def test_a_failed_draining_node_comes_back_still_drained():
    """Down while draining (its requests move), back empty: it stays out of routing."""
    sim, r, workload = _run((NodeDrain("B", 1.0),),
                            failures=(NodeFailure("B", 1.5, down_for_s=1.0, detect_s=0.3),))
    _conserved(r, workload)
    assert sim.workers["B"].last_routed_s <= 1.0 and not sim.workers["B"].down


def test_unknown_nodes_and_bad_times_are_refused():
    with pytest.raises(ValueError, match="hold no layers"):
        _run((NodeDrain("Z", 1.0),))
    with pytest.raises(ValueError, match="hold no layers"):
        _run(joins=(NodeJoin("Z", 1.0),))
    with pytest.raises(ValueError):
        NodeDrain("A", -1.0)
    runs = [_run((NodeDrain("B", 2.0),), joins=(NodeJoin("D", 1.0),))[1] for _ in range(2)]
    assert dataclasses.replace(runs[0], wall_s=0, samples={}) == dataclasses.replace(runs[1], wall_s=0,
                                                                                      samples={})


def _with_capacities(plan):
    """``two_pipelines`` with flow-graph capacities: A and B carry 2 tokens/s, C and D 1, every hop
    (A->D and C->B too) plenty."""
    big = 100.0
    arcs = [["coordinator", n, big] for n in "AC"] + [[n, "coordinator", big] for n in "BD"]
    arcs += [[a, b, big] for a in "AC" for b in "BD"]
    table = {"nodes": {"A": 2.0, "B": 2.0, "C": 1.0, "D": 1.0}, "arcs": arcs}
    return dataclasses.replace(plan, extras={**plan.extras, "flow_capacities": table})


def test_with_capacities_drains_and_joins_re_solve_the_max_flow():
    """As the live coordinator: routing follows the max flow of the nodes taking requests (C's
    requests go C -> B while D is out), the plan's own flows once every node is back."""
    plan = _with_capacities(two_pipelines())
    workload = burst(80, 20, 30, 0.1)
    drained = make_sim(plan, workload, SimConfig(mode="online", duration_s=None, chunk_tokens=0,
                                                 drains=(NodeDrain("D", 2.0),)), flow_plan=plan)
    r = drained.run()
    _conserved(r, workload)
    assert not any("D" in (a.src, a.dst) for a in drained._flows)
    assert sum(a.flow_tokens_per_s for a in drained._flows if a.src == "coordinator") == 2.0
    assert {("C", "B")} <= {(a.src, a.dst) for a in drained._flows}
    assert drained.workers["D"].last_routed_s <= 2.0
    joined = make_sim(plan, workload, SimConfig(mode="online", duration_s=None, chunk_tokens=0,
                                                joins=(NodeJoin("D", 3.0),)), flow_plan=plan)
    r = joined.run()
    _conserved(r, workload)
    assert joined._flows == plan.arc_flows and joined.workers["D"].first_routed_s >= 3.0
    assert joined.workers["C"].first_routed_s < 3.0   # C -> B served while D was absent
