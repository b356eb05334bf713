"""Links between vertices: FIFO transmission with bandwidth, propagation latency and NIC limits.

Every directed link ``src -> dst`` transmits one message at a time, first come first served, at the
spec's bandwidth (``ClusterSpec.link``, already capped by both ends' NIC figures); a message arrives
``latency_s`` after its last byte left. When a vertex declares a NIC bandwidth, its NIC is also a
FIFO shared by all its outgoing (sender side) or incoming (receiver side) links, so two links from
one node cannot both run at full NIC speed. Because every resource is FIFO and reservations are made
in event order, a message's start time is known when it is sent: ``max(now, free times of its link
and NICs)``; the simulator schedules only its arrival (a ``TransferFinish`` event).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkParams:
    """One directed link as the simulator needs it."""

    bandwidth_bytes_per_s: float
    latency_s: float


class _Fifo:
    __slots__ = ("bandwidth_bytes_per_s", "free_at_s", "busy_s", "bytes_sent")

    def __init__(self, bandwidth_bytes_per_s: float) -> None:
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.free_at_s = 0.0
        self.busy_s = 0.0
        self.bytes_sent = 0.0


class Network:
    """Links looked up lazily through ``link_of(src, dst) -> LinkParams | None``."""

    def __init__(self, link_of: Callable[[str, str], LinkParams | None],
                 nic_bandwidth_of: Callable[[str], float | None] = lambda v: None) -> None:
        self._link_of = link_of
        self._nic_of = nic_bandwidth_of
        self._links: dict[tuple[str, str], tuple[_Fifo, float, _Fifo | None, _Fifo | None]] = {}
        self._nic_out: dict[str, _Fifo | None] = {}
        self._nic_in: dict[str, _Fifo | None] = {}

    def _nic(self, table: dict[str, _Fifo | None], vertex: str) -> _Fifo | None:
        if vertex not in table:
            bw = self._nic_of(vertex)
            table[vertex] = _Fifo(bw) if bw else None
        return table[vertex]

    def _entry(self, src: str, dst: str) -> tuple[_Fifo, float, _Fifo | None, _Fifo | None]:
        entry = self._links.get((src, dst))
        if entry is None:
            params = self._link_of(src, dst)
            if params is None:
                # The scheduler only builds pipelines over usable arcs, so this is a bug.
                raise RuntimeError(f"no link {src} -> {dst} in the cluster spec")
            entry = (_Fifo(params.bandwidth_bytes_per_s), params.latency_s,
                     self._nic(self._nic_out, src), self._nic(self._nic_in, dst))
            self._links[(src, dst)] = entry
        return entry

    def send(self, now_s: float, src: str, dst: str, num_bytes: float) -> float:
        """Reserve the link (and NICs) for ``num_bytes`` from ``now_s``; return the arrival time."""
        link, latency_s, out_nic, in_nic = self._entry(src, dst)
        start = now_s if now_s > link.free_at_s else link.free_at_s
        bw = link.bandwidth_bytes_per_s
        for nic in (out_nic, in_nic):
            if nic is not None:
                start = max(start, nic.free_at_s)
                bw = min(bw, nic.bandwidth_bytes_per_s)
        duration = num_bytes / bw
        done = start + duration
        link.free_at_s = done
        link.busy_s += duration
        link.bytes_sent += num_bytes
        for nic in (out_nic, in_nic):
            if nic is not None:
                nic.free_at_s = done
                nic.busy_s += duration
        return done + latency_s

    def link_stats(self) -> dict[tuple[str, str], tuple[float, float]]:
        """``(busy_s, bytes_sent)`` of every link used so far."""
        return {k: (v[0].busy_s, v[0].bytes_sent) for k, v in self._links.items()}
