"""Many fine-tuned tasks in the simulator: a per-task workload mix, each step charged its
adapter terms, and the tasks placed across the plan's pipelines by the live coordinator's policy.

- :class:`TaskMix` says how many tasks the requests name and how skewed their popularity is
  (``helix simulate --tasks 64 --task-skew zipf:1.1``); :func:`assign_tasks` gives each request of
  a workload its task (seeded, so runs repeat). A trace may also carry a task per request.
- Each simulated step pays :meth:`helix.core.costmodel.CostModel.adapter_step_s` for its task groups
  (:class:`~helix.sim.worker.SimWorker`).
- :class:`TaskRouting` (a mixin of :class:`~helix.sim.engine.Simulator`) drives
  :class:`coordinator.task_placement.TaskPlacement`, the object the live coordinator drives: a
  task's requests go only to pipelines whose every stage holds it, the load of each routed request
  is recorded, and rebalancing runs when due (checked whenever the coordinator schedules). A move is
  committed at once: loading a task's parameters (a few MiB per layer slice) is not timed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from coordinator.pipeline import RequestInfo
from coordinator.task_placement import LOOKAHEAD, PlacementConfig, TaskPlacement
from helix.core.costmodel import AdapterShape
from helix.core.errors import HelixUserError
from helix.core.pipelines import enumerate_pipelines
from helix.core.plan import Plan
from helix.sim.events import CoordinatorSchedule


@dataclass(frozen=True)
class TaskMix:
    """Requests spread over ``num_tasks`` fine-tuned tasks (LoRA terms of ``shape``)."""

    num_tasks: int
    skew: str = "uniform"
    """``uniform``, or ``zipf:S``: task k (from 1) is named with probability proportional to k^-S."""
    base_fraction: float = 0.0
    """Share of the requests that ask for the base model itself (no task)."""
    shape: AdapterShape = AdapterShape()
    replicas: int | None = None
    """Place each task on this many of the plan's pipelines at first and move tasks with the load
    (``helix simulate --task-replicas``); None: every node holds every task."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """How tasks move (its ``initial_replicas`` is ``replicas``)."""

    def __post_init__(self) -> None:
        if self.num_tasks < 1:
            raise HelixUserError(f"--tasks must be >= 1, got {self.num_tasks}")
        if self.replicas is not None and self.replicas < 1:
            raise HelixUserError(f"--task-replicas must be >= 1, got {self.replicas}")
        if self.shape.rank < 1:
            raise HelixUserError(f"--task-rank must be >= 1, got {self.shape.rank}")
        if not 0 <= self.base_fraction < 1:
            raise HelixUserError(f"base fraction must be in [0, 1), got {self.base_fraction:g}")
        self.weights()   # checks the skew

    def weights(self) -> list[float]:
        """Relative popularity of tasks 0 .. num_tasks - 1."""
        if self.skew == "uniform":
            return [1.0] * self.num_tasks
        kind, _, value = self.skew.partition(":")
        try:
            s = float(value)
        except ValueError:
            s = -1.0
        if kind != "zipf" or not 0 <= s < 100:
            raise HelixUserError(f"--task-skew {self.skew!r}: expected uniform or zipf:S with "
                                 f"0 <= S < 100 (e.g. zipf:1.1)")
        return [(k + 1) ** -s for k in range(self.num_tasks)]


def task_name(k: int) -> str:
    return f"task-{k}"


def assign_tasks(workload: tuple, mix: TaskMix, seed: int = 0) -> tuple:
    """``workload``'s requests, each naming a task drawn from ``mix`` (requests that name one
    already keep it)."""
    rng = random.Random(seed ^ 0x7A5C)
    names = [task_name(k) for k in range(mix.num_tasks)]
    weights = mix.weights()
    out = []
    for r in workload:
        if r.task is None and rng.random() >= mix.base_fraction:
            r = replace(r, task=rng.choices(names, weights)[0])
        out.append(r)
    return tuple(out)


def task_placement(plan: Plan, tasks, config: PlacementConfig) -> TaskPlacement:
    """A placement over ``plan``'s pipelines with ``tasks`` placed as a newly loaded task is."""
    pipes = enumerate_pipelines(plan)
    placement = TaskPlacement([p.nodes for p in pipes], [p.share for p in pipes], config)
    for t in tasks:
        placement.add_task(t)
    return placement


class TaskRouting:
    """The simulator's side of task placement (see the module docstring)."""

    placement: TaskPlacement | None

    def _init_tasks(self, placement: TaskPlacement | None) -> None:
        self.placement = placement
        self.task_moves: list[tuple[float, str, int, int | None]] = []
        """``(time_s, task, to, off)`` of every move made."""
        self._demand_seen: set[int] = set()

    def _schedule_tasks(self, now_s: float) -> list:
        """:meth:`~helix.sim.engine.Simulator.on_coordinator_schedule` with tasks placed: FIFO
        within each task, but a request whose task has no room now lets the requests of other
        tasks behind it pass (among the first :data:`~coordinator.task_placement.LOOKAHEAD`
        waiting), as the live coordinator does. Each request's demand (prompt + expected output)
        counts toward its task's load when the coordinator first sees it."""
        self._schedule_pending = False
        out: list = []
        blocked: set[str | None] = set()
        queue, i = self.queue, 0
        while i < LOOKAHEAD:
            if i >= len(queue) and not self._pull_offline(now_s):
                break
            req = queue[i]
            if (ready_s := self._handled_at(req, now_s)) is not None:
                out.append(CoordinatorSchedule(ready_s))   # the hop is FIFO: so is everything behind
                break
            if req.task in blocked:
                i += 1
                continue
            info = RequestInfo(req.request_id, req.prompt_tokens, self.expected_output_tokens)
            if req.request_id not in self._demand_seen:
                self._demand_seen.add(req.request_id)
                self.placement.record(req.task, info.kv_tokens)
            pipeline = self.scheduler.schedule(info, self._route_only(req.task, now_s))
            if pipeline is None and (self.scheduler.num_admitted or self.absent):
                blocked.add(req.task)
                i += 1
                continue
            del queue[i]
            if pipeline is None or not self._fits_workers(req, pipeline):
                if pipeline is not None:
                    self.scheduler.release(req.request_id)
                self.rejected += 1   # masked on an empty cluster, or too long: it never fits
                continue
            self._demand_seen.discard(req.request_id)
            out.extend(self._start(now_s, req, pipeline))
        return out

    def _route_only(self, task: str | None, now_s: float) -> frozenset[str] | None:
        """Nodes the request of ``task`` may use (None: every node; rebalancing first, when due)."""
        placement = self.placement
        if placement.due(now_s):
            for m in placement.rebalance(now_s):
                placement.commit(m)
                self.task_moves.append((now_s, m.task, m.to, m.off))
        return placement.nodes_of(task)

