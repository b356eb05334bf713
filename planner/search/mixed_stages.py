"""Mixed stages: a chain of stages whose nodes may be of different kinds, by a small pattern MILP.

``planner.search.construct.stages`` builds every stage from one class (m nodes of one kind holding
the same k layers). Where links do not bind, a stage is any set of nodes holding the same k
layers, and it carries the sum of their T(k); a chain of stages serves the least of those sums
(every node of a stage links to every node of the next). Mixing kinds inside a stage fills what
one kind leaves over: on the reference's 42-node cluster one-kind stages cover 77 of the 80
layers at 5,900 tokens/s, mixed ones all 80 (5,905.8 measured, the best one-kind chain 5,813.7).

For a target X this is cutting stock:

* Data: classes c (``planner.milp.classes``) with ``n_c`` members and table ``T_c(k)``; patterns
  p = (k, multiset of classes) whose members' ``min(T_c(k), X)`` sum to >= X, minimal (dropping
  any member falls below X), k within every member's memory at any position.
* Variables: ``use[p]`` in {0..L} - stages built from pattern p.
* Constraints: ``count[c]``: sum_p m_c(p) use[p] <= n_c;
  ``layers``: sum_p k(p) use[p] <= L + k_max (more cannot help; the overshoot is trimmed).
* Objective: maximize the layers covered, sum_p k(p) use[p]; X is reachable when it is >= L (the
  solve stops as soon as an incumbent reaches L or the dual bound falls below it).

Patterns that no reaching solution can use are never generated (exact, not a heuristic). Let
``b_c = max_k k min(T_c(k), X)``, the most layer-tokens/s a class-c node does at X (the fixed
point's g), and ``loss(p) = sum_c m_c(p) b_c - k(p) X >= 0`` (each member does at most b_c, and
the members' sum reaches X on k layers). A solution reaching L layers with N_c nodes of class c
has ``sum_p use[p] loss(p) = sum_c N_c b_c - X sum_p k(p) use[p] <= sum_c n_c b_c - L X``, the
*slack* at X, so no pattern it uses loses more than the slack. Near the fixed point the slack is
small and so is the pattern set: hetero42 with LLaMA-1 30B has 11,510 minimal patterns at
25,000 tokens/s, 2,058 within the slack. The MILP runs without HiGHS's presolve, which cost 6-10x
the search on these wide, 8-row models: 25,033 tokens/s there is reached in 0.2 CPU s (1.2 s
with presolve, ~15 s with every minimal pattern; the target was skipped before, > 5,000 patterns).

The largest X reachable (bisected between the fixed-point bound and 0) is laid out, largest k
first, trimmed from the largest stages (fewer layers never lower T(k)), and measured by the exact
max flow by the caller: a warm start, not a bound. Single-region clusters only (a chain across
regions pays its slow links at every stage boundary; ``planner.search.region_chain`` covers those).
"""

from __future__ import annotations

import time

from planner.flowgraph import Placement
from planner.milp.classes import NodeClass, node_classes
from planner.milp.linear import LinearModel
from planner.milp.solvers import HighsAdapter, SolveOptions
from planner.problem import PlacementProblem
from planner.search.bounds import fixed_point_bound

Pattern = tuple[int, tuple[tuple[int, int], ...]]   # (k, ((class index, members), ...))

#: Patterns above this many for one target: the target is skipped (the MILP stays small).
MAX_PATTERNS = 5_000


def mixed_stages(problem: PlacementProblem, seed: int = 0, partial: bool = True,
                 time_budget_s: float = 5.0, floor: float = 0.0,
                 enough: float | None = None) -> Placement:
    """The mixed-stage chain for the largest target X the pattern MILP reaches in
    ``time_budget_s``: ``enough`` first (a target that would meet the caller's gap), then
    bisection between ``floor`` (a flow already reached elsewhere) and the fixed-point bound, to
    0.1 %. {} when none is reached. A target the solver cannot decide in half the budget counts as
    unreachable (a heuristic, not a bound)."""
    if len({n.region for n in problem.nodes}) != 1:
        return {}
    classes = node_classes(problem)
    L = problem.num_layers
    deadline = time.perf_counter() + time_budget_s
    lo, hi, best = floor, fixed_point_bound(problem), None
    X = enough if enough is not None and floor < enough < hi else hi
    while hi - lo > 1e-3 * hi and time.perf_counter() < deadline:
        stages = _stages_for(classes, X, L, min(deadline, time.perf_counter() + time_budget_s / 2))
        if stages is None:
            hi = X
        else:
            lo, best = X, stages
            if enough is not None and X >= enough:
                break
        X = (lo + hi) / 2
    return _lay_out(classes, best, L) if best else {}


def patterns(classes: list[NodeClass], X: float, L: int,
             deadline: float = float("inf")) -> list[Pattern]:
    """Every minimal pattern for target X that loses at most the slack (see the module
    docstring); [] beyond MAX_PATTERNS or past ``deadline`` (``time.perf_counter()``)."""
    out: list[Pattern] = []
    work = [_best_work(c, X) for c in classes]
    slack = sum(c.count * w for c, w in zip(classes, work)) - L * X
    if slack < 0:   # above the classes' fixed point: nothing reaches X
        return []
    for k in range(1, L + 1):
        if time.perf_counter() > deadline:
            return []
        # (class, capacity at X, b_c): big members first, so minimal sets are found early.
        caps = [(ci, min(c.proto.throughput(k), X), work[ci]) for ci, c in enumerate(classes)
                if k <= _max_k(c) and c.proto.throughput(k) > 0]
        caps.sort(key=lambda t: -t[1])
        # A pattern may spend sum_c m_c b_c <= k X + slack (module docstring); the tolerance
        # only keeps more patterns.
        _extend(caps, classes, k, X, 0, X, [], out, k * X + slack + 1e-9 * X)
        if len(out) > MAX_PATTERNS:
            return []
    return out


def _best_work(c: NodeClass, X: float) -> float:
    """b_c = max_k k min(T_c(k), X) over the layer counts a member holds at any position."""
    return max((k * min(c.proto.throughput(k), X) for k in range(1, _max_k(c) + 1)
                if c.proto.throughput(k) > 0), default=0.0)


def _max_k(c: NodeClass) -> int:
    """Layers a member holds at any position (embedding, middle, LM head)."""
    n = c.proto
    return min(n.max_layers, n.max_layers_first, n.max_layers_last, len(n.throughput_tokens_per_s))


def _extend(caps, classes, k, X, i, left, chosen: list[tuple[int, float]], out,
            budget: float) -> None:
    """Add members (non-increasing capacity order, so the last added is the smallest) until the
    stage reaches X; keep it when dropping its smallest member falls below X (minimal). Members
    spend their b_c from ``budget``: a set over it, and every superset, is never used."""
    for j in range(i, len(caps)):
        ci, cap, spent = caps[j]
        if spent > budget or sum(1 for c, _ in chosen if c == ci) >= classes[ci].count:
            continue
        chosen.append((ci, cap))
        if cap >= left - 1e-9 * X:
            if sum(c for _, c in chosen) - cap < X * (1 - 1e-12):
                counts: dict[int, int] = {}
                for c, _ in chosen:
                    counts[c] = counts.get(c, 0) + 1
                out.append((k, tuple(sorted(counts.items()))))
        elif len(out) <= MAX_PATTERNS:
            _extend(caps, classes, k, X, j, left - cap, chosen, out, budget - spent)
        chosen.pop()


def _stages_for(classes, X, L, deadline) -> list[Pattern] | None:
    """Stages covering >= L layers at target X, or None (unreachable, or undecided in time)."""
    pats = patterns(classes, X, L, deadline)
    if not pats:
        return None
    lp = LinearModel("helix-mixed-stages")
    use = [lp.var(f"use[k={k},{'+'.join(f'{classes[c].key}x{m}' for c, m in mix)}]", ub=L,
                  integer=True, obj=float(k)) for k, mix in pats]
    for ci, c in enumerate(classes):
        terms = [(use[p], float(m)) for p, (_, mix) in enumerate(pats) for cj, m in mix if cj == ci]
        if terms:
            lp.row(f"count[{c.key}]", terms, hi=c.count)
    k_max = max(k for k, _ in pats)
    lp.row("layers", [(use[p], float(k)) for p, (k, _) in enumerate(pats)], hi=float(L + k_max))

    def decided(_elapsed: float, primal: float, dual: float) -> bool:
        return primal >= L - 1e-6 or dual < L - 1e-6   # reached, or proven unreachable

    left = max(0.0, deadline - time.perf_counter())
    res = HighsAdapter().solve(lp, SolveOptions(time_limit_s=left, threads=1, seed=0, rel_gap=0.0,
                                                progress=decided, presolve=False))
    if res.values is None or res.objective is None or res.objective < L - 1e-6:
        return None
    return [pats[p] for p, x in enumerate(res.values) for _ in range(int(round(x)))]


def _lay_out(classes, stages: list[Pattern], L: int) -> Placement:
    """Consecutive ranges, largest k first; the overshoot is trimmed from the largest stages."""
    plan = [[k, mix] for k, mix in sorted(stages, key=lambda p: (-p[0], p[1]))]
    over = sum(k for k, _ in plan) - L
    while over > 0:
        i = max(range(len(plan)), key=lambda j: plan[j][0])
        if plan[i][0] <= 1:
            plan.pop(i)
            over -= 1
            continue
        cut = min(over, plan[i][0] - 1)
        plan[i][0] -= cut
        over -= cut
    free = {ci: list(c.members) for ci, c in enumerate(classes)}
    placement: dict[str, tuple[int, int]] = {}
    s = 0
    for k, mix in plan:
        for ci, m in mix:
            for _ in range(m):
                placement[free[ci].pop(0)] = (s, s + k)
        s += k
    return placement
