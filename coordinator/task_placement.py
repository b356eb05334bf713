"""Which replicas hold which fine-tuned task, and when to move them.

A *replica* is one of the plan's pipelines (:func:`helix.core.pipelines.enumerate_pipelines`: a
source-to-sink path with the share of requests the max-flow solution sends it). A task is *placed*
on a set of replicas; the nodes holding it are the union of their stages. A request of the task is
routed only over nodes that hold it (:meth:`TaskPlacement.nodes_of`, the scheduler's ``only``), so
every stage of its pipeline holds the task; the base model's requests go anywhere.

**Load.** The driver reports each routed request (:meth:`TaskPlacement.record`: the task and the
tokens it brings, prompt plus expected output). At each rebalance a task's rate is the tokens it
brought since the last one over the time elapsed, smoothed (``smoothing`` of the new rate, the rest
of the old one). A task's requests split over its replicas in proportion to their shares (the IWRR
restricted to its nodes does that, up to the paths that cross between replicas), so replica r
carries ``load_r = sum over the tasks t on r of rate_t x share_r / (shares of t's replicas)``
plus the base model's rate x ``share_r``; its *utilization* is ``load_r / share_r``.

**Greedy rebalancing** (deterministic: ties by replica index, then task name). While the busiest
replica b is more than ``imbalance`` x the mean utilization and a move helps: among the tasks on
b, try *migrating* t from b to the idlest replica i that lacks it, and *replicating* t onto i
(keeping b), and take the one that lowers ``max(u_b, u_i)`` the most (a migration when equal: it
moves fewer bytes); at most ``max_moves`` per round. A task on one replica whose rate alone makes
that replica the busiest can only be replicated; a task no longer hot (it would not make the
replica it leaves the busiest) is migrated, which frees its old replica's nodes.

**Adaptive interval.** Rebalancing runs every ``min_interval_s`` while it moves tasks; each round
that moves nothing doubles the wait, up to ``max_interval_s``.

Pure: no clock (the driver passes ``now_s``), no sockets. The live coordinator applies a move by
loading the task on the nodes that lack it, then routing there, and unloading it where no replica
of it remains once its requests there are done (:mod:`coordinator.adapters`); the simulator drives
the same object (:mod:`helix.sim.tasks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


LOOKAHEAD = 64
"""Waiting requests a coordinator looks at per pass when tasks are placed: a request whose task
has no room lets the requests of other tasks behind it pass (FIFO within each task), or one busy
task's pipelines would hold up every idle one."""


@dataclass(frozen=True)
class PlacementConfig:
    """How tasks are placed and moved."""

    initial_replicas: int = 1
    """Replicas a newly loaded task is placed on (the least used ones); at most all of them."""
    min_interval_s: float = 5.0
    """Wait between rebalancing rounds while rounds move tasks."""
    max_interval_s: float = 60.0
    """Longest wait: each round that moves nothing doubles it up to this."""
    imbalance: float = 1.25
    """Rebalance only while the busiest replica's utilization exceeds this x the mean."""
    max_moves: int = 4
    """Moves per round at most."""
    smoothing: float = 0.5
    """Weight of the newest window in a task's rate (the rest: its previous rate)."""

    def __post_init__(self) -> None:
        if self.initial_replicas < 1 or self.max_moves < 0 or not 0 < self.smoothing <= 1 \
                or not 0 < self.min_interval_s <= self.max_interval_s or self.imbalance < 1:
            raise ValueError(f"invalid placement config {self}")


@dataclass(frozen=True)
class Move:
    """One decision: place ``task`` on replica ``to`` and (a migration) take it off replica ``off``
    (None: a replication, it stays where it was)."""

    task: str
    to: int
    off: int | None
    load: tuple[str, ...]
    """Nodes that must load the task (they hold no replica of it yet), in replica order."""
    unload: tuple[str, ...]
    """Nodes that no longer hold any replica of it once the move is done."""


@dataclass
class _Task:
    replicas: set[int] = field(default_factory=set)
    window_tokens: float = 0.0
    window_requests: int = 0
    rate: float = 0.0   # tokens/s, smoothed


class TaskPlacement:
    """The replicas of every task and their load (see the module docstring)."""

    BASE = None
    """The task name of base-model requests (:meth:`record`)."""

    def __init__(self, replicas: Sequence[Sequence[str]], shares: Sequence[float],
                 config: PlacementConfig = PlacementConfig()) -> None:
        if not replicas or len(replicas) != len(shares) or min(shares) <= 0:
            raise ValueError("need one positive share per replica, and at least one replica")
        total = float(sum(shares))
        self.replicas: tuple[tuple[str, ...], ...] = tuple(tuple(r) for r in replicas)
        self.shares: tuple[float, ...] = tuple(s / total for s in shares)
        self.config = config
        self._tasks: dict[str, _Task] = {}
        self._base = _Task()
        self._last_s: float | None = None
        self._pending: dict[str, list[Move]] = {}
        self.interval_s = config.min_interval_s
        """The wait before the next round (adaptive, see the module docstring)."""
        self.rounds = self.moves = 0

    # --- tasks ----------------------------------------------------------------------------------
    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(self._tasks)

    def replicas_of(self, task: str) -> tuple[int, ...]:
        return tuple(sorted(self._tasks[task].replicas))

    def nodes_of(self, task: str | None) -> frozenset[str] | None:
        """Nodes that hold ``task`` (None for the base model: every node)."""
        if task is None:
            return None
        return self._nodes(self._tasks[task].replicas)

    def _nodes(self, replicas) -> frozenset[str]:
        return frozenset(n for r in replicas for n in self.replicas[r])

    def add_task(self, task: str) -> frozenset[str]:
        """Place a new task on the ``initial_replicas`` least used replicas (by load, then by
        (tasks held + 1) / share, so that without load tasks spread in proportion to the shares
        and a plan's many small pipelines do not each get one); the nodes to load it on."""
        if task in self._tasks:
            raise ValueError(f"task {task!r} is placed already")
        util = self.utilization()
        held = [0] * len(self.replicas)   # tasks per replica: new tasks have no load yet
        for t in self._tasks.values():
            for r in t.replicas:
                held[r] += 1
        chosen = sorted(range(len(self.replicas)),
                        key=lambda r: (util[r], (held[r] + 1) / self.shares[r], r))
        self._tasks[task] = _Task(set(chosen[:self.config.initial_replicas]))
        return self.nodes_of(task)

    @classmethod
    def follow(cls, old: "TaskPlacement", replicas: Sequence[Sequence[str]], shares: Sequence[float],
               held: dict[str, frozenset[str]]) -> tuple["TaskPlacement", list[Move]]:
        """``old``'s tasks on the pipelines of a new plan (applied live), ``held`` naming the nodes
        that hold each task: a task goes on every new replica whose nodes all hold it. A task none
        of them holds whole gets the replica with the fewest nodes lacking it (the biggest share
        first) as a pending move (no route until the driver commits it). Rates, interval and
        counters carry over."""
        new = cls(replicas, shares, old.config)
        new._base.rate, new._last_s, new.interval_s = old._base.rate, old._last_s, old.interval_s
        new.rounds, new.moves = old.rounds, old.moves
        moves = []
        for name, t in old._tasks.items():
            nodes = held.get(name, old.nodes_of(name))
            reps = {r for r, rep in enumerate(new.replicas) if set(rep) <= nodes}
            new._tasks[name] = _Task(reps, rate=t.rate)
            if not reps:
                r = min(range(len(new.replicas)), key=lambda r: (
                    sum(n not in nodes for n in new.replicas[r]), -new.shares[r], r))
                move = Move(name, r, None, tuple(n for n in new.replicas[r] if n not in nodes), ())
                new._pending[name] = [move]
                moves.append(move)
        return new, moves

    def remove_task(self, task: str) -> frozenset[str]:
        """Forget ``task``; the nodes that held it."""
        nodes = self.nodes_of(task)
        del self._tasks[task]
        self._pending.pop(task, None)
        return nodes

    # --- load -----------------------------------------------------------------------------------
    def record(self, task: str | None, tokens: float) -> None:
        """A request of ``task`` (None: the base model) was routed, bringing ``tokens``."""
        t = self._base if task is None else self._tasks.get(task)
        if t is not None:
            t.window_tokens += tokens
            t.window_requests += 1

    def rate(self, task: str | None) -> float:
        """Smoothed tokens/s of ``task`` (None: the base model) as of the last round."""
        return (self._base if task is None else self._tasks[task]).rate

    def utilization(self, placed: dict[str, set[int]] | None = None) -> list[float]:
        """Each replica's load / share (tokens/s), for the current placement or ``placed``."""
        load = [self._base.rate * s for s in self.shares]
        for name, t in self._tasks.items():
            reps = t.replicas if placed is None else placed[name]
            held = sum(self.shares[r] for r in reps)
            if not held:
                continue   # no route yet (a move pending after a plan change)
            for r in reps:
                load[r] += t.rate * self.shares[r] / held
        return [x / s for x, s in zip(load, self.shares)]

    # --- rebalancing ----------------------------------------------------------------------------
    def due(self, now_s: float) -> bool:
        """Whether a round should run at ``now_s`` (the first call starts the clock)."""
        if self._last_s is None:
            self._last_s = now_s
            return False
        return now_s - self._last_s >= self.interval_s

    def rebalance(self, now_s: float) -> list[Move]:
        """Close the load window at ``now_s`` and decide this round's moves; the interval adapts.
        A move changes nothing until the driver commits it (:meth:`commit`, after loading the task
        on ``move.load``; then it routes there and no longer over ``move.unload``) or aborts it
        (:meth:`abort`, the load failed); a task with a move pending is not moved again."""
        elapsed = now_s - (self._last_s if self._last_s is not None else now_s)
        self._last_s = now_s
        if elapsed > 0:
            a = self.config.smoothing
            for t in (self._base, *self._tasks.values()):
                t.rate = a * t.window_tokens / elapsed + (1 - a) * t.rate
                t.window_tokens, t.window_requests = 0.0, 0
        moves = self._greedy()
        for m in moves:
            self._pending.setdefault(m.task, []).append(m)
        self.rounds += 1
        self.moves += len(moves)
        c = self.config
        self.interval_s = c.min_interval_s if moves else min(c.max_interval_s, 2 * self.interval_s)
        return moves

    def commit(self, move: Move) -> None:
        """``move`` is done: the task routes over its new replicas."""
        self._settle(move)
        if move.task not in self._tasks:
            return   # removed meanwhile
        reps = self._tasks[move.task].replicas
        reps.add(move.to)
        if move.off is not None:
            reps.discard(move.off)

    def abort(self, move: Move) -> None:
        """``move`` could not be made (loading failed): the task stays where it was."""
        self._settle(move)

    def _settle(self, move: Move) -> None:
        pending = self._pending.get(move.task, [])
        if move in pending:
            pending.remove(move)
        if not pending:
            self._pending.pop(move.task, None)

    def _greedy(self) -> list[Move]:
        placed = {n: set(t.replicas) for n, t in self._tasks.items()}
        # A task with moves pending: as if they were made, and not moved again this round.
        for m in (m for ms in self._pending.values() for m in ms):
            placed[m.task] = (placed[m.task] | {m.to}) - ({m.off} if m.off is not None else set())
        moves: list[Move] = []
        moved: set[str] = set()   # one move per task and round: its load and unload sets hold
        n = len(self.replicas)
        if n < 2:
            return moves
        for _ in range(self.config.max_moves):
            util = self.utilization(placed)
            mean = sum(u * s for u, s in zip(util, self.shares))   # share-weighted: total rate
            b = max(range(n), key=lambda r: (util[r], -r))
            if mean <= 0 or util[b] <= self.config.imbalance * mean:
                break
            best = None   # (new max of u_b and u_i, replication?, task, i)
            for task in sorted(t for t, reps in placed.items() if b in reps and t not in self._pending
                               and t not in moved):
                if self._tasks[task].rate <= 0:
                    continue
                for i in sorted((r for r in range(n) if r not in placed[task]), key=lambda r: (util[r], r)):
                    for replicate in (False, True):
                        trial = {**placed, task: (placed[task] | {i}) - (set() if replicate else {b})}
                        u = self.utilization(trial)
                        key = (max(u[b], u[i]), replicate, task, i)
                        if key[0] < util[b] - 1e-12 and (best is None or key < best):
                            best = key
                    break   # the idlest replica lacking the task only
            if best is None:
                break
            _, replicate, task, i = best
            moved.add(task)
            before = self._nodes(placed[task])
            placed[task] = (placed[task] | {i}) - (set() if replicate else {b})
            after = self._nodes(placed[task])
            moves.append(Move(task, i, None if replicate else b,
                              tuple(x for x in self.replicas[i] if x not in before),
                              tuple(sorted(before - after))))
        return moves
