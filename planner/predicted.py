"""``plan(spec, method) -> Plan`` that maximizes what users get: the planner wrapped in an outer loop.

The flow graph needs node capacities that are linear in the placement; what a node delivers inside
a pipeline depends on the pipelines (``helix.costmodel``, *Inside a pipeline*). So, from outside
``planner.solve``:

1. solve with T(k) (a node batching every request its KV holds);
2. predict the plan (``helix.prediction``): how long a request stays in each pipeline;
3. give every node the capacity Little's law allows with that stay,
   ``min(T(k), M(k) (p + o) / stay)`` for every k (its pipelines' mean stay, weighted by requests;
   the plan's mean for a node left out), and solve again;
4. repeat until a placement comes back (a fixed point, or a cycle) or ``iterations`` solves ran.

Heuristic methods and specs with explicit T(k) tables (reference inputs) solve once, with T(k).

The plan returned is the one with the highest predicted prompt + decode tokens/s; its max flow,
bound, gap and status describe the inner problem it was solved on (``extras['capacities']`` says
which), and ``prediction`` is the outer figure. Each solve gets an equal share of the time limit.
Deterministic when the solves are (the loop itself has no randomness and a fixed order).
"""

from __future__ import annotations

import dataclasses
import logging

from helix.costmodel import CostModel
from helix.models import ModelSpec
from helix.plan import Plan
from helix.prediction import PipelineState, predict
from helix.spec import ClusterSpec
from helix.plan import COORDINATOR, ArcFlow
from planner.build import build_problem
from planner.flowgraph import max_flow
from planner.problem import Link, NodeCapacity, PlacementProblem
from planner.search.baselines import HEURISTICS
from planner.solve import evaluate as evaluate_placement, solve

log = logging.getLogger("helix.planner")

#: Solves at most (the first with T(k), the others with pipeline capacities). One by default:
#: the pipeline-capacity rounds favour long shared pipelines (30B on single24: one 18-stage
#: pipeline) and cross-region ones, where the prediction is not yet accurate (simulated: 30B
#: single24 +52 %, geo24 +246 %, where round-1 plans are within 15 %), so they would chase the
#: model's errors. ``iterations=3`` runs the fixed point.
ITERATIONS = 1


def node_stays(states: tuple[PipelineState, ...]) -> tuple[dict[str, float], float]:
    """Per node, the mean stay of requests through it (weighted by requests/s); and the mean
    over all pipelines, for nodes no pipeline uses."""
    weight: dict[str, float] = {}
    total: dict[str, float] = {}
    all_w = all_t = 0.0
    for s in states:
        if s.requests_per_s <= 0:
            continue
        stay = s.requests_in_flight / s.requests_per_s
        all_w += s.requests_per_s
        all_t += s.requests_per_s * stay
        for n in s.pipeline.nodes:
            weight[n] = weight.get(n, 0.0) + s.requests_per_s
            total[n] = total.get(n, 0.0) + s.requests_per_s * stay
    mean = all_t / all_w if all_w > 0 else 0.0
    return {n: total[n] / weight[n] for n in weight}, mean


def pipeline_problem(problem: PlacementProblem, spec: ClusterSpec, cost: CostModel,
                     states: tuple[PipelineState, ...]) -> PlacementProblem | None:
    """``problem`` with every node's T(k) replaced by its pipeline capacity (module docstring);
    None when the states give no stay to use."""
    stays, mean = node_stays(states)
    if mean <= 0:
        return None
    nodes = []
    for n in problem.nodes:
        stay = stays.get(n.name, mean)
        node = spec.node(n.name)
        table = tuple(cost.pipeline_capacity_tokens_per_s(node, k, stay)
                      for k in range(1, len(n.throughput_tokens_per_s) + 1))
        nodes.append(dataclasses.replace(n, throughput_tokens_per_s=table))
    return dataclasses.replace(problem, nodes=tuple(nodes))


def _with_flows(plan: Plan, flows: dict[tuple[str, str], float], routing: str) -> Plan:
    arcs = tuple(ArcFlow(u, v, f) for (u, v), f in sorted(flows.items()) if f > 1e-9)
    return dataclasses.replace(plan, arc_flows=arcs, extras={
        **plan.extras, "routing": routing,
        "routed_tokens_per_s": sum(f for (u, _), f in flows.items() if u == COORDINATOR)})


def routings(problem: PlacementProblem, found: Plan) -> list[Plan]:
    """``found`` with its max-flow arcs, and with flows that keep pipelines within one GPU kind
    and region first.

    Any max flow is as good as another to the flow graph, but not to users: a pipeline is as slow
    as its slowest stages and holds KV on all of them, so an A100 that passes tokens to L4s serves
    at the L4s' pace, and a hop between regions costs a slow link. The routings are built in
    phases, each a max flow over what the previous ones left, over links between nodes of the
    same kind in the same region (kind chains), inside a region, or any; every prefix of the
    sequences kind chains -> regions -> the rest, kind chains -> the rest and regions -> the rest
    is a candidate. Every candidate is a flow of the placement, at most its max flow."""
    placement = {p.node: (p.start, p.end) for p in found.placements}
    kind = {n.name: (n.gpu, n.region) for n in problem.nodes}
    region = {n.name: n.region for n in problem.nodes}
    phases = {"kind chains": lambda a, b: kind.get(a) == kind.get(b),
              "regions": lambda a, b: region.get(a) == region.get(b),
              "the rest": lambda a, b: True}
    out, seen = [found], set()
    for sequence in (("kind chains", "regions", "the rest"), ("kind chains", "the rest"),
                     ("regions", "the rest")):
        nodes, links = problem.nodes, dict(problem.links)
        total: dict[tuple[str, str], float] = {}
        names: list[str] = []
        for name in sequence:
            allowed = phases[name]
            usable = {k: v for k, v in links.items() if COORDINATOR in k or allowed(*k)}
            flow = max_flow(dataclasses.replace(problem, nodes=nodes, links=usable), placement,
                            found.partial_inference)
            if flow.value_tokens_per_s <= 1e-9:
                continue
            for k, f in flow.arc_flows.items():
                total[k] = total.get(k, 0.0) + f
            names.append(name)
            key = tuple(sorted((k, round(f, 6)) for k, f in total.items() if f > 1e-9))
            if key not in seen:
                seen.add(key)
                out.append(_with_flows(found, dict(total), " + ".join(names)))
            nodes = tuple(_minus(n, placement, flow.node_flows.get(n.name, 0.0)) for n in nodes)
            links = dict(links)   # only the arcs that carried flow lose capacity
            for k, f in flow.arc_flows.items():
                v = links[k]
                links[k] = Link(max(0.0, v.capacity_tokens_per_s - f), v.latency_s)
    return out


def _minus(node: NodeCapacity, placement, used: float) -> NodeCapacity:
    """``node`` with ``used`` tokens/s less capacity at the layer count it holds."""
    start, end = placement.get(node.name, (0, 0))
    table = tuple(max(0.0, t - used) if i + 1 == end - start else t
                  for i, t in enumerate(node.throughput_tokens_per_s))
    return dataclasses.replace(node, throughput_tokens_per_s=table)


def best_routing(spec: ClusterSpec, problem: PlacementProblem, solved: Plan, cost: CostModel
                 ) -> tuple[Plan, tuple[PipelineState, ...]]:
    """``solved`` with the routing users get the most from (:func:`routings`; ties: the solver's
    own flows) and its prediction, on ``problem``'s capacities."""
    found, states = None, ()
    for routed in routings(problem, solved):
        prediction, routed_states = predict(spec, routed, cost)
        if found is None or prediction.prompt_decode_tokens_per_s > \
                found.prediction.prompt_decode_tokens_per_s * (1 + 1e-9):
            found, states = dataclasses.replace(routed, prediction=prediction), routed_states
    assert found is not None
    return found, states


def evaluate(spec: ClusterSpec, placement, *, model: ModelSpec | None = None,
             problem: PlacementProblem | None = None, partial_inference: bool = True,
             source: str = "given") -> Plan:
    """``placement`` as it is (no search), as :func:`plan` would report it: its max flow, the
    routing users get the most from and what they get (the running placement when re-planning)."""
    problem = problem or build_problem(spec, model)
    found, _ = best_routing(spec, problem, evaluate_placement(problem, placement, partial_inference,
                                                              source),
                            CostModel.for_cluster(spec, model))
    return found


def _key(plan: Plan) -> tuple:
    return tuple((p.node, p.start, p.end) for p in plan.placements)


def plan(spec: ClusterSpec, method: str = "milp", *, model: ModelSpec | None = None,
         problem: PlacementProblem | None = None, time_limit_s: float = 60.0,
         iterations: int = ITERATIONS, **solve_kwargs) -> Plan:
    """The placement of ``spec``'s model (or ``model``) with the highest predicted throughput
    (module docstring). ``problem``: ``build_problem(spec, model)`` when already built;
    ``solve_kwargs`` go to :func:`planner.solve.solve`."""
    cost = CostModel.for_cluster(spec, model)
    problem = problem or build_problem(spec, model)
    # Explicit T(k) tables (reference inputs) are taken as given: one solve, as before.
    rounds = 1 if method in HEURISTICS or cost.throughput_tables else max(1, iterations)
    share = time_limit_s / rounds
    best: Plan | None = None
    seen: set[tuple] = set()
    inner = problem
    history = []
    for i in range(rounds):
        solved = solve(inner, method, time_limit_s=share, **solve_kwargs)
        solved = dataclasses.replace(solved, extras={
            **solved.extras, "capacities": "T(k)" if i == 0 else f"pipeline-aware (round {i + 1})"})
        found, states = best_routing(spec, inner, solved, cost)
        prediction = found.prediction
        history.append(round(prediction.prompt_decode_tokens_per_s, 1))
        if best is None or prediction.prompt_decode_tokens_per_s > \
                best.prediction.prompt_decode_tokens_per_s:  # type: ignore[union-attr]
            best = found
        key = _key(found)
        if key in seen:
            break
        seen.add(key)
        nxt = pipeline_problem(problem, spec, cost, states)
        if nxt is None:
            break
        inner = nxt
    assert best is not None
    return dataclasses.replace(best, extras={**best.extras, "predicted_by_round": history})
