"""The tasks one worker holds: load or register, look up, unload at runtime.

A task is either *held* (:meth:`AdapterRegistry.load`, :meth:`AdapterRegistry.add`: read once, kept
in memory until unloaded) or *registered* (:meth:`AdapterRegistry.register`: only its files'
headers are read and checked; its parameters stay on disk and are made ready on demand into the
worker's :class:`~worker.adapter_cache.AdapterCache`, whose byte budget is the engine's
``adapter_cache_bytes``). Registering a thousand tasks costs a thousand header reads.

A request names its task; admitting it takes a reference on the task's :class:`SliceAdapter` (for
a registered task: a cache hit, or a miss that reads it first; either way the task is pinned in
the cache until the reference is given back), and finishing or dropping it gives the reference
back. Unloading a task with requests in flight drains
it: new requests for it are refused at once, the running ones finish with the task's parameters, and
the parameters go when the last one ends. Across a pipeline the first stage refuses, later stages
still take the requests the first admitted; the coordinator unloads a task on its workers only once
its own requests of that task are done, so none is between stages then.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from helix.core.errors import HelixUserError
from helix.core.serving import ServingSpec
from worker.adapter_cache import AdapterCache, CacheStats, NoRoom
from worker.adapter_files import AdapterLimits, AdapterProbe, probe_adapter, read_adapter
from worker.adapters import SliceAdapter
from worker.model import SliceWeights

DEFAULT_CACHE_BYTES = ServingSpec().adapter_cache_bytes
"""The adapter cache budget (a served engine gets ``adapter_cache_bytes`` from the plan's serving
limits)."""


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
    on_disk: bool = False
    """Registered: made ready on demand into the cache (``nbytes`` from the headers; diff and mask
    terms count once read)."""
    cached: bool = True
    """Ready now (always, for a task held in memory)."""


@dataclass
class _OnDisk:
    """A registered task: where its files are, and what its headers said."""

    path: str
    probe: AdapterProbe
    resident_bytes: int | None = None
    """What it held when last made ready (None: never read yet)."""


class AdapterRegistry:
    """Tasks of one slice, by name."""

    def __init__(self, weights: SliceWeights, limits: AdapterLimits = AdapterLimits(),
                 max_adapters: int | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.weights = weights
        self.limits = limits
        self.max_adapters = max_adapters
        """At most this many tasks held or registered at once (None: no limit)."""
        self.cache = AdapterCache(cache_bytes)
        """The registered tasks made ready, within the byte budget."""
        self._adapters: dict[str, SliceAdapter] = {}   # held in memory
        self._on_disk: dict[str, _OnDisk] = {}         # registered
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

    def register(self, name: str, path: str | Path) -> AdapterProbe:
        """Register task ``name`` from folder ``path``: its headers are checked now (the errors of
        :meth:`load` but those that need the values), its parameters read when a request needs
        them. Returns what the headers told (kind, bytes once read)."""
        self._check_free(name)
        return self.add_registered(name, path, probe_adapter(name, path, self.weights, self.limits))

    def add_registered(self, name: str, path: str | Path, probe: AdapterProbe) -> AdapterProbe:
        """Register a task probed already (:func:`~worker.adapter_files.probe_adapter`, which a
        server runs outside its step lock)."""
        self._check_free(name)
        self._on_disk[name] = _OnDisk(str(path), probe)
        self._refs[name] = 0
        return probe

    def _check_free(self, name: str) -> None:
        if not name or ":" in name:
            raise HelixUserError(f"adapter name {name!r}: must be non-empty and without ':'")
        if name in self._refs:
            state = " (draining)" if name in self._draining else ""
            raise HelixUserError(f"adapter {name!r} is already loaded{state}")
        if self.max_adapters is not None and len(self._refs) >= self.max_adapters:
            raise HelixUserError(f"adapter {name!r}: {len(self._refs)} adapters are loaded, the "
                                 f"limit is {self.max_adapters}")

    def unload(self, name: str) -> bool:
        """Stop taking requests for ``name``; True if its parameters are gone now, False if requests
        still run with it (they go when the last one ends)."""
        if name not in self._refs or name in self._draining:
            raise UnknownAdapter(f"adapter {name!r} is not loaded")
        if self._refs[name]:
            self._draining.add(name)
            return False
        self._drop(name)
        return True

    def acquire(self, name: str, draining_ok: bool = False) -> SliceAdapter:
        """The adapter of a new request (one reference more; a registered task is read first when
        it is not in the cache, and pinned there). ``draining_ok``: a later stage takes a request
        of a draining task that an earlier stage admitted (it must finish). Raises
        :class:`~worker.adapter_cache.NoRoom` when the cache's pinned tasks leave no room for it
        now, HelixUserError when its files are bad or it is bigger than the whole budget."""
        if name not in self._refs or (name in self._draining and not draining_ok):
            raise UnknownAdapter(f"adapter {name!r} is not loaded"
                                 + (" (it is being unloaded)" if name in self._draining else ""))
        adapter = self._adapters.get(name) or self._ready(name)
        self._refs[name] += 1
        return adapter

    def _ready(self, name: str) -> SliceAdapter:
        """A registered task from the cache, read into it on a miss, and pinned."""
        adapter = self.cache.get(name)
        if adapter is None:
            entry = self._on_disk[name]
            known = entry.resident_bytes
            if known is not None and known <= self.cache.budget_bytes and not self.cache.fits(known):
                raise NoRoom(name)   # known not to fit now: do not read it again to find out
            t0 = time.perf_counter()
            adapter = read_adapter(name, entry.path, self.weights, self.limits)
            entry.resident_bytes = adapter.resident_bytes
            self.cache.put(adapter, entry.resident_bytes, time.perf_counter() - t0)
        self.cache.pin(name)
        return adapter

    def may_fit(self, name: str | None) -> bool:
        """Whether :meth:`acquire` of ``name`` might find room in the cache now (a request waiting
        for room is tried again when this turns True)."""
        entry = self._on_disk.get(name) if name is not None else None
        if entry is None or name in self.cache or entry.resident_bytes is None:
            return True
        return self.cache.fits(entry.resident_bytes)

    def release(self, name: str) -> None:
        """A request of ``name`` ended; the last one of a draining task drops it."""
        self._refs[name] -= 1
        if name in self._on_disk:
            self.cache.unpin(name)
        if not self._refs[name] and name in self._draining:
            self._drop(name)

    def _drop(self, name: str) -> None:
        self._adapters.pop(name, None)
        if self._on_disk.pop(name, None) is not None:
            self.cache.discard(name)
        del self._refs[name]
        self._draining.discard(name)

    def __contains__(self, name: str) -> bool:
        return name in self._refs and name not in self._draining

    def cache_stats(self) -> CacheStats:
        return self.cache.stats()

    def list(self) -> list[AdapterInfo]:
        held = [AdapterInfo(n, a.kind, a.nbytes, self._refs[n], n in self._draining, a.source)
                for n, a in self._adapters.items()]
        return held + [AdapterInfo(n, e.probe.kind, e.resident_bytes or e.probe.nbytes, self._refs[n],
                                   n in self._draining, e.path, on_disk=True, cached=n in self.cache)
                       for n, e in self._on_disk.items()]
