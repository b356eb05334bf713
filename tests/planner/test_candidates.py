"""Candidate placements scored by the prediction (planner.predicted.best_candidate, reserved_problem).

The max flow rewards every layer a node can hold; what users get is bounded by the KV those
layers leave. On a small constructed cluster a placement with less max flow but more KV is
predicted, and simulated, to serve more than the max-flow pick."""

from __future__ import annotations

from pathlib import Path

import pytest

from helix.core.costmodel import CostModel
from helix.sim.engine import SimConfig
from helix.sim.run import build_simulator
from helix.sim.workload import load_azure_trace, resolve_trace
from helix.core.slices import as_placement
from helix.core.spec import ClusterSpec, load_cluster
from planner.budget import at_budget
from planner.build import build_problem
from planner.flowgraph import max_flow
from planner.options import PlanOptions
from planner.predicted import CANDIDATE_MARGIN, best_candidate, choose, evaluate, reserved_problem
from planner.search import construct
from planner.search.baselines import uniform

REPO = Path(__file__).resolve().parents[2]


def small_spec() -> ClusterSpec:
    """4 A100 + 6 T4 serving LLaMA-2 70B, a full batch of 128 sequences."""
    return ClusterSpec.model_validate({
        "model": "llama-2-70b", "dtype": "float16", "serving": {"max_batch_seqs": 128},
        "regions": {"r": {"bandwidth": "10Gbps", "latency": "1ms"}},
        "nodes": [{"name": "a100-{i}", "gpu": "A100-40G", "count": 4},
                  {"name": "t4-{i}", "gpu": "T4", "count": 6}]})


def test_reserved_problem_caps_layers_as_the_larger_reserve():
    spec = small_spec()
    problem, cost = build_problem(spec), CostModel.for_cluster(spec)
    capped = reserved_problem(problem, spec, cost, 128)
    big = CostModel(cost.model, cost.dtype_bytes, cost.workload,
                    cost.serving.model_copy(update={"min_kv_requests": 128}))
    for before, after in zip(problem.nodes, capped.nodes):
        node = spec.node(before.name)
        assert after.max_layers == big.max_layers(node) < before.max_layers
        assert after.max_layers_first == big.max_layers(node, first=True)
        assert after.throughput_tokens_per_s == \
            before.throughput_tokens_per_s[:len(after.throughput_tokens_per_s)]
    assert reserved_problem(problem, spec, cost, cost.serving.min_kv_requests) is None


def test_the_artifacts_layer_caps_are_a_300_request_reserve():
    """The Helix artifact caps LLaMA-2 70B at 12 / 7 / 4 layers on A100 / L4 / T4 (its
    model_manager, 'use 20.1 / 12.1 / 7.5 GB for parameters'); a reserve of 320 mean requests of
    the Azure conversation trace gives the same caps here (module docstring of planner.predicted)."""
    spec = load_cluster(REPO / "cluster_specs" / "single24.yaml")
    problem = build_problem(spec)
    capped = reserved_problem(problem, spec, CostModel.for_cluster(spec), 320)
    caps = {n.gpu: n.max_layers for n in capped.nodes}
    assert caps == {"A100-40G": 12, "L4": 7, "T4": 4}


def _simulated_decode(spec, plan_, duration_s: float = 120.0) -> float:
    trace = load_azure_trace(resolve_trace("conv"), 2048, 1024)
    sim = build_simulator(spec, plan_, trace, SimConfig(mode="offline", duration_s=duration_s),
                          "helix")
    return sim.run().decode_throughput_tokens_per_s


def test_a_candidate_chosen_by_the_prediction_serves_more_than_the_flow_pick():
    """The max-flow pick (one chain, layers by T(1): 6,242 tokens/s) against the sweep
    placement (5,875 tokens/s, fewer layers on the T4s, so more KV): the prediction prefers the
    second, and the simulator agrees by more than the planner's margin (255 vs 209 decode tokens/s
    at a 2048-token step budget, where convoys cost more; predicted 249 vs 202). At 512 the
    simulator's 287 vs 268 is predicted 274 vs 263, inside the margin; at the default 256 both
    prefer the flow pick (predicted 339 vs 309, simulated 329 vs 310), so this runs at 2048."""
    spec = at_budget(small_spec(), 2048)
    problem, cost = build_problem(spec), CostModel.for_cluster(spec)
    flow_pick = evaluate(spec, uniform(problem), problem=problem)
    swept = construct.sweep(problem)
    assert max_flow(problem, swept, True).value_tokens_per_s < flow_pick.max_flow_tokens_per_s
    cand = [("sweep", swept)]
    chosen = best_candidate(spec, problem, cost, flow_pick, cand)
    again = best_candidate(spec, problem, cost, flow_pick, cand)
    assert chosen.placements == again.placements and chosen.prediction == again.prediction
    assert chosen.extras["chosen_by"] == "prediction: sweep"
    assert as_placement(chosen.placements) == swept
    assert chosen.prediction.prompt_decode_tokens_per_s > \
        flow_pick.prediction.prompt_decode_tokens_per_s * (1 + CANDIDATE_MARGIN)
    kept = chosen.extras["max_flow_placement"]
    assert kept["placement"] == {p.node: [p.start, p.end] for p in flow_pick.placements}
    assert kept["max_flow_tokens_per_s"] == flow_pick.max_flow_tokens_per_s
    # The bound of the flow problem holds for every placement; the status speaks of the new flow.
    assert chosen.upper_bound_tokens_per_s == flow_pick.upper_bound_tokens_per_s
    assert chosen.extras["status"] == "feasible"
    assert _simulated_decode(spec, chosen) > \
        (1 + CANDIDATE_MARGIN) * _simulated_decode(spec, flow_pick)


def test_a_candidate_predicted_no_better_leaves_the_incumbent():
    spec = small_spec()
    problem, cost = build_problem(spec), CostModel.for_cluster(spec)
    flow_pick = evaluate(spec, uniform(problem), problem=problem)
    same = best_candidate(spec, problem, cost, flow_pick, [("itself", uniform(problem))])
    assert same.placements == flow_pick.placements and "chosen_by" not in same.extras
    assert same.extras["candidates"][0][0] == "itself"


@pytest.mark.slow
def test_plan_scores_the_reserve_candidate():
    """helix plan's path: the reserve MILP, Swarm and the KV stage chains are scored; whatever wins beats the max-flow
    pick's prediction by the margin, or the max-flow pick stays."""
    spec = small_spec()
    found = choose(spec, PlanOptions(time_limit_s=8, threads=1))
    names = [name for name, _ in found.extras["candidates"]]
    firsts = [n for n in names if not n.startswith("kv stages: ")]   # planner.search.kv_stages
    assert firsts == ["milp, KV reserve 128 requests", "swarm"] or \
        firsts == ["milp, KV reserve 128 requests"]
    assert names[:len(firsts)] == firsts and len(names) > len(firsts)
    if "chosen_by" in found.extras:
        assert found.prediction.prompt_decode_tokens_per_s > (1 + CANDIDATE_MARGIN) * \
            found.extras["max_flow_placement"]["predicted_tokens_per_s"]
