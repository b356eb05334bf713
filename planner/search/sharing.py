"""Sharing bound: a crossing between regions needs a layer run side by side, and side by side
needs nodes holding more layers than they can run at full flow.

At a target X (a placement whose max flow is >= X, its flow scaled down to X; every token runs
every layer once, so the loads of a layer's holders sum to X, and a node's load is at most its
T(k)):

* ``m_i`` = the most layers node i can hold at ``T_i(k) >= X`` (0 if none). A node holding
  ``k_i <= m_i`` is *normal*; one holding more is *excess*: its T(k) < X, so every layer it
  holds has another holder. ``σ = sum_i m_i - L`` is the room the normal counts leave.
* Sharing. Where no region's nodes can hold the model and X exceeds every link between regions,
  some layer has two holders (the crossing bound's argument, ``planner.search.crossing``: a
  chain of single holders sends every token over one such link). With ``H_l`` the holders of
  layer l, ``sum_l (|H_l| - 1) = sum_i k_i - L >= 1``; with no excess node that is at most σ, so
  when σ <= 0 some node is excess (set E, the others N).
* U = the layers excess nodes hold (each has >= 2 holders), U_0 those of them with no normal
  holder. Counting holders over U: ``sum_E k_e + |U| - |U_0| <= sum_U |H_l| <= sum_E k_e +
  sum_N k_i - L + |U|``, so ``|U_0| >= L - sum_N m_i = sum_E m_e - σ =: R``; on U_0 only excess
  nodes run, so ``X R <= X |U_0| <= sum_E k_e T_e(k_e)``; and ``|U| <= sum_l (|H_l| - 1) <=
  sum_E k_e - R`` with ``|U| >= |U_0| >= R`` gives ``2 R <= sum_E k_e``.

So with ``α = k T(k) / X - m`` and ``β = k - 2 m`` per excess node, a placement at X needs a
nonempty E with ``sum_E α >= -σ`` and ``sum_E β >= -2σ``. X is refuted when not even the LP
(excess counts continuous, at most each kind's members) finds one. On 3cluster24 every target
above the A100s' T(9) = 1,754.38 has σ = 0 (8 + 3 + 2 layers a node at T >= X: exactly 80), and
the only excess count with β > 0 (an L4 at 7 layers) has α = -0.88 while the A100 at 9 layers
(α ~ 1) has β = -7: no mix reaches both, so nothing exceeds 1,754.38.

Within an interval between consecutive T values every ``m`` is fixed and every α falls as X
grows, so a refuted X refutes the rest of its interval: the scan tests each interval at its low
end, walking down from the known bound, and bisects the first interval it cannot refute whole.
"""

from __future__ import annotations

from collections import Counter

from planner.milp.linear import LinearModel
from planner.milp.solvers import HighsAdapter, SolveOptions
from planner.problem import PlacementProblem
from planner.search.bounds import layer_counts
from planner.search.crossing import sharing_threshold

#: A kind: ((k, T(k)), ...) for every layer count its members allow.
Kind = tuple[tuple[int, float], ...]

#: Relative step above a breakpoint: X = T(k) (1 + EPS) counts T(k) as below X.
EPS = 1e-9


def sharing_bound(problem: PlacementProblem, upper: float, min_layers: int = 1) -> float | None:
    """The least X such that every target in ``[X, upper]`` is refuted, or None when the argument
    does not apply (a region holds the model, ``upper`` is not above every link between regions,
    or ``upper`` itself is not refuted)."""
    threshold = sharing_threshold(problem)
    if threshold is None or upper <= threshold:
        return None
    kinds = _kinds(problem, min_layers)
    L = problem.num_layers
    breaks = sorted({t for opts in kinds for _, t in opts if threshold < t < upper}, reverse=True)
    breaks.append(threshold)
    hi = upper   # every target in [hi, upper] is refuted once `refuted(upper)`
    if not _refuted(kinds, L, upper):
        return None
    for low in breaks:
        x = low * (1 + EPS)
        if x < hi and _refuted(kinds, L, x):
            hi = x
            continue
        lo = x   # not refuted (or not below hi): the threshold is inside (x, hi]
        while hi - lo > 1e-6 * hi:
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if _refuted(kinds, L, mid) else (mid, hi)
        break
    return hi if hi < upper else None


def _kinds(problem: PlacementProblem, min_layers: int) -> Counter[Kind]:
    """Nodes with the same (k, T(k)) options -> their count (regions and links play no part)."""
    L = problem.num_layers
    kinds: Counter[Kind] = Counter()
    for n in problem.nodes:
        opts = tuple((k, n.throughput(k)) for k in layer_counts(n, L) if k >= min_layers)
        if opts:
            kinds[opts] += 1
    return kinds


def _refuted(kinds: Counter[Kind], L: int, X: float) -> bool:
    """Whether no nonempty set of excess nodes meets ``sum α >= -σ`` and ``sum β >= -2σ`` at X
    (see the module docstring), by the LP over excess counts."""
    m = {opts: max((k for k, t in opts if t >= X), default=0) for opts in kinds}
    sigma = sum(count * m[opts] for opts, count in kinds.items()) - L
    if sigma > 0:
        return False
    lp = LinearModel("sharing")
    alpha, beta, any_excess = [], [], []
    for q, (opts, count) in enumerate(kinds.items()):
        cols = []
        for k, t in opts:
            if k > m[opts]:
                y = lp.var(f"excess[{q},k={k}]", ub=count)
                cols.append((y, 1.0))
                alpha.append((y, k * min(t, X) / X - m[opts]))
                beta.append((y, float(k - 2 * m[opts])))
        lp.row(f"members[{q}]", cols, hi=count)
        any_excess += cols
    if not any_excess:
        return True
    lp.row("nonempty", any_excess, lo=1.0)
    for name, terms, need in (("alpha", alpha, -sigma), ("beta", beta, -2 * sigma)):
        if not any(c for _, c in terms):
            if need > 0:
                return True   # the sum is 0 whatever E is
            continue
        lp.row(name, terms, lo=need - 1e-6)   # a hair of room: solver tolerance never refutes
    res = HighsAdapter().solve(lp, SolveOptions(time_limit_s=5.0, threads=1))
    if res.status == "infeasible":
        return True
    if res.status == "optimal":
        return False
    raise RuntimeError(f"the sharing LP ended {res.status!r}")   # a solver failure, not a proof
