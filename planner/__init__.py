"""Layer placement by max flow: ``solve(problem, method=...) -> Plan``.

``METHODS`` lists what ``method`` accepts (``milp`` - the class MILP with warm starts and a proven
bound, the default; ``milp-paper`` - the paper's node-level MILP; heuristics ``petals``, ``swarm``,
``separate``, ``uniform``); ``SOLVERS`` the MILP back ends. ``max_flow(problem, placement)``
evaluates any placement with the same flow graph the planner uses.
"""

from planner.flowgraph import FlowResult, Placement, max_flow
from planner.problem import COORDINATOR, Link, NodeCapacity, PlacementProblem
from planner.options import METHODS
from planner.solve import solve
from planner.milp.solvers import SOLVERS

__all__ = ["solve", "METHODS", "SOLVERS", "max_flow", "FlowResult", "Placement", "PlacementProblem",
           "NodeCapacity", "Link", "COORDINATOR"]
