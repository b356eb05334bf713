"""Hand-built plans for scheduler tests (the planner is not needed to exercise scheduling)."""

from __future__ import annotations

from helix.core.plan import COORDINATOR, ArcFlow, Plan
from helix.core.slices import as_slices


def make_plan(num_layers: int, ranges: dict[str, tuple[int, int]],
              flows: dict[tuple[str, str], float], partial_inference: bool = True) -> Plan:
    """A Plan with the given node ranges and arc flows; max flow = total flow out of the source."""
    placements = as_slices(ranges)
    arcs = tuple(ArcFlow(a, b, f) for (a, b), f in flows.items())
    total = sum(f for (a, _), f in flows.items() if a == COORDINATOR)
    return Plan(model="test", num_layers=num_layers, placements=placements, arc_flows=arcs,
                max_flow_tokens_per_s=total, method="hand", partial_inference=partial_inference)


def diamond_plan() -> Plan:
    """coordinator -> {a: [0,4), b: [0,6)} -> {c: [4,8), d: [6,8)} -> coordinator.

    b overlaps c (layers 4-5), so b -> c runs c on [6, 8) only. Flows: a 300, b 100 (b -> c 40,
    b -> d 60), a -> c 300.
    """
    ranges = {"a": (0, 4), "b": (0, 6), "c": (4, 8), "d": (6, 8)}
    flows = {(COORDINATOR, "a"): 300.0, (COORDINATOR, "b"): 100.0,
             ("a", "c"): 300.0, ("b", "c"): 40.0, ("b", "d"): 60.0,
             ("c", COORDINATOR): 340.0, ("d", COORDINATOR): 60.0}
    return make_plan(8, ranges, flows)


def two_node_plan() -> Plan:
    return make_plan(4, {"A": (0, 2), "B": (2, 4)},
                      {(COORDINATOR, "A"): 1.0, ("A", "B"): 1.0, ("B", COORDINATOR): 1.0})


def small_diamond_plan() -> Plan:
    """coordinator -> {A: [0,2), C: [0,3)} -> B: [2,4) -> coordinator; C -> B enters B mid-slice."""
    return make_plan(4, {"A": (0, 2), "C": (0, 3), "B": (2, 4)},
                      {(COORDINATOR, "A"): 2.0, (COORDINATOR, "C"): 1.0, ("A", "B"): 2.0,
                       ("C", "B"): 1.0, ("B", COORDINATOR): 3.0})
