"""``choose(spec, options) -> Plan`` that maximizes what users get: the search wrapped in an outer
loop (the first step of :func:`planner.plan`).

The flow graph needs node capacities that are linear in the placement; what a node delivers inside
a pipeline depends on the pipelines (``helix.core.costmodel``, *Inside a pipeline*). So, from outside
``planner.solve``:

1. solve with T(k) (a node batching every request its KV holds);
2. predict the plan (``planner.prediction``): how long a request stays in each pipeline;
3. give every node the capacity Little's law allows with that stay,
   ``min(T(k), M(k) (p + o) / stay)`` for every k (its pipelines' mean stay, weighted by requests;
   the plan's mean for a node left out), and solve again;
4. repeat until a placement comes back (a fixed point, or a cycle) or ``options.iterations``
   solves ran.

Heuristic methods and specs with explicit T(k) tables (reference inputs) solve once, with T(k).

Then, for ``milp`` on cost-model clusters of at most :data:`CANDIDATE_MAX_NODES` nodes, placements
that trade weight copies for KV are scored by the same prediction, and one replaces the solver's
when it is predicted to serve :data:`CANDIDATE_MARGIN` more. The max flow rewards every copy of
the weights and every layer a node can hold, while users are served the requests in flight the
KV holds divided by the round trip (``helix.core.costmodel``, *Inside a pipeline*): a node filled with
layers up to the spec's small KV reserve (``serving.min_kv_requests``, 4 requests) keeps KV for
a handful of requests on each of them. The candidates are

* the MILP solved again with every node's layer count capped so that it keeps KV room for a full
  batch (``serving.max_batch_seqs`` requests) on each layer it holds (:func:`reserved_problem`):
  the Helix artifact's own rule (its per-GPU layer caps, e.g. 4 / 7 / 12 layers of LLaMA-2 70B on
  T4 / L4 / A100, leave each node room for its 280-480-sequence decode batch); chosen on single24
  (377 decode tokens/s in a 600 s simulation against 297) and hetero42 (875 against Swarm's 794
  and the max-flow plan's 506), not on geo24 (predicted and simulated worse there);
* the Swarm baseline's placement (``planner.search.baselines.swarm``): equal stages, many
  parallel nodes per stage, a short round trip;
* one copy of the weights as a chain of one-kind stages split to hold the most requests in
  flight (``planner.search.kv_stages``, :func:`kv_stage_candidates`; clusters with few GPU
  kinds and at most 4 regions, every way to chain the regions): chosen on single24 (A100s 8
  layers each, L4 pairs 7, T4 triples 5: 545 decode tokens/s in a 600 s simulation against 471
  for the capped-KV re-solve) and geo24 (one chain through all three regions, the US-East
  A100s first: 600 s at a 256-token budget, 477-480 against 430 for the A100s alone beside
  one chain over US-West and the EU, the pick before chains over three regions were built).

Mixed-kind chains of any depth (node classes cut into contiguous groups, a few replicas each)
were tried as candidates too and dropped: the prediction overstates them up to 3x on hetero42
(predicted 1,181 decode tokens/s, simulated 363), so choosing by it lost throughput. The KV
stage chains stop at 12 stages, where it holds (``planner.search.kv_stages.MAX_STAGES``).

The plan returned is the one with the highest predicted prompt + decode tokens/s; its max flow,
bound, gap and status describe the inner problem it was solved on (``extras['capacities']`` says
which; a candidate keeps the solver's bound, valid for every placement, and ``extras['chosen_by']``
names it), and ``prediction`` is the outer figure; ``extras['max_flow_result']`` keeps what the
search proved about its own placement and ``extras['choice']`` which placement was kept and why.

One :class:`~planner.deadline.Deadline` bounds it all: each solve (the candidate's too) gets an
equal share of the time limit less :data:`CANDIDATE_SHARE` (less still when a phase before it
ran over), the KV stage chains are sought for :data:`CHAIN_SHARE` of what is left after the
solves, and a candidate is scored only while the time left holds the longest scoring so far.
Deterministic when the solves are and the deadline is not reached (the loop itself has no
randomness and a fixed order).

Every prediction the loop compares (routings, candidates, and :mod:`planner.budget`'s step
budgets) is made by :func:`predict_plan`, its one way into :mod:`planner.prediction`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

from helix.core.costmodel import CostModel
from helix.core.errors import InfeasibleError
from helix.core.models import ModelSpec
from helix.core.plan import COORDINATOR, ArcFlow, Plan, Prediction
from helix.core.spec import ClusterSpec
from helix.core.slices import as_placement, as_slices
from planner.build import build_problem
from planner.flowgraph import max_flow
from planner.link_regions import planning_spec
from planner.deadline import Deadline
from planner.options import PlanOptions
from planner.prediction import NoFixedPoint, PipelineState, predict
from planner.problem import Link, NodeCapacity, PlacementProblem
from planner.search.baselines import HEURISTICS, swarm
from planner.search.kv_stages import chain_placements, region_partitions
from planner.solve import evaluate as evaluate_placement, exact_status, solve

log = logging.getLogger("helix.planner")

#: Candidate placements (module docstring) are scored on clusters up to this many nodes: each
#: costs a MILP solve (a share of the time limit), a max flow and a prediction (~0.1-3 s at 40
#: nodes); at 1,000 nodes one prediction alone takes seconds and the solve needs all the time.
CANDIDATE_MAX_NODES = 128

#: Fraction of the time limit kept for scoring candidates (the solves share the rest equally).
CANDIDATE_SHARE = 0.1


def predict_plan(spec: ClusterSpec, plan: Plan, cost: CostModel, *, latencies: bool = True,
                 strict: bool = False) -> tuple[Prediction, tuple[PipelineState, ...]]:
    """What users get from ``plan`` (:func:`planner.prediction.predict`, its arguments): the
    outer loop's one call of the prediction, so every figure it compares is made alike."""
    return predict(spec, plan, cost, latencies=latencies, strict=strict)


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
    placement = as_placement(found.placements)
    kind = {n.name: (n.gpu, n.region) for n in problem.nodes}
    region = {n.name: n.region for n in problem.nodes}
    phases = {"kind chains": lambda a, b: kind.get(a) == kind.get(b),
              "regions": lambda a, b: region.get(a) == region.get(b),
              "the rest": lambda a, b: True}
    out, seen = [found], set()
    # Each phase's links, filtered once (10^6 links at 1,000 nodes); a phase then overrides the
    # few that earlier phases' flows lowered (same keys, same order: the same max flows).
    phase_links = {name: problem.links if name == "the rest" else
                   {k: v for k, v in problem.links.items() if COORDINATOR in k or allowed(*k)}
                   for name, allowed in phases.items()}
    for sequence in (("kind chains", "regions", "the rest"), ("kind chains", "the rest"),
                     ("regions", "the rest")):
        nodes, lowered = problem.nodes, {}
        total: dict[tuple[str, str], float] = {}
        names: list[str] = []
        for name in sequence:
            base = phase_links[name]
            usable = {**base, **{k: v for k, v in lowered.items() if k in base}}
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
            for k, f in flow.arc_flows.items():   # only the arcs that carried flow lose capacity
                v = lowered.get(k, problem.links[k])
                lowered[k] = Link(max(0.0, v.capacity_tokens_per_s - f), v.latency_s)
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
    found, best = None, 0.0
    for routed in routings(problem, solved):   # throughput decides; latencies for the winner only
        tokens = predict_plan(spec, routed, cost, latencies=False)[0].prompt_decode_tokens_per_s
        if found is None or tokens > best * (1 + 1e-9):
            found, best = routed, tokens
    assert found is not None
    prediction, states = predict_plan(spec, found, cost)
    return dataclasses.replace(found, prediction=prediction), states


def evaluate(spec: ClusterSpec, placement, *, model: ModelSpec | None = None,
             problem: PlacementProblem | None = None, partial_inference: bool = True,
             source: str = "given") -> Plan:
    """``placement`` as it is (no search), as :func:`plan` would report it: its max flow, the
    routing users get the most from and what they get (the running placement when re-planning)."""
    problem = problem or build_problem(spec, model)
    spec = planning_spec(spec)[0]   # the regions the problem's nodes carry
    found, _ = best_routing(spec, problem, evaluate_placement(problem, placement, partial_inference,
                                                              source),
                            CostModel.for_cluster(spec, model))
    return found


def choose(spec: ClusterSpec, options: PlanOptions, *,
           problem: PlacementProblem | None = None, deadline: Deadline | None = None) -> Plan:
    """The placement of ``spec``'s model (or ``options.model``) with the highest predicted
    throughput (module docstring); the first step of :func:`planner.plan`. ``problem``:
    ``build_problem(spec, options.model)`` when already built. ``deadline``: when to be done
    (default: ``options.time_limit_s`` from now); each solve gets its share of what is left, and
    the candidates are scored until it passes, the best so far kept."""
    method, model = options.method, options.model
    deadline = deadline or Deadline.after(options.time_limit_s)
    problem = problem or build_problem(spec, model)
    spec = planning_spec(spec)[0]   # the regions the problem's nodes carry
    cost = CostModel.for_cluster(spec, model)
    # Explicit T(k) tables (reference inputs) are taken as given: one solve, as before.
    rounds = 1 if method in HEURISTICS or cost.throughput_tables else max(1, options.iterations)
    scored = method == "milp" and not cost.throughput_tables and \
        len(problem.nodes) <= CANDIDATE_MAX_NODES
    shares = _Shares(deadline, rounds + 1 if scored else rounds, CANDIDATE_SHARE if scored else 0.0)
    best, routing_s = _rounds(spec, problem, cost, options, rounds, shares)
    result = max_flow_result(best)
    if scored:
        best = _scored(spec, problem, cost, options, best, shares, routing_s)
        best = dataclasses.replace(best, solve_seconds=deadline.elapsed_s())
    return dataclasses.replace(best, extras={**best.extras, "max_flow_result": result,
                                             "choice": choice(best, result, scored)})


def max_flow_result(found: Plan) -> dict:
    """What the search proved about its own placement (``extras['max_flow_result']``): its max
    flow, the bound, the gap between them and the status they prove, the method that found it
    and its predicted prompt + decode tokens/s. A candidate chosen over it later (its max flow
    lower by design) leaves these as they are."""
    return {"max_flow_tokens_per_s": found.max_flow_tokens_per_s,
            "bound_tokens_per_s": found.upper_bound_tokens_per_s, "gap": found.gap,
            "status": found.extras.get("status", "heuristic"),
            "found_by": found.extras.get("found_by", found.method),
            "predicted_tokens_per_s": None if found.prediction is None else
            round(found.prediction.prompt_decode_tokens_per_s, 1)}


def choice(chosen: Plan, result: dict, scored: bool) -> dict:
    """Which placement the plan serves and why (``extras['choice']``): ``placement`` (``max
    flow``, or the candidate's name), its predicted prompt + decode tokens/s and the reason."""
    predicted = None if chosen.prediction is None else \
        round(chosen.prediction.prompt_decode_tokens_per_s, 1)
    name = chosen.extras.get("chosen_by", "").removeprefix("prediction: ")
    base = result["predicted_tokens_per_s"]
    scores = chosen.extras.get("candidates", [])
    unscored = chosen.extras.get("candidates_unscored", 0)
    late = f"; {unscored} more not scored before the time limit" if unscored else ""
    if name and base:
        why = (f"predicted {(predicted / base - 1) * 100:+.0f} % over the max-flow placement's "
               f"{base:,.1f} tokens/s, above the {CANDIDATE_MARGIN * 100:.0f} % margin{late}")
    elif name:
        why = f"predicted {predicted:,.1f} tokens/s where the max-flow placement serves none{late}"
    elif not scored:
        why = (f"candidates are scored for milp on clusters of up to {CANDIDATE_MAX_NODES} "
               "nodes only")
    elif scores:
        top = max(scores, key=lambda c: c[1])
        why = (f"no candidate predicted {CANDIDATE_MARGIN * 100:.0f} % more (best: {top[0]}, "
               f"{top[1]:,.1f} tokens/s){late}")
    else:
        why = f"no candidate scored{late}"
    return {"placement": name or "max flow", "predicted_tokens_per_s": predicted, "reason": why}


@dataclass(frozen=True)
class _Shares:
    """How :func:`choose` shares its deadline: ``solves`` solves of equal share, then
    ``scoring`` of the time limit for scoring candidates; a solve that starts late gets what is
    left less what the phases after it are due."""

    deadline: Deadline
    solves: int
    scoring: float

    @property
    def each_s(self) -> float:
        return self.deadline.limit_s * (1 - self.scoring) / self.solves

    def solve_s(self, after: int) -> float:
        """Seconds for a solve with ``after`` solves still to come."""
        due = (after * self.each_s + self.scoring * self.deadline.limit_s)
        return max(MIN_SOLVE_S, min(self.each_s, self.deadline.left_s() - due))


#: Fraction of the time left after the solves that finding KV stage chains may take; scoring
#: the candidates has the rest.
CHAIN_SHARE = 0.5

#: Seconds a solve gets at the least, when the phases before it used its share (it still
#: returns its best warm start).
MIN_SOLVE_S = 0.05


def _rounds(spec: ClusterSpec, problem: PlacementProblem, cost: CostModel, options: PlanOptions,
            rounds: int, shares: _Shares) -> tuple[Plan, float]:
    """The outer loop's solves (module docstring): the one predicted to serve the most, and the
    seconds the last one's routings took to predict."""
    best: Plan | None = None
    seen: set[tuple] = set()
    inner = problem
    history = []
    for i in range(rounds):
        limit_s = shares.solve_s(after=shares.solves - i - 1)
        shares.deadline.phase(f"search: max flow ({options.method}"
                              + (f", round {i + 1}" if i else "") + f"), up to {limit_s:.1f} s")
        solved = solve(inner, options.replace(time_limit_s=limit_s))
        solved = dataclasses.replace(solved, extras={
            **solved.extras, "capacities": "T(k)" if i == 0 else f"pipeline-aware (round {i + 1})"})
        shares.deadline.phase("prediction: the max-flow placement's routings")
        started_s = time.perf_counter()
        found, states = best_routing(spec, inner, solved, cost)
        routing_s = time.perf_counter() - started_s
        prediction = found.prediction
        history.append(round(prediction.prompt_decode_tokens_per_s, 1))
        if best is None or prediction.prompt_decode_tokens_per_s > \
                best.prediction.prompt_decode_tokens_per_s:  # type: ignore[union-attr]
            best = found
        key = found.placements
        if key in seen or i + 1 == rounds or shares.deadline.passed():
            break
        seen.add(key)
        nxt = pipeline_problem(problem, spec, cost, states)
        if nxt is None:
            break
        inner = nxt
    assert best is not None
    return dataclasses.replace(best, extras={**best.extras, "predicted_by_round": history}), \
        routing_s


def _scored(spec: ClusterSpec, problem: PlacementProblem, cost: CostModel, options: PlanOptions,
            best: Plan, shares: _Shares, routing_s: float) -> Plan:
    """``best`` or the candidate predicted to serve more (module docstring), scored until the
    deadline; ``routing_s``: what predicting ``best``'s routings took."""
    deadline = shares.deadline
    min_k = options.min_layers(problem.num_layers)
    candidates = [("swarm", swarm(problem))]
    reserved = reserved_problem(problem, spec, cost, cost.serving.max_batch_seqs)
    if reserved is not None and not deadline.passed():
        limit_s = shares.solve_s(after=0)
        deadline.phase(f"search: max flow with a KV reserve of {cost.serving.max_batch_seqs} "
                       f"requests, up to {limit_s:.1f} s")
        # A caller's start placement may not fit the caps, and its progress line shows one solve.
        try:
            solved = solve(reserved, options.replace(time_limit_s=limit_s, start=None,
                                                     progress=None))
            candidates.insert(0, (f"milp, KV reserve {cost.serving.max_batch_seqs} requests",
                                  as_placement(solved.placements)))
        except InfeasibleError:  # the cluster cannot hold the model with that reserve
            pass
    deadline.phase("candidates: KV stage chains")
    # Half of what is left for finding chains, the rest (at least) for scoring them all.
    candidates += kv_stage_candidates(spec, problem, cost, best, deadline.share(CHAIN_SHARE))
    candidates = [(n, p) for n, p in candidates
                  if p and all(e - s >= min_k for s, e in p.values())]
    routed = len({spec.region_of(n.name) for n in spec.nodes}) > 1 and \
        len(candidates) <= ROUTED_CANDIDATES
    deadline.phase(f"candidates: scoring {len(candidates)} placements by their prediction")
    return best_candidate(spec, problem, cost, best, candidates, gap=options.gap, routed=routed,
                          deadline=deadline, routing_s=routing_s)


def reserved_problem(problem: PlacementProblem, spec: ClusterSpec, cost: CostModel,
                     requests: float) -> PlacementProblem | None:
    """``problem`` with every node's layer counts capped so that it keeps KV room for
    ``requests`` mean-size requests on each layer it holds (``serving.min_kv_requests`` set to
    ``requests``; T(k) itself does not depend on it); None when that caps nothing."""
    if requests <= cost.serving.min_kv_requests:
        return None
    capped_cost = CostModel(cost.model, cost.dtype_bytes, cost.workload,
                            cost.serving.model_copy(update={"min_kv_requests": requests}),
                            cost.profiles, cost.throughput_tables)
    nodes, changed = [], False
    for n in problem.nodes:
        node = spec.node(n.name)
        caps = {"max_layers": capped_cost.max_layers(node),
                "max_layers_first": capped_cost.max_layers(node, first=True),
                "max_layers_last": capped_cost.max_layers(node, last=True),
                "max_layers_first_last": capped_cost.max_layers(node, first=True, last=True)}
        caps = {k: min(v, getattr(n, k)) for k, v in caps.items()}
        kmax = max(caps["max_layers"], caps["max_layers_first"], caps["max_layers_last"])
        table = n.throughput_tokens_per_s[:kmax]
        changed |= len(table) < len(n.throughput_tokens_per_s)
        nodes.append(dataclasses.replace(n, throughput_tokens_per_s=table, **caps,
                                         layer_latency_s_by_k=n.layer_latency_s_by_k[:kmax]))
    return dataclasses.replace(problem, nodes=tuple(nodes)) if changed else None


#: A KV stage chain across regions is a candidate only while the links where it crosses carry
#: at most this fraction of their capacity (its predicted prompt + decode tokens/s over the sum
#: of the crossing links'): a prompt's hidden states are megabytes on a 100 Mb/s link, decode
#: messages queue behind them (FIFO), and the prediction understates that wait when the links
#: are busy (geo24, 300 s offline at 512: EU -> US-East chain at ~0.5 of its 4 links predicted
#: 354 decode tokens/s, simulated 310; EU -> US-West at ~0.26 of 8 links 376 vs 384).
MAX_CROSSING_LOAD = 0.3


def _crossing_load(problem: PlacementProblem, spec: ClusterSpec, placement: dict,
                   tokens_per_s: float) -> float:
    """``tokens_per_s`` over the capacity of the links where ``placement``'s chain changes
    region (0 when it stays in one)."""
    capacity = sum(link.capacity_tokens_per_s for (u, v), link in problem.links.items()
                   if u in placement and v in placement and placement[v][0] == placement[u][1]
                   and spec.region_of(u) != spec.region_of(v))
    crosses = any(spec.region_of(u) != spec.region_of(v) for u in placement for v in placement)
    if not crosses:
        return 0.0
    return tokens_per_s / capacity if capacity > 0 else float("inf")


#: Chains over one ordered set of regions scored by the prediction at most: the ones whose KV
#: holds the most (``chain_placements(..., most_holding)``). geo24's three regions in one
#: chain give 1,504 chains per region order (each region's kinds both ways round, up to 14
#: stages), ~25 ms of prediction each; the best simulated ones hold the most (BENCHMARKS.md,
#: *Plan vs simulator*).
MAX_SCORED_CHAINS = 48


def kv_stage_candidates(spec: ClusterSpec, problem: PlacementProblem, cost: CostModel,
                        template: Plan, deadline: Deadline | None = None) -> list[tuple[str, dict]]:
    """KV stage chains (``planner.search.kv_stages``) as candidates. One region: every chain.
    Several: every way to cut the regions into chains (``region_partitions``), each chain the
    one over its regions (in its order) predicted to serve the most on its own; chains share no
    node, so a partition's prediction is about the sum of its chains'. ``template``: the plan
    whose settings the scored plans copy. ``deadline``: chains are predicted until it passes
    (the best so far kept)."""
    regions = sorted({spec.region_of(n.name) for n in spec.nodes})
    if len(regions) == 1:
        return chain_placements(spec, cost, problem.num_layers, tuple(regions),
                                deadline_s=None if deadline is None else deadline.end_s)
    best: dict[tuple[str, ...], tuple[str, dict] | None] = {}

    def best_chain(block: tuple[str, ...]) -> tuple[str, dict] | None:
        if block not in best:
            top, found = 0.0, None
            for name, placement in chain_placements(
                    spec, cost, problem.num_layers, block, most_holding=MAX_SCORED_CHAINS,
                    deadline_s=None if deadline is None else deadline.end_s):
                if deadline is not None and deadline.passed():
                    break
                flow = max_flow(problem, placement, template.partial_inference)
                if flow.value_tokens_per_s <= 0:
                    continue
                try:   # a chain whose prediction finds no fixed point is not a candidate
                    prediction = predict_plan(spec, _with_placement(template, placement, flow),
                                              cost, latencies=False, strict=True)[0]
                except NoFixedPoint:
                    log.debug("kv stages: %s dropped (its prediction finds no fixed point)", name)
                    continue
                value = prediction.prompt_decode_tokens_per_s
                if _crossing_load(problem, spec, placement, value) > MAX_CROSSING_LOAD:
                    continue
                if value > top:   # ties: the first
                    top, found = value, (name, placement)
            best[block] = found
        return best[block]

    out = []
    for partition in region_partitions(regions):
        chains = [best_chain(block) for block in partition]
        if all(c is not None for c in chains):
            out.append((" | ".join(c[0] for c in chains),   # type: ignore[index]
                        {n: r for c in chains for n, r in c[1].items()}))  # type: ignore[index]
    return out


#: A candidate replaces the solver's placement only when predicted to serve this much more: the
#: prediction errs by 10-20 % between placements of different shapes (BENCHMARKS.md, *Plan vs
#: simulator*), so near-ties stay with the max-flow placement.
CANDIDATE_MARGIN = 0.05


#: On a cluster of several regions, up to this many candidates are each scored with the routing
#: users get the most from (:func:`best_routing`, ~4 predictions each); otherwise with their max
#: flow's own routing. Where chains of several regions are placed side by side, their max flow
#: routes across them wherever layer boundaries meet (geo24: a chain over the EU and US-West
#: predicted 1,366 prompt + decode tokens/s with its max-flow routing, 1,761 kept within its
#: kinds and regions).
ROUTED_CANDIDATES = 16


def best_candidate(spec: ClusterSpec, problem: PlacementProblem, cost: CostModel, incumbent: Plan,
                   candidates: list[tuple[str, dict]], gap: float = 0.01,
                   routed: bool = False, deadline: Deadline | None = None,
                   routing_s: float = 0.0) -> Plan:
    """``incumbent``, or the candidate placement predicted to serve more than
    ``(1 + CANDIDATE_MARGIN)`` times its prompt + decode tokens/s (the first best, in the given
    order), with its best routing (:func:`best_routing`); the incumbent's bound (valid for every
    placement) and solver record stay, the status is recomputed for the candidate's max flow
    (``gap``: the target), and ``extras['max_flow_placement']`` keeps what was replaced.
    Candidates are scored with their best routing when ``routed`` (:data:`ROUTED_CANDIDATES`),
    otherwise with their max flow's own routing (one prediction each; only the winner's routings
    are all tried). ``deadline``: a candidate is scored only while the time left holds the
    longest scoring so far (at first ``routing_s``, what the incumbent's routings took, when
    ``routed``) and, unless ``routed``, the winner's routings after them (``routing_s``); those
    left are counted in ``extras['candidates_unscored']``. Without a deadline, or with time to
    spare, the choice is deterministic. ``extras['candidates']``: [name, predicted prompt +
    decode tokens/s] of each scored one."""
    partial = incumbent.partial_inference
    base = incumbent.prediction.prompt_decode_tokens_per_s if incumbent.prediction else 0.0
    scores: list[list] = []
    unscored = 0
    winner: tuple[str, dict] | None = None
    routed_winner: Plan | None = None   # its best routing, when scored with it
    top = base * (1 + CANDIDATE_MARGIN)
    longest_s, after_s = (routing_s, 0.0) if routed else (0.0, routing_s)
    for i, (name, placement) in enumerate(candidates):
        if deadline is not None and not deadline.allows(longest_s + after_s):
            unscored = len(candidates) - i
            break
        started_s = time.perf_counter()
        flow = max_flow(problem, placement, partial)
        if flow.value_tokens_per_s <= 0:
            continue
        found = None
        if routed:
            found, _ = best_routing(spec, problem,
                                    evaluate_placement(problem, placement, partial, name), cost)
            value = found.prediction.prompt_decode_tokens_per_s
        else:
            rough = _with_placement(incumbent, placement, flow)
            value = predict_plan(spec, rough, cost)[0].prompt_decode_tokens_per_s
        scores.append([name, round(value, 1)])
        if value > top:
            winner, routed_winner, top = (name, placement), found, value
        longest_s = max(longest_s, time.perf_counter() - started_s)
    extras = {**incumbent.extras, "candidates": scores}
    if unscored:
        extras["candidates_unscored"] = unscored
    if winner is None:
        return dataclasses.replace(incumbent, extras=extras)
    name, placement = winner
    found = routed_winner or best_routing(
        spec, problem, evaluate_placement(problem, placement, partial, name), cost)[0]
    if found.prediction.prompt_decode_tokens_per_s <= base * (1 + CANDIDATE_MARGIN):
        return dataclasses.replace(incumbent, extras=extras)
    bound = incumbent.upper_bound_tokens_per_s
    mine = {k: found.extras[k] for k in ("found_by", "depth_max", "depth_mean", "latency_mean_s",
                                         "latency_max_s", "unused_nodes", "routing",
                                         "routed_tokens_per_s") if k in found.extras}
    extras.update(mine, chosen_by=f"prediction: {name}",
                  max_flow_placement={"max_flow_tokens_per_s": incumbent.max_flow_tokens_per_s,
                                      "predicted_tokens_per_s": round(base, 1),
                                      "found_by": incumbent.extras.get("found_by"),
                                      "placement": {p.node: [p.start, p.end]
                                                    for p in incumbent.placements}})
    if bound is not None:
        extras["status"] = exact_status(found.max_flow_tokens_per_s, bound, gap)
    return dataclasses.replace(
        incumbent, placements=found.placements, arc_flows=found.arc_flows,
        max_flow_tokens_per_s=found.max_flow_tokens_per_s,
        upper_bound_tokens_per_s=None if bound is None else max(bound, found.max_flow_tokens_per_s),
        prediction=found.prediction, extras=extras)


def _with_placement(plan: Plan, placement: dict, flow) -> Plan:
    """``plan`` with another placement and its max flow (no verification: for scoring only)."""
    nodes = as_slices(placement, by_layers=True)
    arcs = tuple(ArcFlow(u, v, f) for (u, v), f in sorted(flow.arc_flows.items()) if f > 1e-9)
    return dataclasses.replace(plan, placements=nodes, arc_flows=arcs, prediction=None,
                               max_flow_tokens_per_s=flow.value_tokens_per_s)
