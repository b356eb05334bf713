"""Fine-tuned tasks served beside the base model (issue 17): load and unload them on every worker.

A mixin of :class:`coordinator.runtime.Coordinator`. Loading tells every worker of the plan to read
its slice's part of the task (control call ``LoadAdapter``; the path is read on the worker's
machine, as vLLM's ``lora_path``); one worker's refusal (a shape that does not match the base, a
rank over the limit, a missing file) unloads it from the others and is the load's error. A request
names its task (``submit(..., adapter=name)``); an unknown task is :class:`UnknownAdapter`.
Unloading stops admitting the task's requests at once, waits until those in flight are done
(``timeout_s``), then tells every worker to drop it, so no request of it is ever between stages
when a worker lets it go.

Every worker holds every task; a worker that rejoins loads them all before it takes requests (item 4
of the issue, placing tasks on some replicas only and moving them with the load, is not built).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from helix.errors import HelixUserError
from helix.net.control import ControlError


class UnknownAdapter(HelixUserError):
    """A task this server does not hold (HTTP 404)."""


@dataclass(frozen=True)
class TaskInfo:
    """One loaded task as listed by ``GET /v1/models``."""

    name: str
    kind: str
    path: str
    nbytes: int
    """Bytes of its parameters, summed over the workers (each holds its layers' part)."""
    draining: bool = False


class Adapters:
    """The coordinator's tasks (state read and written under ``self._lock``)."""

    _tasks: dict[str, TaskInfo]

    def _adapters_init(self) -> None:
        self._tasks = {}
        self._adapter_lock = threading.Lock()   # one load / unload at a time

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
            replies, errors = self._each_worker("LoadAdapter", {"name": name, "path": str(path)})
            if errors:
                self._each_worker("UnloadAdapter", {"name": name}, nodes=list(replies))
                node, message = errors[0]
                raise HelixUserError(f"loading adapter {name!r} failed on {node}: {message}")
            kinds = {r["kind"] for r in replies.values()}
            info = TaskInfo(name, kinds.pop() if len(kinds) == 1 else "?", str(path),
                            sum(int(r["nbytes"]) for r in replies.values()))
            with self._lock:
                self._tasks[name] = info
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
            self._each_worker("UnloadAdapter", {"name": name})
            with self._lock:
                del self._tasks[name]
            return info

    def _load_adapters_on(self, node: str, client) -> None:
        """A worker that (re)joins gets every loaded task before it takes requests."""
        with self._adapter_lock:
            for task in self.adapters():
                try:
                    client.call("LoadAdapter", {"name": task.name, "path": task.path},
                                timeout_s=self.config.configure_timeout_s)
                except ControlError as exc:
                    raise HelixUserError(f"node {node!r} could not load adapter {task.name!r} from "
                                         f"{task.path}: {exc.details.strip().splitlines()[-1]}") from None

    def _requests_of(self, name: str) -> int:
        with self._lock:
            return sum(1 for r in self._live.values() if not r.done and r.adapter == name)

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
