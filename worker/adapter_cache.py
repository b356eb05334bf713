"""An LRU cache of ready-to-run adapters with a byte budget (beyond PetS; S-LoRA's and Punica's
answer to thousands of tasks).

A worker may have many more tasks registered than it can hold: their parameters stay on disk
(safetensors, read memory-mapped) and a task is made ready (read, checked, packed, copied to the
device) when a request needs it. The ready tasks sit here, least recently used first; making room
for a new one evicts from the front. A task with requests in flight is *pinned*: it is never
evicted, so a request runs every step with the same parameters. When the pinned tasks leave no
room, :meth:`AdapterCache.put` raises :class:`NoRoom` and the engine keeps the new request waiting
until a pinned task's requests end; a task bigger than the whole budget is a user error.

The bytes charged are what the packed tensors hold in memory (:attr:`SliceAdapter.resident_bytes`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from helix.core.errors import HelixUserError
from worker.adapters import SliceAdapter

LOAD_TIMES_KEPT = 1024
"""Recent load times kept for the percentiles."""


class NoRoom(Exception):
    """The pinned tasks leave no room for this one now (it fits once some requests end)."""


@dataclass(frozen=True)
class CacheStats:
    """Counters of one worker's adapter cache (since it started)."""

    hits: int
    """Requests whose task was ready when they were admitted."""
    misses: int
    """Reads from disk into the cache (a request whose task was not ready; a request that waits for
    room counts once, when its task is read)."""
    evictions: int
    bytes_cached: int
    budget_bytes: int
    num_cached: int
    num_pinned: int
    load_s_p50: float | None
    """Median time to make a task ready (read, check, pack, copy to the device); None: no load yet."""
    load_s_p99: float | None


class AdapterCache:
    """Ready adapters by task name, least recently used first, within ``budget_bytes``."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 1:
            raise HelixUserError(f"adapter_cache_bytes={budget_bytes}: must be at least 1")
        self.budget_bytes = budget_bytes
        self._ready: OrderedDict[str, tuple[SliceAdapter, int]] = OrderedDict()
        self._pins: dict[str, int] = {}
        self.bytes_cached = 0
        self.hits = self.misses = self.evictions = 0
        self._load_s: deque[float] = deque(maxlen=LOAD_TIMES_KEPT)

    def get(self, name: str) -> SliceAdapter | None:
        """The ready task (now the most recently used, a hit), or None."""
        entry = self._ready.get(name)
        if entry is None:
            return None
        self.hits += 1
        self._ready.move_to_end(name)
        return entry[0]

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more could be held now, evicting every unpinned task if need be."""
        pinned = sum(b for n, (_, b) in self._ready.items() if self._pins.get(n))
        return pinned + nbytes <= self.budget_bytes

    def put(self, adapter: SliceAdapter, nbytes: int, load_s: float) -> None:
        """Hold a task just made ready (``nbytes`` in memory, ``load_s`` to make), evicting the least
        recently used unpinned tasks for room. :class:`NoRoom` (nothing evicted) when the pinned
        ones leave too little; HelixUserError when it is bigger than the whole budget."""
        if nbytes > self.budget_bytes:
            raise HelixUserError(f"adapter {adapter.name!r} holds {_mib(nbytes)} on this worker's "
                                 f"layers, over its adapter cache budget adapter_cache_bytes="
                                 f"{self.budget_bytes} ({_mib(self.budget_bytes)})")
        if not self.fits(nbytes):
            raise NoRoom(adapter.name)
        self.misses += 1
        self._load_s.append(load_s)
        for name in [n for n in self._ready if not self._pins.get(n)]:   # least recently used first
            if self.bytes_cached + nbytes <= self.budget_bytes:
                break
            self.discard(name)
            self.evictions += 1
        self._ready[adapter.name] = (adapter, nbytes)
        self.bytes_cached += nbytes

    def pin(self, name: str) -> None:
        """A request of ``name`` is in flight: keep it until :meth:`unpin`."""
        self._pins[name] = self._pins.get(name, 0) + 1

    def unpin(self, name: str) -> None:
        left = self._pins[name] - 1
        if left:
            self._pins[name] = left
        else:
            del self._pins[name]

    def discard(self, name: str) -> None:
        """Drop a task (evicted, or unloaded); its pins stay with its requests."""
        entry = self._ready.pop(name, None)
        if entry is not None:
            self.bytes_cached -= entry[1]

    def __contains__(self, name: str) -> bool:
        return name in self._ready

    def names(self) -> list[str]:
        """Ready tasks, least recently used first."""
        return list(self._ready)

    def stats(self) -> CacheStats:
        times = sorted(self._load_s)
        return CacheStats(self.hits, self.misses, self.evictions, self.bytes_cached, self.budget_bytes,
                          len(self._ready), sum(1 for n in self._ready if self._pins.get(n)),
                          _quantile(times, 0.5), _quantile(times, 0.99))


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB"
