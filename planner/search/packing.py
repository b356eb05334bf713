"""Packing bound: every layer needs a whole set of node slots worth F, and slots come k per node.

The cover argument (``planner.milp.cover_model``): in a placement that serves F tokens/s, scale
its flow down to exactly F; then for every layer l, ``sum_{i holds l} min(cap_i, F) >= F`` (each
token runs l once, on a node holding it, and node i carries at most ``cap_i = min(T_i(k_i), in_i,
out_i)``). Drop the order of the layers: a node holding k layers is k *slots* of size
``s = min(cap_i, F) / F``, and the L layers are L bins each to be filled to >= 1 by slots. This is
bin covering, a relaxation of the cover MILP (contiguity, "one slot per layer per node" and the
coordinator's end links are dropped; a group's links are its members' largest), so a target F no
slot assignment fills is a proven upper bound on every placement's max flow.

Where slots are coarse against F (several nodes must run side by side on every layer) the bins
waste what the fixed point (``planner.search.bounds``, which lets a node's capacity split over
layers at will) does not see: the reference's 42-node case 6,528.9 -> 6,150, geo24 with 30B
21,437.5 -> 21,002. Where small slots fill the gaps (geo24 70B, hetero42) it meets the fixed point.

The arc-flow form (Valerio de Carvalho) keeps it small: sizes are rounded *up* to multiples of
1/D (a relaxation again), vertices 0..D are filled levels, a layer is a path 0 -> D whose arcs
are slots (d -> min(D, d + units)); walking the nodes holding l in any order until the level
reaches D gives such a path for every placement.

* Variables: ``f[j,d] >= 0`` - layers whose path takes slot kind j = (group, k) at level d;
  ``n[j] in [0, n_g]`` - members of the group holding k layers.
* Constraints: ``src``: sum_j f[j,0] >= L; ``keep[d]``: in(d) = out(d) for 0 < d < D;
  ``sink``: in(D) >= L; ``slots[j]``: sum_d f[j,d] <= k n[j]; ``count[g]``: sum_k n[g,k] <= n_g.
* Objective: none (feasibility). Its LP relaxation is what is solved: an infeasible LP refutes
  the integer model too, and it takes a fraction of a second where the integer one may not.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

from planner.milp.cover_model import _groups, _link_caps
from planner.milp.linear import LinearModel
from planner.milp.solvers import SolveOptions, SolverAdapter
from planner.problem import PlacementProblem
from planner.search.bounds import layer_counts

#: Levels of the arc-flow graph (sizes rounded up to multiples of 1 / LEVELS).
LEVELS = 100


def slot_kinds(problem: PlacementProblem, target: float, min_layers: int = 1):
    """(group index, k, size in units of ``target``, members) for every layer count k."""
    out = []
    for gi, names in enumerate(_groups(problem)):
        proto = problem.node(names[0])
        into, outgoing, _, _ = _link_caps(problem, names)
        for k in layer_counts(proto, problem.num_layers):
            cap = min(proto.throughput(k), into, outgoing, target)
            if k >= min_layers and cap > 0:
                out.append((gi, k, cap / target, len(names)))
    return out


def build_packing_model(problem: PlacementProblem, target: float, min_layers: int = 1,
                        levels: int = LEVELS) -> LinearModel:
    """The arc-flow LP for target F = ``target`` (see the module docstring)."""
    L = problem.num_layers
    lp = LinearModel("helix-packing")
    into, out = defaultdict(list), defaultdict(list)
    kinds = slot_kinds(problem, target, min_layers)
    by_group = defaultdict(list)
    for j, (gi, k, size, members) in enumerate(kinds):
        units = levels if size >= 1.0 else min(levels, math.ceil(size * levels - 1e-9))
        used = []
        for d in range(levels):
            v = lp.var(f"f[{j},{d}]", ub=L)
            out[d].append(v)
            into[min(levels, d + units)].append(v)
            used.append(v)
        n = lp.var(f"n[{j}]", ub=members)
        by_group[gi, members].append(n)
        lp.row(f"slots[{j}]", [(v, 1.0) for v in used] + [(n, -float(k))], hi=0.0)
    for (gi, members), ns in by_group.items():
        lp.row(f"count[{gi}]", [(n, 1.0) for n in ns], hi=float(members))
    lp.row("src", [(v, 1.0) for v in out[0]], lo=float(L))
    for d in range(1, levels):
        lp.row(f"keep[{d}]", [(v, 1.0) for v in into[d]] + [(v, -1.0) for v in out[d]],
               lo=0.0, hi=0.0)
    lp.row("sink", [(v, 1.0) for v in into[levels]], lo=float(L))
    return lp


def verdict(problem: PlacementProblem, adapter: SolverAdapter, target: float, seconds: float,
            min_layers: int = 1) -> str:
    """``refuted`` where the packing LP proves that no placement serves ``target`` tokens/s,
    ``open`` where the LP is feasible, else the solver's status (out of time)."""
    res = adapter.solve(build_packing_model(problem, target, min_layers),
                        SolveOptions(time_limit_s=max(0.05, seconds), threads=1, seed=0))
    # Every variable is bounded and the objective is zero: "unbounded or infeasible" is infeasible.
    return {"infeasible": "refuted", "infeasible_or_unbounded": "refuted",
            "primal_infeasible_or_unbounded": "refuted", "optimal": "open"}.get(res.status, res.status)


def packing_bound(problem: PlacementProblem, adapter: SolverAdapter, lo: float, hi: float,
                  deadline_s: float, min_layers: int = 1, steps: int = 8) -> float | None:
    """Bisect between ``lo`` (a flow some placement reaches) and ``hi`` (a proven bound) until
    ``time.perf_counter() >= deadline_s``; the least refuted target, or None."""
    best = None
    for _ in range(steps):
        left = deadline_s - time.perf_counter()
        if left <= 0.05 or hi <= lo * (1 + 1e-4):
            break
        mid = (lo + hi) / 2
        said = verdict(problem, adapter, mid, left, min_layers)
        if said == "refuted":
            hi = best = mid
        elif said == "open":
            lo = mid
        else:
            break
    return best
