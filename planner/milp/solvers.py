"""Solver adapters: one small interface, HiGHS (default, embedded) and Gurobi (when licensed).

An adapter takes a :class:`~planner.milp.linear.LinearModel` and :class:`SolveOptions` and returns a
:class:`SolveResult`. The MILP builders never see a solver. ``make_solver("gurobi")`` falls back to
HiGHS with a one-line warning when gurobipy is missing or its licence refuses the model (errors
10009 "no licence" and 10010 "model too large for size-limited licence").
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from helix.core.errors import HelixUserError
from planner.milp.linear import LinearModel

log = logging.getLogger("helix.planner")

SOLVERS = ("highs", "gurobi")

#: Statuses after which a MILP's dual bound is a proven upper bound.
BOUND_STATUSES = ("optimal", "time_limit", "interrupted")

#: progress(elapsed_s, primal, dual) -> True to stop now (the caller's own gap test).
ProgressFn = Callable[[float, float, float], bool]


@dataclass(frozen=True)
class SolveOptions:
    time_limit_s: float = 60.0
    threads: int = 1
    seed: int = 0
    rel_gap: float = 0.01
    """Stop when (bound - incumbent) / incumbent <= rel_gap."""
    warm_start: Sequence[float] | None = None
    """A full feasible assignment of every variable, tried as the first incumbent."""
    progress: ProgressFn | None = None
    presolve: bool = True
    """False skips the MIP presolve: for many integer columns over a few rows (the mixed-stage
    pattern MILP) HiGHS's presolve costs 6-10x the search it saves."""


@dataclass(frozen=True)
class SolveResult:
    status: str
    """"optimal", "gap" (stopped inside the gap), "time_limit", "interrupted", "infeasible" or "error"."""
    values: tuple[float, ...] | None
    objective: float | None
    bound: float | None
    """Proven upper bound on the model's objective (the solver's dual bound); ``None`` unless the
    solver ended normally (optimal, time limit or interrupted by the caller), since a failed run
    reports a meaningless bound such as 0."""
    seconds: float
    solver: str


class SolverAdapter(Protocol):
    name: str

    def solve(self, model: LinearModel, options: SolveOptions) -> SolveResult: ...


def _solver_gap(rel_gap: float) -> float:
    # Solvers measure (ub - lb) / ub; ours is (ub - lb) / lb, so ask for the equivalent.
    return rel_gap / (1.0 + rel_gap)


#: MILPs with more nonzeros than this run without HiGHS's presolve. Its rules check the time
#: limit only between passes, and a pass costs in proportion to the model: a class MILP of 1.5
#: million nonzeros (a generated 30-node, 3-region cluster) ran 27 s on a 7.6 s limit, all of it
#: probing, and came back without a bound; with probing off another rule ran 60 s on 5.6 s.
#: Without presolve that class MILP ended within its limit. The shipped clusters' models
#: (up to ~220,000) keep it, and so do LPs (the warm starts' completions: 0.9 s presolved, 5 s
#: not).
PRESOLVE_MAX_NONZEROS = 1_000_000


class HighsAdapter:
    """HiGHS through highspy's matrix API (rowwise CSR)."""

    name = "highs"

    def solve(self, model: LinearModel, options: SolveOptions) -> SolveResult:
        import highspy

        t0 = time.perf_counter()
        h = highspy.Highs()
        for name, value in [("output_flag", False), ("time_limit", float(options.time_limit_s)),
                            ("threads", int(options.threads)), ("random_seed", int(options.seed)),
                            ("mip_rel_gap", _solver_gap(options.rel_gap)),
                            ("presolve", "choose" if options.presolve else "off")]:
            if h.setOptionValue(name, value) != highspy.HighsStatus.kOk:
                # HiGHS would silently keep its default (e.g. no time limit): a caller's bug.
                raise ValueError(f"HiGHS refused option {name} = {value!r}")
        if any(model.integer) and sum(len(r.index) for r in model.rows) > PRESOLVE_MAX_NONZEROS:
            h.setOptionValue("presolve", "off")
        h.passModel(self._lp(model, highspy))
        if options.warm_start is not None:
            sol = highspy.HighsSolution()
            sol.col_value = list(map(float, options.warm_start))
            sol.value_valid = True
            h.setSolution(sol)
        if options.progress is not None:
            self._subscribe(h, options.progress, t0)
        # HiGHS sizes one process-wide thread pool on its first run; a later run asking for another
        # thread count returns at once with status "not set" and a dual bound of 0 (highspy 1.15).
        # Resetting the pool before every run costs microseconds and makes each run honour its own
        # `threads`.
        highspy.Highs.resetGlobalScheduler(True)
        h.run()
        return self._result(h, model, highspy, time.perf_counter() - t0)

    @staticmethod
    def _lp(model: LinearModel, highspy):
        lp = highspy.HighsLp()
        lp.num_col_ = model.num_vars
        lp.num_row_ = len(model.rows)
        lp.sense_ = highspy.ObjSense.kMaximize
        lp.col_cost_ = np.asarray(model.obj, dtype=float)
        lp.col_lower_ = np.asarray(model.lb, dtype=float)
        lp.col_upper_ = np.where(np.isinf(model.ub), highspy.kHighsInf, model.ub)
        lp.row_lower_ = np.array([-highspy.kHighsInf if math.isinf(r.lo) else r.lo for r in model.rows])
        lp.row_upper_ = np.array([highspy.kHighsInf if math.isinf(r.hi) else r.hi for r in model.rows])
        starts, index, value = [0], [], []
        for r in model.rows:
            index.extend(r.index)
            value.extend(r.coef)
            starts.append(len(index))
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.num_col_ = model.num_vars
        lp.a_matrix_.num_row_ = len(model.rows)
        lp.a_matrix_.start_ = np.asarray(starts, dtype=np.int32)
        lp.a_matrix_.index_ = np.asarray(index, dtype=np.int32)
        lp.a_matrix_.value_ = np.asarray(value, dtype=float)
        if any(model.integer):
            lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                               for i in model.integer]
        return lp

    @staticmethod
    def _subscribe(h, progress: ProgressFn, t0: float) -> None:
        def on_interrupt(e) -> None:
            out = e.data_out
            if progress(time.perf_counter() - t0, out.mip_primal_bound, out.mip_dual_bound):
                e.data_in.user_interrupt = True
        h.cbMipInterrupt.subscribe(on_interrupt)

    @staticmethod
    def _result(h, model: LinearModel, highspy, seconds: float) -> SolveResult:
        status = h.getModelStatus()
        S = highspy.HighsModelStatus
        info = h.getInfo()
        has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
        values = tuple(h.getSolution().col_value) if has_sol else None
        is_mip = any(model.integer)
        if status == S.kOptimal:
            name = "optimal"
        elif status == S.kTimeLimit:
            name = "time_limit"
        elif status == S.kInterrupt:
            name = "interrupted"
        elif status == S.kInfeasible:
            name = "infeasible"
        else:
            name = h.modelStatusToString(status).lower().replace(" ", "_")
        objective = info.objective_function_value if values is not None else None
        bound = None
        if is_mip and name in BOUND_STATUSES:
            bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else None
        elif not is_mip and name == "optimal":
            bound = objective
        return SolveResult(name, values, objective, bound, seconds, "highs")


class GurobiAdapter:
    """Gurobi through gurobipy's matrix-free API. Raises :class:`GurobiUnavailable` on licence errors."""

    name = "gurobi"

    def solve(self, model: LinearModel, options: SolveOptions) -> SolveResult:
        import gurobipy as gp

        t0 = time.perf_counter()
        try:
            env = gp.Env(empty=True)
            env.setParam("OutputFlag", 0)
            env.start()
            m = gp.Model(model.name, env=env)
            x = self._build(m, model, gp)
            m.Params.TimeLimit = float(options.time_limit_s)
            m.Params.Threads = int(options.threads)
            m.Params.Seed = int(options.seed)
            m.Params.MIPGap = _solver_gap(options.rel_gap)
            if not options.presolve:
                m.Params.Presolve = 0
            if options.warm_start is not None:
                for var, v in zip(x, options.warm_start):
                    var.Start = float(v)
            m.optimize(self._callback(options.progress, t0, gp) if options.progress else None)
        except gp.GurobiError as exc:
            if getattr(exc, "errno", None) in (10009, 10010):
                raise GurobiUnavailable(f"Gurobi licence error {exc.errno}: {exc}") from exc
            raise
        return self._result(m, x, gp, time.perf_counter() - t0)

    @staticmethod
    def _build(m, model: LinearModel, gp):
        vtype = [gp.GRB.INTEGER if i else gp.GRB.CONTINUOUS for i in model.integer]
        x = [m.addVar(lb=lo, ub=(gp.GRB.INFINITY if math.isinf(hi) else hi), obj=c, vtype=t, name=n)
             for lo, hi, c, t, n in zip(model.lb, model.ub, model.obj, vtype, model.var_names)]
        m.ModelSense = gp.GRB.MAXIMIZE
        for r in model.rows:
            expr = gp.LinExpr(list(r.coef), [x[i] for i in r.index])
            if r.lo == r.hi:
                m.addLConstr(expr, gp.GRB.EQUAL, r.hi, name=r.name)
                continue
            if not math.isinf(r.hi):
                m.addLConstr(expr, gp.GRB.LESS_EQUAL, r.hi, name=r.name + ":hi")
            if not math.isinf(r.lo):
                m.addLConstr(expr, gp.GRB.GREATER_EQUAL, r.lo, name=r.name + ":lo")
        return x

    @staticmethod
    def _callback(progress: ProgressFn, t0: float, gp):
        def cb(m, where) -> None:
            if where == gp.GRB.Callback.MIP:
                primal = m.cbGet(gp.GRB.Callback.MIP_OBJBST)
                dual = m.cbGet(gp.GRB.Callback.MIP_OBJBND)
                if progress(time.perf_counter() - t0, primal, dual):
                    m.terminate()
        return cb

    @staticmethod
    def _result(m, x, gp, seconds: float) -> SolveResult:
        names = {gp.GRB.OPTIMAL: "optimal", gp.GRB.TIME_LIMIT: "time_limit",
                 gp.GRB.INTERRUPTED: "interrupted", gp.GRB.INFEASIBLE: "infeasible"}
        status = names.get(m.Status, f"status_{m.Status}")
        values = tuple(v.X for v in x) if m.SolCount > 0 else None
        bound = None
        if m.IsMIP and status in BOUND_STATUSES:
            bound = m.ObjBound if math.isfinite(m.ObjBound) else None
        elif not m.IsMIP and status == "optimal":
            bound = m.ObjVal
        return SolveResult(status, values, m.ObjVal if values else None, bound, seconds, "gurobi")


class GurobiUnavailable(RuntimeError):
    """gurobipy is missing or its licence refuses this model."""


class FallbackAdapter:
    """Try Gurobi; on a licence error (or no gurobipy) warn once and solve with HiGHS."""

    name = "gurobi"

    def __init__(self) -> None:
        self.fell_back = False

    def solve(self, model: LinearModel, options: SolveOptions) -> SolveResult:
        if not self.fell_back:
            try:
                return GurobiAdapter().solve(model, options)
            except ImportError:
                log.warning("gurobipy is not installed (pip install 'helix-serve[gurobi]'); "
                            "using HiGHS")
            except GurobiUnavailable as exc:
                log.warning("%s; falling back to HiGHS", str(exc).splitlines()[0])
            self.fell_back = True
        return HighsAdapter().solve(model, options)


def make_solver(name: str) -> SolverAdapter:
    """The adapter for ``name``; unknown names are a user error listing the valid ones."""
    if name == "highs":
        return HighsAdapter()
    if name == "gurobi":
        return FallbackAdapter()
    raise HelixUserError(f"unknown solver {name!r}; choose one of: {', '.join(SOLVERS)}")
