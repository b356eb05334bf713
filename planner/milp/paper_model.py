"""The paper's MILP (Helix, ASPLOS'25, section 4), node by node: the baseline formulation.

* Data: nodes i with table T_i(k) and memory limits (middle / first / last / both), links (u, v)
  with capacity c_uv, L layers, an optional proven bound U on the flow (tight big-M constants).
* Variables:
  - ``start[i]`` in {0..L-1} - first layer of node i;
  - ``hold[i,k]`` in {0,1} - node i holds k layers (one-hot; none chosen = node unused);
  - ``first[i]``, ``last[i]``, ``both[i]`` in {0,1} - i holds layer 0 / layer L-1 / both;
  - ``flow[i] >= 0`` - tokens/s through node i;
  - ``on[u,v]`` in {0,1} and ``flow[u,v] >= 0`` - arc u->v valid / its tokens/s.
* Constraints:
  - ``one_range[i]``: sum_k hold[i,k] <= 1;  ``fits[i]``: start[i] + sum_k k hold[i,k] <= L;
  - ``first_def[i]``/``last_def[i]``: first[i] <=> start[i] = 0, last[i] <=> end[i] = L (for used i);
  - ``memory[i]``: sum_k k hold[i,k] <= mid + (fst-mid) first + (lst-mid) last + (both-fst-lst+mid) both;
  - ``node_cap[i]``: flow[i] <= sum_k min(T_i(k), U) hold[i,k];
  - ``conserve_in[i]``/``conserve_out[i]``: arc flows in = flow[i] = arc flows out;
  - ``arc_cap[u,v]``: flow[u,v] <= min(c_uv, U, ...) on[u,v] (coordinator arcs use first/last);
  - ``valid[u,v]`` (big-M, M = L + 1): on => start_v <= end_u < end_v (partial inference) or
    on => start_v = end_u.
* Objective: maximize the flow out of the coordinator.
"""

from __future__ import annotations

from planner.search.bounds import layer_counts
from planner.flowgraph import Placement, arc_valid
from planner.milp.linear import LinearModel
from planner.problem import COORDINATOR, PlacementProblem
from planner.milp.solvers import SolveOptions, SolverAdapter


def build_paper_model(problem: PlacementProblem, partial: bool = True, min_layers: int = 1,
                      flow_bound: float | None = None):
    lp = LinearModel("helix-paper-milp")
    L = problem.num_layers
    U = float("inf") if flow_bound is None else flow_bound
    v: dict = {}
    for n in problem.nodes:
        _node_vars(lp, v, n, L, min_layers)
    for n in problem.nodes:
        _node_rows(lp, v, n, L, U)
    arcs = _arc_vars(lp, v, problem, U)
    _conservation_rows(lp, v, problem, arcs)
    _validity_rows(lp, v, problem, arcs, partial, L)
    return lp, v


def _node_vars(lp, v, n, L, min_layers):
    """start[i], hold[i,k], first[i], last[i], both[i], flow[i]."""
    i = n.name
    v["start", i] = lp.var(f"start[{i}]", ub=L - 1, integer=True)
    v["ks", i] = [k for k in layer_counts(n, L) if k >= min_layers]
    for k in v["ks", i]:
        v["hold", i, k] = lp.var(f"hold[{i},k={k}]", ub=1, integer=True)
    for name in ("first", "last", "both"):
        v[name, i] = lp.var(f"{name}[{i}]", ub=1, integer=True)
    v["flow", i] = lp.var(f"flow[{i}]")


def _node_rows(lp, v, n, L, U):
    i, ks = n.name, v["ks", n.name]
    hold = [(v["hold", i, k], 1.0) for k in ks]
    size = [(v["hold", i, k], float(k)) for k in ks]
    st, fi, la, bo = v["start", i], v["first", i], v["last", i], v["both", i]
    lp.row(f"one_range[{i}]", hold, hi=1.0)
    lp.row(f"fits[{i}]", [(st, 1.0)] + size, hi=L)
    # first <=> start = 0 (when used): start <= (L-1)(1-first), start >= used - first.
    lp.row(f"first_def[{i},a]", [(st, 1.0), (fi, L - 1.0)], hi=L - 1.0)
    lp.row(f"first_def[{i},b]", [(st, 1.0), (fi, 1.0)] + [(h, -1.0) for h, _ in hold], lo=0.0)
    lp.row(f"first_def[{i},c]", [(fi, 1.0)] + [(h, -1.0) for h, _ in hold], hi=0.0)
    # last <=> end = L (when used): end >= L last, end <= L - 1 + last + L (1 - used).
    lp.row(f"last_def[{i},a]", [(st, 1.0), (la, -float(L))] + size, lo=0.0)
    lp.row(f"last_def[{i},b]", [(st, 1.0), (la, -1.0)] + [(h, k + float(L)) for h, k in size],
           hi=2.0 * L - 1)
    lp.row(f"last_def[{i},c]", [(la, 1.0)] + [(h, -1.0) for h, _ in hold], hi=0.0)
    lp.row(f"both_def[{i}]", [(bo, 1.0), (fi, -1.0), (la, -1.0)], lo=-1.0)
    lp.row(f"both_le_first[{i}]", [(bo, 1.0), (fi, -1.0)], hi=0.0)
    lp.row(f"both_le_last[{i}]", [(bo, 1.0), (la, -1.0)], hi=0.0)
    mid, fst, lst = n.max_layers, n.max_layers_first, n.max_layers_last
    both = n.max_layers_first_last
    lp.row(f"memory[{i}]", size + [(fi, -(fst - mid)), (la, -(lst - mid)),
                                   (bo, -(both - fst - lst + mid))], hi=float(mid))
    lp.row(f"node_cap[{i}]", [(v["flow", i], 1.0)] +
           [(v["hold", i, k], -min(n.throughput(k), U)) for k in ks], hi=0.0)


def _arc_vars(lp, v, problem, U):
    """on[u,v], flow[u,v] for every link (coordinator arcs are switched by first/last)."""
    tmax = {n.name: max((n.throughput(k) for k in v["ks", n.name]), default=0.0) for n in problem.nodes}
    tmax[COORDINATOR] = float("inf")
    arcs = []
    for (a, b), link in sorted(problem.links.items()):
        if a == b or (a not in tmax) or (b not in tmax) or link.capacity_tokens_per_s <= 0:
            continue
        cap = min(link.capacity_tokens_per_s, U, tmax[a], tmax[b])
        f = lp.var(f"flow[{a},{b}]", ub=cap)
        if a == COORDINATOR:
            on = v["first", b]
        elif b == COORDINATOR:
            on = v["last", a]
        else:
            on = v["on", a, b] = lp.var(f"on[{a},{b}]", ub=1, integer=True)
        lp.row(f"arc_cap[{a},{b}]", [(f, 1.0), (on, -cap)], hi=0.0)
        arcs.append((a, b, f, on))
    v["F"] = lp.var("F", obj=1.0, ub=U)
    lp.row("source", [(f, 1.0) for a, b, f, _ in arcs if a == COORDINATOR] + [(v["F"], -1.0)],
           lo=0.0, hi=0.0)
    return arcs


def _conservation_rows(lp, v, problem, arcs):
    for n in problem.nodes:
        i = n.name
        lp.row(f"conserve_in[{i}]", [(f, 1.0) for a, b, f, _ in arcs if b == i] +
               [(v["flow", i], -1.0)], lo=0.0, hi=0.0)
        lp.row(f"conserve_out[{i}]", [(f, 1.0) for a, b, f, _ in arcs if a == i] +
               [(v["flow", i], -1.0)], lo=0.0, hi=0.0)


def _end_terms(v, i, sign=1.0):
    return [(v["start", i], sign)] + [(v["hold", i, k], sign * k) for k in v["ks", i]]


def _validity_rows(lp, v, problem, arcs, partial, L):
    M = L + 1.0
    for a, b, _, on in arcs:
        if COORDINATOR in (a, b):
            continue
        # start_b - end_a <= M (1 - on)
        lp.row(f"valid[{a},{b},start]", [(v["start", b], 1.0)] + _end_terms(v, a, -1.0) +
               [(on, M)], hi=M)
        if partial:  # end_a - end_b <= -1 + M (1 - on)
            lp.row(f"valid[{a},{b},end]", _end_terms(v, a) + _end_terms(v, b, -1.0) + [(on, M)],
                   hi=M - 1.0)
        else:  # end_a - start_b <= M (1 - on)
            lp.row(f"valid[{a},{b},meet]", _end_terms(v, a) + [(v["start", b], -1.0), (on, M)], hi=M)


def integer_values(problem: PlacementProblem, lp, v, placement: Placement,
                   partial: bool = True) -> dict[int, float]:
    """Variable index -> value of every integer variable for ``placement`` (for warm starts);
    {} when the placement uses a layer count the model does not offer."""
    L = problem.num_layers
    out: dict[int, float] = {}
    for n in problem.nodes:
        i = n.name
        s, e = placement.get(i, (0, 0))
        used = i in placement
        if used and e - s not in v["ks", i]:
            return {}
        out[v["start", i]] = float(s)
        for k in v["ks", i]:
            out[v["hold", i, k]] = 1.0 if used and e - s == k else 0.0
        out[v["first", i]] = 1.0 if used and s == 0 else 0.0
        out[v["last", i]] = 1.0 if used and e == L else 0.0
        out[v["both", i]] = 1.0 if used and s == 0 and e == L else 0.0
    for (a, b), link in problem.links.items():
        if ("on", a, b) in v:
            ok = a in placement and b in placement and placement[a][1] < L and \
                arc_valid(placement[a][1], *placement[b], partial)
            out[v["on", a, b]] = 1.0 if ok else 0.0
    return out


def extract(problem: PlacementProblem, v, values) -> Placement:
    out = {}
    for n in problem.nodes:
        i = n.name
        k = next((k for k in v["ks", i] if values[v["hold", i, k]] > 0.5), None)
        if k is not None:
            s = int(round(values[v["start", i]]))
            out[i] = (s, s + k)
    return out


def run(problem: PlacementProblem, adapter: SolverAdapter, options: SolveOptions, partial: bool,
        min_layers: int):
    """Solve the paper MILP as the reference did (no warm start, no bound cap).

    Returns (placement or None, proven bound or None, status, name of the solver that ran)."""
    lp, v = build_paper_model(problem, partial, min_layers)
    res = adapter.solve(lp, options)
    if res.values is None:
        return None, res.bound, res.status, res.solver
    bad = lp.violations(res.values, tol=1e-5)
    if bad:
        raise AssertionError(f"solver returned a solution violating {bad[:3]}")
    return extract(problem, v, res.values), res.bound, res.status, res.solver
