"""The time limit is the user's: ``planner.plan`` and ``helix plan`` finish within it (search,
candidate scoring, prediction), each phase saying when it starts, and the summary keeps the
max-flow search's result (flow, bound, gap, status) apart from the placement chosen on predicted
throughput."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from helix.cli import main
from helix.core.costmodel import CostModel
from helix.core.spec import parse_cluster
from helix.commands.plan import _summary
from planner import plan
from planner.budget import at_budget
from planner.build import build_problem
from planner.deadline import Deadline
from planner.options import PlanOptions
from planner.predicted import best_candidate, choice, evaluate, max_flow_result
from planner.search import construct
from planner.search.baselines import uniform
from planner.search.kv_stages import chain_placements
from scripts.gen_cluster import generate
from tests.planner.test_candidates import small_spec

REPO = Path(__file__).resolve().parents[2]
LOCAL3 = str(REPO / "cluster_specs" / "local3.yaml")


def test_the_verb_finishes_within_a_short_limit_on_a_generated_cluster():
    """20 nodes in 2 regions: the search, the KV-reserve re-solve, the KV stage chains and the
    candidates' predictions all want more than 5 s; each phase gets its share and the plan
    comes back in time (10 % and 1.5 s for what a phase cannot cut: building a model, one
    prediction, a loaded machine), every phase announced in order."""
    spec = parse_cluster(generate(20, 2, seed=0))
    phases: list[str] = []
    started = time.perf_counter()
    deadline = Deadline.after(5.0, lambda name, elapsed_s: phases.append(name))
    placed = plan(spec, PlanOptions(time_limit_s=5.0, threads=1), deadline=deadline)
    took = time.perf_counter() - started
    assert took <= 5.0 * 1.1 + 1.5, (took, phases)
    assert placed.placements and placed.prediction is not None
    assert phases[0].startswith("search: max flow (milp)")
    assert phases[-1].startswith("serving")
    result = placed.extras["max_flow_result"]
    assert result["status"] in ("optimal", "gap", "feasible")
    assert result["bound_tokens_per_s"] >= result["max_flow_tokens_per_s"] > 0
    assert placed.extras["choice"]["reason"]


def test_chains_and_candidates_stop_at_a_passed_deadline():
    spec = small_spec()
    problem, cost = build_problem(spec), CostModel.for_cluster(spec)
    assert chain_placements(spec, cost, problem.num_layers, ("r",))
    assert chain_placements(spec, cost, problem.num_layers, ("r",),
                            deadline_s=time.perf_counter() - 1) == []
    flow_pick = evaluate(spec, uniform(problem), problem=problem)
    passed = Deadline(time.perf_counter() - 2, 1.0)
    kept = best_candidate(spec, problem, cost, flow_pick, [("sweep", construct.sweep(problem))],
                          deadline=passed)
    assert kept.placements == flow_pick.placements
    assert kept.extras["candidates"] == [] and kept.extras["candidates_unscored"] == 1
    said = choice(kept, max_flow_result(flow_pick))
    assert said["placement"] == "max flow"
    assert said["reason"] == "no candidate scored before the time limit (1 left)"


def test_the_summary_prints_the_max_flow_result_apart_from_the_choice():
    """A candidate chosen on its prediction has less max flow by design: the printed gap is the
    max-flow placement's, and the chosen line says which placement serves and why."""
    spec = at_budget(small_spec(), 2048)   # where the sweep placement wins (test_candidates)
    problem, cost = build_problem(spec), CostModel.for_cluster(spec)
    flow_pick = evaluate(spec, uniform(problem), problem=problem)
    flow_pick = dataclasses.replace(flow_pick, upper_bound_tokens_per_s=(
        flow_pick.max_flow_tokens_per_s * 1.01))
    result = max_flow_result(flow_pick)
    chosen = best_candidate(spec, problem, cost, flow_pick, [("sweep", construct.sweep(problem))])
    assert chosen.extras["chosen_by"] == "prediction: sweep" and chosen.gap > 0.03
    chosen = dataclasses.replace(chosen, extras={**chosen.extras, "max_flow_result": result,
                                                 "choice": choice(chosen, result)})
    text = _summary(chosen)
    assert f"max flow   {flow_pick.max_flow_tokens_per_s:,.1f} tokens/s" in text
    assert "gap 1.00 %" in text and f"{chosen.gap * 100:.2f} %" not in text
    assert "chosen     sweep, by the prediction: predicted +" in text
    assert f"its own max flow {chosen.max_flow_tokens_per_s:,.1f} tokens/s" in text


def test_helix_plan_says_each_phase_on_stderr_and_keeps_stdout_json(capsys):
    assert main(["plan", LOCAL3, "--threads", "1", "--time-limit", "5", "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["extras"]["max_flow_result"]["status"] in ("optimal", "gap", "feasible")
    lines = captured.err.splitlines()
    assert any("search: max flow (milp)" in line for line in lines), lines
    assert main(["plan", LOCAL3, "--threads", "1", "--time-limit", "5", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "search: max flow" not in captured.err
    assert "the max-flow placement, found by" in captured.out and "chosen     " in captured.out


@pytest.mark.parametrize("method, tables, nodes, says", [
    ("swarm", False, 24, "placed by swarm"),
    ("milp", True, 24, "throughput tables give each node its rate"),
    ("milp", False, 1000, "clusters of up to"),
    ("milp", False, 24, None),
])
def test_the_choice_says_why_no_candidate_was_scored(method, tables, nodes, says):
    from planner.predicted import _why_unscored
    why = _why_unscored(method, tables, nodes)
    assert (why is None) if says is None else (says in why)
