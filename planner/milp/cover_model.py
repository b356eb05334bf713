"""The cover MILP: a placement that serves F tokens/s gives every layer nodes worth F.

Every token runs every layer once, on one node holding it, and node i runs at most
``cap_i = min(T_i(k_i), in_i, out_i)`` tokens/s in all (in/out: its link totals; the coordinator's
link alone where its range ends at the last layer, as every token it runs leaves there). Layer 0
runs only tokens from the coordinator, so there the coordinator link caps it too (not on later
layers: with partial inference a range starting at 0 also takes tokens mid-range). So for every
layer l:

    sum_{i holds l} min(cap_i, F) >= F            (a cut through layer l)

Asking for a placement that covers every layer with X is thus a relaxation of asking for one whose
max flow reaches X: when *no* placement covers X, X is a proven upper bound on the max flow of
every placement (links between nodes and flow conservation can only lower it). At a fixed X this is
a small feasibility MILP that HiGHS often refutes in a fraction of a second where the class MILP's
dual bound stalls (its LP relaxation, like this one's with F free, sits at the fixed point); the
LLaMA-1 30B 10-node reference case is refuted 1 % above its optimum in 0.2 s.

* Data: groups g of nodes with the same table and memory limits (``n_g`` members; the links are
  the largest of the members', so the model stays a relaxation), layers l = 0..L-1, target X.
* Variables: ``hold[g,s,e]`` in {0..n_g} - members of g holding [s, e).
* Constraints: ``count[g]``: sum_{s,e} hold[g,s,e] <= n_g;
  ``cover[l]``: sum_{s <= l < e} min(cap_g(s, e), X) hold[g,s,e] >= X.
* Objective: none (feasibility).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from planner.flowgraph import Placement
from planner.milp.class_model import allowed_ranges
from planner.milp.linear import LinearModel
from planner.problem import COORDINATOR, PlacementProblem


@dataclass
class CoverModel:
    lp: LinearModel
    groups: list[tuple[str, ...]]
    """Member names of every group, in name order."""
    hold: dict[tuple[int, int, int], int]
    """(group index, s, e) -> variable index."""
    refuted: bool = False
    """Some layer has no range that could cover it: no placement reaches the target."""


def _groups(problem: PlacementProblem) -> list[tuple[str, ...]]:
    by_key: dict[tuple, list[str]] = defaultdict(list)
    for n in problem.nodes:
        by_key[(n.throughput_tokens_per_s, n.max_layers, n.max_layers_first, n.max_layers_last,
                n.max_layers_first_last)].append(n.name)
    return sorted(tuple(sorted(v)) for v in by_key.values())


def _link_caps(problem: PlacementProblem, names) -> tuple[float, float, float, float]:
    """Largest (total in, total out, coordinator in, coordinator out) capacity among ``names``."""
    tot_in, tot_out = defaultdict(float), defaultdict(float)
    for (a, b), link in problem.links.items():
        if a != b:
            tot_in[b] += link.capacity_tokens_per_s
            tot_out[a] += link.capacity_tokens_per_s

    def coord(a, b):
        link = problem.link(a, b)
        return 0.0 if link is None else link.capacity_tokens_per_s

    return (max(tot_in[m] for m in names), max(tot_out[m] for m in names),
            max(coord(COORDINATOR, m) for m in names), max(coord(m, COORDINATOR) for m in names))


def build_cover_model(problem: PlacementProblem, target: float, min_layers: int = 1) -> CoverModel:
    """Data -> variables -> constraints for target X = ``target`` (see the module docstring)."""
    lp = LinearModel("helix-cover-milp")
    L = problem.num_layers
    groups = _groups(problem)
    hold: dict[tuple[int, int, int], int] = {}
    cover: dict[int, list] = defaultdict(list)
    for gi, names in enumerate(groups):
        proto = problem.node(names[0])
        into, out, c_in, c_out = _link_caps(problem, names)
        for s, e in allowed_ranges(proto, L, min_layers):
            cap = min(proto.throughput(e - s), into, out, target)
            if e == L:  # every token it runs leaves for the coordinator
                cap = min(cap, c_out)
            if cap <= 0:
                continue
            v = hold[gi, s, e] = lp.var(f"hold[{gi},{s},{e}]", ub=len(names), integer=True)
            for layer in range(s, e):
                # Layer 0 runs only tokens from the coordinator; later layers of a range that
                # starts at 0 may also run tokens that entered mid-range (partial inference).
                here = min(cap, c_in) if layer == 0 else cap
                if here > 0:
                    cover[layer].append((v, here / target))  # scaled: every row reads ">= 1"
        lp.row(f"count[{gi}]", [(v, 1.0) for (g, _, _), v in hold.items() if g == gi],
               hi=len(names))
    for layer in range(L):
        if not cover[layer]:
            return CoverModel(lp, groups, {}, refuted=True)
        lp.row(f"cover[{layer}]", cover[layer], lo=1.0)
    return CoverModel(lp, groups, hold)


def extract(model: CoverModel, values) -> Placement:
    """Assign each group's members (in name order) to the ranges the solution holds."""
    placement: dict[str, tuple[int, int]] = {}
    free = {gi: list(names) for gi, names in enumerate(model.groups)}
    for (gi, s, e), v in sorted(model.hold.items()):
        for _ in range(int(round(values[v]))):
            placement[free[gi].pop(0)] = (s, e)
    return placement
