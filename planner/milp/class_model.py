"""The class MILP: plan how many nodes of each class hold each layer range, as a flow on layers.

Why a new formulation. The paper's MILP (``planner.milp.paper_model``) gives every node a start layer, a
one-hot layer count and big-M switches on every arc; its LP relaxation is so weak that the reference
planner stopped at gaps of 2,000-7,000 %. Here the layer axis itself is the network:

* Data: classes ``c`` of interchangeable nodes (``planner.milp.classes``) with ``n_c`` members and table
  ``T_c(k)``; boundaries ``b = 0..L`` (a token at ``b`` has run layers ``[0, b)``); regions ``r``.
* Variables:
  - ``F`` - tokens/s served (the objective);
  - ``hold[c,s,e]`` in {0..n_c} - how many class-c nodes hold ``[s, e)`` (only ranges whose size fits
    the node's memory for that position: embedding on ``s = 0``, LM head on ``e = L``);
  - ``enter[c,e,b] >= 0`` - tokens/s that enter class-c nodes holding a range ending at ``e`` at
    boundary ``b`` (they run ``[b, e)``; ``b > s`` only with partial inference);
  - ``move[r>q,b] >= 0`` - tokens/s at boundary ``b`` that cross from region r to region q.
* Constraints:
  - ``count[c]``: sum of hold over ranges <= n_c;
  - ``cap[c,e,t]`` (node capacity; Hall's condition, exact because ranges ending at e are nested):
    tokens entering at b <= t can only be served by nodes starting at s <= t, so
    sum_{b<=t} enter[c,e,b] <= sum_{s<=t} T_c(e-s) hold[c,s,e];
  - ``source``/``sink``: F tokens/s enter at b = 0 and leave at b = L;
  - ``pool[r,b]``: tokens produced at b in region r, plus those moved in, equal those consumed at b in
    r plus those moved out (flow conservation on the layer axis);
  - ``coord_in[c]``, ``coord_out[c]``, ``send[r>q,b]``, ``recv[r>q,b]``: network capacity, counted per
    node that can carry the flow (the largest member link totals of the class, so a valid relaxation).
* Objective: maximize F.

Links inside a region are not modelled (they are fast in every cluster we know). The model is thus a
*relaxation* of the real problem: its dual bound is a proven upper bound on any placement's max flow;
its placements are evaluated exactly by ``planner.flowgraph.max_flow``, and where links bind the gap
shows it. With one region and non-binding links the model is exact.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from planner.milp.classes import NodeClass, node_classes
from planner.flowgraph import Placement
from planner.milp.linear import LinearModel
from planner.problem import PlacementProblem


@dataclass
class ClassModel:
    """The built model plus the index maps its extract and warm-start steps need."""

    lp: LinearModel
    classes: list[NodeClass]
    hold: dict[tuple[int, int, int], int]
    """(class index, s, e) -> variable index."""
    flow: int


def allowed_ranges(node, num_layers: int, min_layers: int = 1) -> list[tuple[int, int]]:
    """Every ``[s, e)`` a node can hold: memory limit by position, table length, T(k) > 0."""
    out = []
    for k in range(max(1, min_layers), len(node.throughput_tokens_per_s) + 1):
        if node.throughput(k) <= 0:
            continue
        for s in range(0, num_layers - k + 1):
            e = s + k
            if k <= node.max_layers_for(s == 0, e == num_layers):
                out.append((s, e))
    return out


def build_class_model(problem: PlacementProblem, partial_inference: bool = True,
                      min_layers: int = 1, flow_bound: float | None = None) -> ClassModel:
    """Data -> variables -> constraints -> objective (see the module docstring for the symbols).

    ``flow_bound``: a proven upper bound U on F (``planner.search.bounds``). No node carries more than F
    tokens/s, so every T_c(k) is capped at U; this keeps the model exact and makes its LP relaxation
    as tight as the fixed-point bound instead of the reference's sum of k T(k) / L.
    """
    lp = LinearModel("helix-class-milp")
    classes = node_classes(problem)
    L = problem.num_layers
    F = lp.var("F", obj=1.0)
    hold = _hold_vars(lp, classes, L, min_layers)
    enter = _enter_vars(lp, classes, hold, partial_inference)
    _count_rows(lp, classes, hold)
    _capacity_rows(lp, classes, hold, enter, partial_inference, flow_bound)
    _end_rows(lp, classes, enter, F, L)
    moves = _move_vars(lp, classes, L)
    _pool_rows(lp, classes, enter, moves, L)
    U = float("inf") if flow_bound is None else flow_bound
    _coordinator_rows(lp, classes, hold, enter, L, U)
    _region_rows(lp, classes, hold, moves, partial_inference, U)
    return ClassModel(lp, classes, hold, F)


def _hold_vars(lp, classes, L, min_layers):
    """hold[c,s,e] in {0..n_c}: class-c nodes holding layers [s, e)."""
    hold = {}
    for ci, c in enumerate(classes):
        for s, e in allowed_ranges(c.proto, L, min_layers):
            hold[ci, s, e] = lp.var(f"hold[{c.key},{s},{e}]", ub=c.count, integer=True)
    return hold


def _enter_vars(lp, classes, hold, partial):
    """enter[c,e,b] >= 0: tokens/s entering class-c nodes that end at e, at boundary b."""
    enter = {}
    for (ci, s, e) in sorted(hold):
        bs = range(s, e) if partial else (s,)
        for b in bs:
            if (ci, e, b) not in enter:
                enter[ci, e, b] = lp.var(f"enter[{classes[ci].key},{e},{b}]")
    return enter


def _count_rows(lp, classes, hold):
    """count[c]: sum_{s,e} hold[c,s,e] <= n_c."""
    by_class = defaultdict(list)
    for (ci, _, _), v in hold.items():
        by_class[ci].append((v, 1.0))
    for ci, terms in by_class.items():
        lp.row(f"count[{classes[ci].key}]", terms, hi=classes[ci].count)


def _capacity_rows(lp, classes, hold, enter, partial, flow_bound):
    """cap[c,e,t]: sum_{b<=t} enter[c,e,b] <= sum_{s<=t} min(T_c(e-s), U) hold[c,s,e]."""
    U = float("inf") if flow_bound is None else flow_bound
    starts = defaultdict(list)
    for (ci, s, e) in hold:
        starts[ci, e].append(s)
    for (ci, e), ss in starts.items():
        c = classes[ci]
        ss.sort()
        ts = range(ss[0], e) if partial else ss
        for t in ts:
            lhs = [(enter[ci, e, b], 1.0) for b in (range(ss[0], t + 1) if partial else (t,))
                   if (ci, e, b) in enter]
            rhs = [(hold[ci, s, e], -min(c.proto.throughput(e - s), U)) for s in ss
                   if (s <= t if partial else s == t)]
            lp.row(f"cap[{c.key},{e},{t}]", lhs + rhs, hi=0.0)


def _end_rows(lp, classes, enter, F, L):
    """source: sum enter[c,e,0] = F;  sink: sum enter[c,L,b] = F."""
    src = [(v, 1.0) for (ci, e, b), v in enter.items() if b == 0]
    snk = [(v, 1.0) for (ci, e, b), v in enter.items() if e == L]
    lp.row("source", src + [(F, -1.0)], lo=0.0, hi=0.0)
    lp.row("sink", snk + [(F, -1.0)], lo=0.0, hi=0.0)


def _regions(classes) -> list[str]:
    return sorted({c.region for c in classes})


def _move_vars(lp, classes, L):
    """move[r>q,b] >= 0 for regions r != q and 0 < b < L."""
    regions = _regions(classes)
    moves = {}
    for r in regions:
        for q in regions:
            if r != q:
                for b in range(1, L):
                    moves[r, q, b] = lp.var(f"move[{r}>{q},{b}]")
    return moves


def _pool_rows(lp, classes, enter, moves, L):
    """pool[r,b]: produced + moved in - moved out - consumed = 0 for 0 < b < L."""
    terms = defaultdict(list)
    for (ci, e, b), v in enter.items():
        r = classes[ci].region
        if e < L:
            terms[r, e].append((v, 1.0))  # produced at e
        if b > 0:
            terms[r, b].append((v, -1.0))  # consumed at b
    for (r, q, b), v in moves.items():
        terms[q, b].append((v, 1.0))
        terms[r, b].append((v, -1.0))
    for (r, b), t in sorted(terms.items()):
        lp.row(f"pool[{r},{b}]", t, lo=0.0, hi=0.0)


def _coordinator_rows(lp, classes, hold, enter, L, U):
    """coord_in[c] / coord_out[c]: coordinator links of the nodes that hold layer 0 / layer L-1.

    A node never carries more than F <= U, so capacities are clipped at U (tight big-M)."""
    for ci, c in enumerate(classes):
        ins = [(v, 1.0) for (cj, e, b), v in enter.items() if cj == ci and b == 0]
        first = [(v, -min(c.coord_in_tokens_per_s, U)) for (cj, s, e), v in hold.items() if cj == ci and s == 0]
        if ins:
            lp.row(f"coord_in[{c.key}]", ins + first, hi=0.0)
        outs = [(v, 1.0) for (cj, e, b), v in enter.items() if cj == ci and e == L]
        last = [(v, -min(c.coord_out_tokens_per_s, U)) for (cj, s, e), v in hold.items() if cj == ci and e == L]
        if outs:
            lp.row(f"coord_out[{c.key}]", outs + last, hi=0.0)


def _region_rows(lp, classes, hold, moves, partial, U):
    """send[r>q,b] / recv[r>q,b]: a move is carried by nodes ending at b in r / covering b in q."""
    # Index the hold variables once by (region, end) and (region, boundary taken): scanning every
    # hold variable for every move was quadratic and took seconds on 24-node, 3-region clusters.
    ending, taking = defaultdict(list), defaultdict(list)
    for (ci, s, e), hv in hold.items():
        region = classes[ci].region
        ending[region, e].append((ci, hv))
        for b in (range(s, e) if partial else (s,)):
            taking[region, b].append((ci, hv))
    for (r, q, b), v in moves.items():
        send = [(hv, -min(classes[ci].out_to_region_tokens_per_s[q], U)) for ci, hv in ending[r, b]]
        lp.row(f"send[{r}>{q},{b}]", [(v, 1.0)] + send, hi=0.0)
        recv = [(hv, -min(classes[ci].in_from_region_tokens_per_s[r], U)) for ci, hv in taking[q, b]]
        lp.row(f"recv[{r}>{q},{b}]", [(v, 1.0)] + recv, hi=0.0)


def extract(model: ClassModel, values) -> Placement:
    """Assign each class's real nodes (in name order) to the ranges the solution holds."""
    placement: dict[str, tuple[int, int]] = {}
    free = {ci: list(c.members) for ci, c in enumerate(model.classes)}
    for (ci, s, e), v in sorted(model.hold.items()):
        for _ in range(int(round(values[v]))):
            placement[free[ci].pop(0)] = (s, e)
    return placement


def hold_values(model: ClassModel, placement: Placement) -> dict[int, float]:
    """Variable index -> value of every hold variable for a placement (for warm starts)."""
    cls_of = {m: ci for ci, c in enumerate(model.classes) for m in c.members}
    out = {v: 0.0 for v in model.hold.values()}
    for name, (s, e) in placement.items():
        key = (cls_of[name], s, e)
        if key not in model.hold:
            return {}
        out[model.hold[key]] += 1.0
    return out
