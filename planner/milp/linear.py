"""A solver-neutral mixed-integer linear model: named variables, named rows, one objective.

The MILP builders (``planner.milp.paper_model``, ``planner.milp.class_model``) write into a
:class:`LinearModel`; a solver adapter (``planner.milp.solvers``) solves it. Builders never call a solver,
and only their ``extract`` step reads solution values, so a model can be checked row by row
(:meth:`LinearModel.violations`) against any solution, independently of the solver that produced it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

INF = math.inf


@dataclass(frozen=True)
class Row:
    """``lo <= sum(coef * x[index]) <= hi``."""

    name: str
    index: tuple[int, ...]
    coef: tuple[float, ...]
    lo: float
    hi: float


@dataclass
class LinearModel:
    """Variables and rows of a MILP. The objective is always *maximized*."""

    name: str
    var_names: list[str] = field(default_factory=list)
    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    obj: list[float] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    _by_name: dict[str, int] = field(default_factory=dict, repr=False)

    def var(self, name: str, lb: float = 0.0, ub: float = INF, integer: bool = False,
            obj: float = 0.0) -> int:
        """Add a variable; returns its index. Names must be unique (they carry the indices)."""
        if name in self._by_name:
            raise ValueError(f"duplicate variable {name}")
        self._by_name[name] = len(self.var_names)
        self.var_names.append(name)
        self.lb.append(float(lb))
        self.ub.append(float(ub))
        self.integer.append(integer)
        self.obj.append(float(obj))
        return len(self.var_names) - 1

    def index(self, name: str) -> int:
        return self._by_name[name]

    def row(self, name: str, terms: Iterable[tuple[int, float]], lo: float = -INF,
            hi: float = INF) -> None:
        """Add ``lo <= sum(coef * x) <= hi``; repeated variables are summed, zeros dropped."""
        acc: dict[int, float] = {}
        for i, c in terms:
            acc[i] = acc.get(i, 0.0) + float(c)
        acc = {i: c for i, c in acc.items() if c != 0.0}
        if not acc:
            if lo > 1e-9 or hi < -1e-9:
                raise ValueError(f"row {name} has no variables and is infeasible")
            return
        self.rows.append(Row(name, tuple(acc), tuple(acc.values()), float(lo), float(hi)))

    @property
    def num_vars(self) -> int:
        return len(self.var_names)

    def objective_value(self, x: Sequence[float]) -> float:
        return sum(c * x[i] for i, c in enumerate(self.obj) if c)

    def violations(self, x: Sequence[float], tol: float = 1e-6) -> list[str]:
        """Every bound, integrality or row violated by ``x`` (relative tolerance ``tol``)."""
        bad = []
        for i, v in enumerate(x):
            scale = max(1.0, abs(v))
            if v < self.lb[i] - tol * scale or v > self.ub[i] + tol * scale:
                bad.append(f"{self.var_names[i]}={v} outside [{self.lb[i]}, {self.ub[i]}]")
            if self.integer[i] and abs(v - round(v)) > max(tol, 1e-6):
                bad.append(f"{self.var_names[i]}={v} is not integral")
        for r in self.rows:
            act = sum(c * x[i] for i, c in zip(r.index, r.coef))
            scale = max(1.0, max(abs(c * x[i]) for i, c in zip(r.index, r.coef)))
            if act < r.lo - tol * scale or act > r.hi + tol * scale:
                bad.append(f"{r.name}: {act} outside [{r.lo}, {r.hi}]")
        return bad
