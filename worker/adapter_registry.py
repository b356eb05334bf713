"""The tasks one worker holds: load, look up, unload at runtime.

A request names its task; admitting it takes a reference on the task's :class:`SliceAdapter`, and
finishing or dropping it gives the reference back. Unloading a task with requests in flight drains
it: new requests for it are refused at once, the running ones finish with the task's parameters, and
the parameters go when the last one ends. Across a pipeline the first stage refuses, later stages
still take the requests the first admitted; the coordinator unloads a task on its workers only once
its own requests of that task are done, so none is between stages then.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from helix.errors import HelixUserError
from worker.adapter_files import AdapterLimits, read_adapter
from worker.adapters import SliceAdapter
from worker.model import SliceWeights


class UnknownAdapter(HelixUserError):
    """A request or an unload named a task this worker does not hold (HTTP 404 at the front door)."""


@dataclass(frozen=True)
class AdapterInfo:
    """One task as listed: its name, kind, bytes held on this worker, requests in flight, and
    whether it is draining (unloaded while requests still ran)."""

    name: str
    kind: str
    nbytes: int
    in_flight: int
    draining: bool
    source: str


class AdapterRegistry:
    """Tasks of one slice, by name."""

    def __init__(self, weights: SliceWeights, limits: AdapterLimits = AdapterLimits(),
                 max_adapters: int | None = None) -> None:
        self.weights = weights
        self.limits = limits
        self.max_adapters = max_adapters
        """At most this many tasks held at once (None: no limit)."""
        self._adapters: dict[str, SliceAdapter] = {}
        self._refs: dict[str, int] = {}
        self._draining: set[str] = set()

    def load(self, name: str, path: str | Path) -> SliceAdapter:
        """Read task ``name`` from folder ``path`` (its slice's layers only) and hold it."""
        self._check_free(name)
        return self.add(read_adapter(name, path, self.weights, self.limits))

    def add(self, adapter: SliceAdapter) -> SliceAdapter:
        """Hold an adapter built in memory."""
        self._check_free(adapter.name)
        self._adapters[adapter.name] = adapter
        self._refs[adapter.name] = 0
        return adapter

    def _check_free(self, name: str) -> None:
        if not name or ":" in name:
            raise HelixUserError(f"adapter name {name!r}: must be non-empty and without ':'")
        if name in self._adapters:
            state = " (draining)" if name in self._draining else ""
            raise HelixUserError(f"adapter {name!r} is already loaded{state}")
        if self.max_adapters is not None and len(self._adapters) >= self.max_adapters:
            raise HelixUserError(f"adapter {name!r}: {len(self._adapters)} adapters are loaded, the "
                                 f"limit is {self.max_adapters}")

    def unload(self, name: str) -> bool:
        """Stop taking requests for ``name``; True if its parameters are gone now, False if requests
        still run with it (they go when the last one ends)."""
        if name not in self._adapters or name in self._draining:
            raise UnknownAdapter(f"adapter {name!r} is not loaded")
        if self._refs[name]:
            self._draining.add(name)
            return False
        self._drop(name)
        return True

    def acquire(self, name: str, draining_ok: bool = False) -> SliceAdapter:
        """The adapter of a new request (one reference more). ``draining_ok``: a later stage takes
        a request of a draining task that an earlier stage admitted (it must finish)."""
        if name not in self._adapters or (name in self._draining and not draining_ok):
            raise UnknownAdapter(f"adapter {name!r} is not loaded"
                                 + (" (it is being unloaded)" if name in self._draining else ""))
        self._refs[name] += 1
        return self._adapters[name]

    def release(self, name: str) -> None:
        """A request of ``name`` ended; the last one of a draining task drops it."""
        self._refs[name] -= 1
        if not self._refs[name] and name in self._draining:
            self._drop(name)

    def _drop(self, name: str) -> None:
        del self._adapters[name], self._refs[name]
        self._draining.discard(name)

    def __contains__(self, name: str) -> bool:
        return name in self._adapters and name not in self._draining

    def list(self) -> list[AdapterInfo]:
        return [AdapterInfo(n, a.kind, a.nbytes, self._refs[n], n in self._draining, a.source)
                for n, a in self._adapters.items()]
