"""``plan(spec, options) -> Plan``: the planner's one verb.

Whatever asks for a placement asks here: ``helix plan``, ``helix simulate`` without ``--plan``
(:func:`helix.sim.run.make_plan`), the re-plan trigger (:mod:`planner.trigger`) and with it the
server's joins, departures and drift. One plan is, in order:

1. the search and the outer loop (:func:`planner.predicted.choose`): max flow
   (:func:`planner.solve.solve`), the prediction of what users get
   (:mod:`planner.prediction`), and the candidate placements it may prefer;
2. the serving limits ``helix serve`` runs every worker with (:func:`planner.build.with_serving`);
3. the step budget, where the spec says ``chunk_tokens: auto`` (:func:`planner.budget.apply`);
4. the flow graph's capacities, which ``helix serve`` re-solves the flow with when nodes die
   (:func:`planner.flowgraph.with_flow_capacities`).

Steps 2-4 are :func:`ready`, which also readies a placement that was evaluated rather than searched
(the running one, when a re-plan weighs a proposal against it), so both are judged alike.

``options.time_limit_s`` bounds all of it (a :class:`~planner.deadline.Deadline`): step 1 gets
all but :data:`READY_SHARE` of it, and the step budget's predictions stop when it has passed.
"""

from __future__ import annotations

import dataclasses

from helix.core.models import ModelSpec
from helix.core.plan import Plan
from helix.core.spec import ClusterSpec
from planner import budget, predicted
from planner.build import build_problem, with_serving
from planner.deadline import Deadline
from planner.flowgraph import with_flow_capacities
from planner.link_regions import planning_spec
from planner.options import PlanOptions
from planner.problem import PlacementProblem


def plan(spec: ClusterSpec, options: PlanOptions | None = None, *,
         problem: PlacementProblem | None = None, deadline: Deadline | None = None) -> Plan:
    """The placement of ``spec``'s model (or ``options.model``) predicted to serve users the
    most, ready to serve (module docstring). ``problem``: ``build_problem(spec, options.model)``
    when the caller has built it already. ``deadline``: when to be done (default:
    ``options.time_limit_s`` from now; ``helix plan`` starts it before reading the spec)."""
    options = options or PlanOptions()
    deadline = deadline or Deadline.after(options.time_limit_s)
    problem = problem or build_problem(spec, options.model)
    spec, inferred = planning_spec(spec)   # regions from the links where the declared ones differ
    chosen = predicted.choose(spec, options, problem=problem,
                              deadline=deadline.sooner(READY_SHARE * deadline.limit_s))
    placed = ready(spec, chosen, problem, options.model, deadline)
    if inferred is not None:
        placed = dataclasses.replace(placed, extras={**placed.extras, "regions": inferred.to_extras()})
    return placed


def ready(spec: ClusterSpec, placed: Plan, problem: PlacementProblem,
          model: ModelSpec | None = None, deadline: Deadline | None = None) -> Plan:
    """``placed`` ready to serve: its serving limits, its step budget (chosen by the prediction
    where the spec says ``chunk_tokens: auto``, the prediction then at that budget; the budgets
    are predicted until ``deadline``) and its flow graph's capacities."""
    if deadline is not None:
        deadline.phase("serving: limits, step budget, flow capacities")
    served = budget.apply(spec, with_serving(placed, spec, model), model, deadline)
    return with_flow_capacities(served, problem)


#: Fraction of the time limit kept for :func:`ready` and for printing the plan.
READY_SHARE = 0.05
