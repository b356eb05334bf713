"""Fine-tuned tasks served beside the base model: load and unload them on every worker.

A mixin of :class:`coordinator.runtime.Coordinator`. Loading tells every worker of the plan to read
its slice's part of the task (control call ``LoadAdapter``; the path is read on the worker's
machine, as vLLM's ``lora_path``); one worker's refusal (a shape that does not match the base, a
rank over the limit, a missing file) unloads it from the others and is the load's error. A request
names its task (``submit(..., adapter=name)``); an unknown task is :class:`UnknownAdapter`.
Unloading stops admitting the task's requests at once, waits until those in flight are done
(``timeout_s``), then tells every worker to drop it, so no request of it is ever between stages
when a worker lets it go.

By default every worker holds every task; a worker that rejoins loads them all before it takes
requests. With ``RuntimeConfig.task_placement`` set and a plan of several pipelines (item 4 of the
issue), a task is held only by the nodes of its replicas (:class:`~coordinator.task_placement.
TaskPlacement` decides: first the least used pipeline, then greedy moves from busy replicas to idle
ones at an adaptive interval). Its requests are routed only over nodes that hold it, so every stage
of their pipeline does. A move loads the task on the nodes that lack it, then routes there; the
nodes it leaves stop getting its requests at once and unload it when the requests of it that
cross them are done. Rebalancing runs on its own thread, started with the first task. A waiting
request whose task has no room lets the requests of other tasks behind it pass (FIFO within a
task, :meth:`Adapters._admit_other_tasks`).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from coordinator.task_placement import LOOKAHEAD, Move, TaskPlacement
from helix.core.errors import HelixUserError
from helix.net.control import ControlError
from helix.core.pipelines import enumerate_pipelines

log = logging.getLogger("helix.coordinator")


class UnknownAdapter(HelixUserError):
    """A task this server does not hold (HTTP 404)."""


@dataclass(frozen=True)
class TaskInfo:
    """One loaded task as listed by ``GET /v1/models``."""

    name: str
    kind: str
    path: str
    nbytes: int
    """Bytes of its parameters, summed over the workers that hold it (each its layers' part)."""
    draining: bool = False


class Adapters:
    """The coordinator's tasks (state read and written under ``self._lock``)."""

    _tasks: dict[str, TaskInfo]

    def _adapters_init(self) -> None:
        self._tasks = {}
        self._node_bytes: dict[str, dict[str, int]] = {}   # each task's bytes on each node holding it
        self._adapter_lock = threading.Lock()   # one load / unload / move at a time
        self.placement: TaskPlacement | None = None
        """Which pipelines hold which task (None: every worker holds every task)."""
        pipes = enumerate_pipelines(self.plan)
        if self.config.task_placement is not None and len(pipes) > 1:
            self.placement = TaskPlacement([p.nodes for p in pipes], [p.share for p in pipes],
                                           self.config.task_placement)
        self._placement_thread: threading.Thread | None = None
        self._placement_todo: list[tuple[Move, TaskPlacement]] = []   # moves a plan change needs
        self._placement_stale = False   # tasks left without a route while a plan was applied

    def _placement_follow(self, plan) -> None:
        """The coordinator routes on ``plan`` from now on (under the lock; a plan applied live):
        tasks go on its pipelines that hold them whole (:meth:`TaskPlacement.follow`); a task no
        new pipeline holds is loaded on one by the placement thread once the whole plan is in
        (not for the mixed plans on the way: ``reshaping``), and routes once it is."""
        if self.placement is None:
            return
        pipes = enumerate_pipelines(plan)
        if not pipes:
            return
        held = {name: frozenset(nodes) for name, nodes in self._node_bytes.items()}
        self.placement, moves = TaskPlacement.follow(self.placement, [p.nodes for p in pipes],
                                                     [p.share for p in pipes], held)
        if self.reshaping:
            for m in moves:
                self.placement.abort(m)   # decided again when the plan is in
            self._placement_stale = bool(moves)
        else:
            self._placement_todo.extend((m, self.placement) for m in moves)
        if moves:
            self._start_placement()

    def task_nodes(self, name: str | None) -> frozenset[str] | None:
        """The nodes a request of task ``name`` may be routed over (None: any)."""
        if name is None or self.placement is None:
            return None
        with self._lock:
            return self.placement.nodes_of(name) if name in self.placement.tasks else None

    def note_task_request(self, name: str | None, prompt_tokens: int, max_tokens: int) -> None:
        """A request of ``name`` (None: the base model) arrived, bringing its prompt and its KV
        reservation for output as its load (nothing to do unless tasks are placed)."""
        if self.placement is not None:
            with self._lock:
                self.placement.record(name, prompt_tokens + self.output_length.reservation(max_tokens))

    def adapters(self) -> list[TaskInfo]:
        with self._lock:
            return list(self._tasks.values())

    def check_adapter(self, name: str | None) -> None:
        """Raise :class:`UnknownAdapter` unless ``name`` is None or a task taking requests."""
        if name is None:
            return
        task = self._tasks.get(name)
        if task is None or task.draining:
            known = ", ".join(sorted(n for n, t in self._tasks.items() if not t.draining)) or "none"
            state = " (being unloaded)" if task is not None else ""
            raise UnknownAdapter(f"adapter {name!r} is not loaded{state}; loaded: {known}")

    def load_adapter(self, name: str, path: str) -> TaskInfo:
        """Load task ``name`` from ``path`` on every worker; its info (bytes over all workers)."""
        if not isinstance(name, str) or not name or ":" in name:
            raise HelixUserError(f"adapter name {name!r}: must be non-empty and without ':'")
        with self._adapter_lock:
            with self._lock:
                if name in self._tasks:
                    raise HelixUserError(f"adapter {name!r} is already loaded")
                holders = None if self.placement is None else sorted(self.placement.add_task(name))
            replies, errors = self._each_worker("LoadAdapter", {"name": name, "path": str(path)},
                                                nodes=holders)
            if errors:
                self._each_worker("UnloadAdapter", {"name": name}, nodes=list(replies))
                if self.placement is not None:
                    with self._lock:
                        self.placement.remove_task(name)
                node, message = errors[0]
                raise HelixUserError(f"loading adapter {name!r} failed on {node}: {message}")
            kinds = {r["kind"] for r in replies.values()}
            info = TaskInfo(name, kinds.pop() if len(kinds) == 1 else "?", str(path),
                            sum(int(r["nbytes"]) for r in replies.values()))
            with self._lock:
                self._tasks[name] = info
                self._node_bytes[name] = {n: int(r["nbytes"]) for n, r in replies.items()}
            self._start_placement()
            return info

    def unload_adapter(self, name: str, timeout_s: float = 60.0) -> TaskInfo:
        """Stop admitting ``name``'s requests, wait for those in flight, drop it on every worker."""
        with self._adapter_lock:
            with self._lock:
                if name not in self._tasks:
                    raise UnknownAdapter(f"adapter {name!r} is not loaded")
                info = self._tasks[name] = TaskInfo(**{**vars(self._tasks[name]), "draining": True})
            deadline = time.monotonic() + timeout_s
            while self._requests_of(name):
                if time.monotonic() > deadline:
                    with self._lock:   # still usable: the unload did not happen
                        self._tasks[name] = TaskInfo(**{**vars(info), "draining": False})
                    raise HelixUserError(f"adapter {name!r}: {self._requests_of(name)} request(s) still "
                                         f"running after {timeout_s:g} s; not unloaded")
                time.sleep(0.01)
            with self._lock:
                holders = None if self.placement is None else sorted(self.placement.remove_task(name))
            self._each_worker("UnloadAdapter", {"name": name}, nodes=holders)
            with self._lock:
                del self._tasks[name]
                self._node_bytes.pop(name, None)
            return info

    def _load_adapters_on(self, node: str, client) -> None:
        """A worker that (re)joins, or loads a new slice, gets the loaded tasks before it takes
        requests: all of them, or with tasks placed those its node held (for its new layers)."""
        with self._adapter_lock:
            for task in self.adapters():
                with self._lock:
                    held = self._node_bytes.get(task.name, {})
                if self.placement is not None and node not in held:
                    continue
                try:
                    reply = client.call("LoadAdapter", {"name": task.name, "path": task.path},
                                        timeout_s=self.config.configure_timeout_s)
                    with self._lock:
                        held[node] = int(reply["nbytes"])
                except ControlError as exc:
                    raise HelixUserError(f"node {node!r} could not load adapter {task.name!r} from "
                                         f"{task.path}: {exc.details.strip().splitlines()[-1]}") from None

    def _requests_of(self, name: str, nodes: frozenset[str] | None = None) -> int:
        """Requests of task ``name`` in flight (those crossing ``nodes`` only, when given)."""
        with self._lock:
            return sum(1 for r in self._live.values() if not r.done and r.adapter == name and (
                nodes is None or (r.pipeline is not None and not nodes.isdisjoint(r.pipeline.nodes))))

    # --- placement across replicas (coordinator.task_placement) -----------------------------------
    def _admit_other_tasks(self) -> None:
        """The head of the queue waits for room on its task's pipelines (under the lock). With
        tasks placed, the requests behind it of other tasks, among the first ``LOOKAHEAD``, go
        where their own tasks have room, FIFO within each task (as the simulator does)."""
        if self.placement is None or not self._waiting:
            return
        waiting = self._waiting
        blocked = {waiting[0].adapter}
        i = 1
        while i < min(len(waiting), LOOKAHEAD):
            req = waiting[i]
            if req.adapter in blocked:
                i += 1
                continue
            try:
                sent = self._try_dispatch(req)
            except Exception as exc:   # a bug: this request fails, the others go on
                log.exception("coordinator: dispatching request %d failed", req.request_id)
                del waiting[i]
                self._finish(req, "error", release_stages=False, error=f"internal error while "
                             f"dispatching the request: {type(exc).__name__}: {exc}")
                continue
            if sent:
                del waiting[i]
            else:
                blocked.add(req.adapter)
                i += 1

    def _start_placement(self) -> None:
        if self.placement is None or self._placement_thread is not None:
            return
        t = self._placement_thread = threading.Thread(target=self._placement_loop, daemon=True,
                                                      name="helix-coordinator-placement")
        t.start()
        self._threads.append(t)

    def _placement_loop(self) -> None:
        """Rebalance when due (the policy's adaptive interval), and make the moves one by one."""
        tick_s = max(0.05, min(1.0, self.config.task_placement.min_interval_s / 4))
        while not self._stop.wait(tick_s):
            try:
                with self._lock:
                    if self._placement_stale and not self.reshaping:
                        self._placement_stale = False
                        self._placement_follow(self.plan)
                    now, placement = time.monotonic(), self.placement
                    moves, self._placement_todo = self._placement_todo, []
                    if placement.due(now):
                        moves += [(m, placement) for m in placement.rebalance(now)]
                for m, made_by in moves:
                    self.apply_move(m, made_by)
            except Exception:   # the thread must outlive one bad round
                log.exception("coordinator: task placement round failed")

    def apply_move(self, move: Move, made_by: TaskPlacement | None = None,
                   drain_timeout_s: float = 60.0) -> bool:
        """Make ``move`` (:meth:`TaskPlacement.rebalance`'s, of ``made_by``: by default the current
        placement): load the task on ``move.load``, route on the new replicas, then unload it from
        ``move.unload`` once no request of it crosses them. False (and the task stays where it was)
        when a worker could not load it, or a new plan replaced the placement meanwhile."""
        name = move.task
        placement = made_by or self.placement
        with self._adapter_lock:
            with self._lock:
                task = self._tasks.get(name)
                stale = placement is not self.placement
            if task is None or task.draining or stale:
                with self._lock:
                    placement.abort(move)
                return False
            with self._lock:   # what holds it now (a move made by hand may overlap another)
                need = [n for n in move.load if n not in self._node_bytes[name]]
            replies, errors = self._each_worker("LoadAdapter", {"name": name, "path": task.path},
                                                nodes=need)
            if errors:
                self._each_worker("UnloadAdapter", {"name": name}, nodes=list(replies))
                with self._lock:
                    placement.abort(move)
                log.warning("coordinator: moving task %s to %s failed: %s", name, move.load, errors[0])
                return False
            with self._lock:
                self._node_bytes[name].update({n: int(r["nbytes"]) for n, r in replies.items()})
                if placement is not self.placement:   # a plan change came in while it loaded
                    placement.abort(move)   # (the nodes hold it: the next plan change counts them)
                    return False
                placement.commit(move)   # routes over the new replicas from now on
                self._tasks[name] = TaskInfo(**{**vars(task), "nbytes": sum(self._node_bytes[name].values())})
            log.info("coordinator: task %s moved to replica %d (loaded on %s)", name, move.to,
                     ", ".join(move.load) or "nothing new")
            with self._lock:
                gone = frozenset(move.unload) - self.placement.nodes_of(name)
            if gone:
                deadline = time.monotonic() + drain_timeout_s
                while self._requests_of(name, gone) and time.monotonic() < deadline:
                    time.sleep(0.01)
                replies, _ = self._each_worker("UnloadAdapter", {"name": name}, nodes=sorted(gone))
                with self._lock:
                    info = self._tasks.get(name)
                    if info is not None:
                        held = self._node_bytes[name]
                        for n in replies:
                            held.pop(n, None)
                        self._tasks[name] = TaskInfo(**{**vars(info), "nbytes": sum(held.values())})
            return True

    def _each_worker(self, method: str, body: dict, nodes: list[str] | None = None):
        """Call ``method`` on the plan's workers in parallel: (replies by node, [(node, error)])."""
        nodes = list(self.clients) if nodes is None else nodes

        def call(node):
            try:
                return node, self.clients[node].call(method, body,
                                                     timeout_s=self.config.configure_timeout_s), None
            except ControlError as exc:
                return node, None, exc.details.strip().splitlines()[-1]
        if not nodes:
            return {}, []
        with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
            results = list(pool.map(call, nodes))
        return ({n: r for n, r, e in results if e is None}, [(n, e) for n, r, e in results if e is not None])
