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
"""

from __future__ import annotations

from helix.core.plan import Plan
from helix.core.spec import ClusterSpec
from planner import budget, predicted
from planner.build import build_problem, with_serving
from planner.flowgraph import with_flow_capacities
from planner.options import PlanOptions
from planner.problem import PlacementProblem


def plan(spec: ClusterSpec, options: PlanOptions | None = None, *,
         problem: PlacementProblem | None = None) -> Plan:
    """The placement of ``spec``'s model (or ``options.model``) predicted to serve users the
    most, ready to serve (module docstring). ``problem``: ``build_problem(spec, options.model)``
    when the caller has built it already."""
    options = options or PlanOptions()
    problem = problem or build_problem(spec, options.model)
    chosen = predicted.choose(spec, options, problem=problem)
    ready = with_serving(chosen, spec, options.model)
    ready = budget.apply(spec, ready, options.model)   # serving.chunk_tokens: auto
    return with_flow_capacities(ready, problem)
