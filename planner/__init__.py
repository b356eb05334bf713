"""Layer placement: ``plan(spec, options) -> Plan``, the one verb.

:func:`plan` (:mod:`planner.planning`) is what everything that asks for a placement calls:
``helix plan``, ``helix simulate`` without ``--plan``, the re-plan trigger and the server. It
searches (max flow, proven bound), predicts what users get, keeps the placement predicted to
serve them the most, and adds the serving limits, the step budget and the flow capacities
``helix serve`` needs. :class:`PlanOptions` says how (validated once, when made); what the
search found and proved is :class:`SearchReport` (``SearchReport.of(plan)``).

Below the verb, for benchmarks and tests: ``solve(problem, options)`` is the search alone (max
flow, no prediction); ``METHODS`` lists what ``method`` accepts (``milp`` - the class MILP with
warm starts and a proven bound, the default; ``milp-paper`` - the paper's node-level MILP;
heuristics ``petals``, ``swarm``, ``separate``, ``uniform``); ``SOLVERS`` the MILP back ends.
``max_flow(problem, placement)`` evaluates any placement with the same flow graph the planner
uses.
"""

from planner.flowgraph import FlowResult, Placement, max_flow
from planner.milp.solvers import SOLVERS
from planner.options import METHODS, PlanOptions
from planner.planning import plan
from planner.problem import COORDINATOR, Link, NodeCapacity, PlacementProblem
from planner.report import SearchReport
from planner.solve import solve

__all__ = ["plan", "PlanOptions", "SearchReport", "solve", "METHODS", "SOLVERS", "max_flow",
           "FlowResult", "Placement", "PlacementProblem", "NodeCapacity", "Link", "COORDINATOR"]
