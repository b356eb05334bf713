"""Where the coordinator's scheduler falls back once the flow paths' nodes are full: its rule
played in bulk (:func:`scheduler_fallback`), the paths the prediction fills after the max-flow
ones."""

from __future__ import annotations

import numpy as np

from helix.core.pipelines import PlanPipeline, hop_usable
from helix.core.plan import COORDINATOR, Plan
from helix.core.slices import LayerSlice, as_placement

#: Rounds of :func:`scheduler_fallback` (each routes a bulk of requests along one path).
FALLBACK_ROUNDS = 400


def scheduler_fallback(plan: Plan, flow_paths: tuple[PlanPipeline, ...],
                       kv_requests: dict[str, float], rounds: int = FALLBACK_ROUNDS
                       ) -> tuple[tuple[PlanPipeline, float], ...]:
    """The paths the coordinator's scheduler falls back to once the flow paths' nodes are full,
    each with the requests it takes, most first (those in ``flow_paths`` left out).

    The rule played in bulk (:class:`coordinator.schedulers.HelixScheduler`): the flow paths
    fill first, in proportion to their shares, until a node's KV (``kv_requests``, requests of
    the node's whole slice) is full; then each request walks from the coordinator over the usable
    hops whose node has room and reaches the sink through nodes with room, taking a max-flow arc
    where one is open and otherwise the node least used (its KV's used fraction). Each round
    sends a fifth of what the path it finds can still take (at least one request) along it,
    until no path has room. Enumerating every usable path instead (thousands on hetero42) in a
    fixed order missed the one the scheduler actually fills (658 of 867 requests in flight)."""
    ranges = as_placement(plan.placements, skip_empty=True)
    L, partial = plan.num_layers, plan.partial_inference
    names = sorted(ranges)
    members, rep, next_ranges = _range_classes(ranges, L, partial)
    rep_of = {COORDINATOR: COORDINATOR, **{n: rep[ranges[n]] for n in names}}
    by_range = {v: [w for w in names if ranges[w] in rs] for v, rs in next_ranges.items()}
    ends = {v: hop_usable(ranges, L, partial, v, COORDINATOR) for v in names}
    flow = {(a.src, a.dst): a.flow_tokens_per_s for a in plan.arc_flows if a.flow_tokens_per_s > 0}
    cap = {n: kv_requests.get(n, 0.0) for n in names}
    used = dict.fromkeys(names, 0.0)
    # The flow paths, by share, until their nodes fill (progressive filling).
    live = [q for q in flow_paths if all(cap[n] > 0 for n in q.nodes)]
    while live:
        load: dict[str, float] = {}
        for q in live:
            for n in q.nodes:
                load[n] = load.get(n, 0.0) + q.share
        step = min((cap[n] - used[n]) / x for n, x in load.items())
        for n, x in load.items():
            used[n] += step * x
        full = {n for n in load if used[n] >= cap[n] * (1 - 1e-9)}
        live = [q for q in live if not full.intersection(q.nodes)]
    known = {q.nodes for q in flow_paths}
    taken: dict[tuple[str, ...], list] = {}
    # Successors first: every usable hop moves to a higher layer end.
    range_order = sorted(members, key=lambda r: (-r[1], r))
    # The rounds on arrays indexed like ``names`` (1,000 nodes x 400 rounds): KV room, which
    # nodes can still reach the sink, and each vertex's successors as index arrays.
    index = {n: i for i, n in enumerate(names)}
    capacity = np.array([cap[n] for n in names])
    in_use = np.array([used[n] for n in names])
    in_range = {r: np.array([index[n] for n in ns], dtype=np.intp) for r, ns in members.items()}
    next_of = {v: np.array([index[w] for w in ws], dtype=np.intp) for v, ws in by_range.items()}
    open_of: dict[str, np.ndarray] = {}   # per vertex: which successors a max-flow arc reaches
    for _ in range(rounds):
        room = capacity - in_use
        finish = np.zeros(len(names), dtype=bool)
        reached: dict[tuple[int, int], bool] = {}   # some node of the range can finish
        for r in range_order:
            head = rep[r]
            if ends[head] or any(reached[x] for x in next_ranges[head]):
                finish[in_range[r]] = room[in_range[r]] >= 1.0
            reached[r] = bool(finish[in_range[r]].any())
        v, at, stages, path = COORDINATOR, 0, [], []
        while v == COORDINATOR or not ends[v]:
            nxt = next_of[rep_of[v]]
            ok = finish[nxt]
            if not ok.any():
                break
            if v not in open_of:
                open_of[v] = np.array([(v, names[j]) in flow for j in nxt], dtype=bool)
            pool = nxt[ok & open_of[v]] if (ok & open_of[v]).any() else nxt[ok]
            j = int(pool[np.argmin(in_use[pool] / capacity[pool])])   # least used, first on ties
            w = names[j]
            stages.append(LayerSlice(w, at, ranges[w][1]))
            path.append(j)
            v, at = w, ranges[w][1]
        if not stages or not ends[v]:
            break
        nodes = tuple(st.node for st in stages)
        amount = max(1.0, 0.2 * float(room[path].min()))
        in_use[path] += amount
        if nodes not in known:
            entry = taken.setdefault(nodes, [PlanPipeline(tuple(stages), 0.0), 0.0])
            entry[1] += amount
    return tuple(sorted(((q, n) for q, n in taken.values()), key=lambda e: (-e[1], e[0].nodes)))


def _range_classes(ranges: dict[str, tuple[int, int]], num_layers: int, partial: bool):
    """Nodes grouped by layer range: (range -> its nodes in name order, range -> its first node,
    vertex -> the ranges a hop from it may enter), for the coordinator and each range's first
    node. Whether a hop is usable depends on the two ranges only, so :func:`hop_usable` is asked
    once per pair of distinct ranges (a few dozen), not per pair of nodes (10^6 at 1,000)."""
    members: dict[tuple[int, int], list[str]] = {}
    for n in sorted(ranges):
        members.setdefault(ranges[n], []).append(n)
    rep = {r: ns[0] for r, ns in members.items()}
    next_ranges = {v: {r for r, w in rep.items() if hop_usable(ranges, num_layers, partial, v, w)}
                   for v in (COORDINATOR, *rep.values())}
    return members, rep, next_ranges

