"""Links between vertices: FIFO transmission with bandwidth, propagation latency and NIC limits.

Every directed link ``src -> dst`` transmits one message at a time, first come first served, at the
spec's bandwidth (``ClusterSpec.link``, already capped by both ends' NIC figures); a message arrives
``latency_s`` after its last byte left. When a vertex declares a NIC bandwidth, its NIC is also a
FIFO shared by all its outgoing (sender side) or incoming (receiver side) links, so two links from
one node cannot both run at full NIC speed. Because every resource is FIFO and reservations are made
in event order, a message's start time is known when it is sent: ``max(now, free times of its link
and NICs)``; the simulator schedules only its arrival (a ``TransferFinish`` event).

With ``sharing="fair"`` a link instead shares its bandwidth equally among the messages in flight on
it (processor sharing, as TCP flows roughly do), so a small decode message is not stuck behind a
queue of multi-megabyte prompts on a slow inter-region link. Completion times then change whenever
a message starts or ends, so the network schedules ``LinkWake`` events (stale ones, superseded by a
later change, are ignored by version number). NIC limits cap each link's bandwidth in this mode
(``ClusterSpec.link`` already does) but are not shared across links.
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


class SharedLink:
    """A fair-share link: ``active`` holds ``[remaining_bytes, payload]`` of each message in flight."""

    __slots__ = ("key", "bandwidth_bytes_per_s", "latency_s", "active", "last_s", "version",
                 "busy_s", "bytes_sent")

    def __init__(self, key: tuple[str, str], params: LinkParams) -> None:
        self.key = key
        self.bandwidth_bytes_per_s = params.bandwidth_bytes_per_s
        self.latency_s = params.latency_s
        self.active: list[list] = []
        self.last_s = 0.0
        self.version = 0
        self.busy_s = 0.0
        self.bytes_sent = 0.0

    def advance(self, now_s: float) -> None:
        """Drain every active message by its equal share of the bandwidth since the last change."""
        if self.active and now_s > self.last_s:
            share = (now_s - self.last_s) * self.bandwidth_bytes_per_s / len(self.active)
            for m in self.active:
                m[0] -= share
            self.busy_s += now_s - self.last_s
        self.last_s = now_s

    def next_done_s(self) -> float | None:
        if not self.active:
            return None
        least = min(m[0] for m in self.active)
        return self.last_s + max(0.0, least) * len(self.active) / self.bandwidth_bytes_per_s


class Network:
    """Links looked up lazily through ``link_of(src, dst) -> LinkParams | None``.

    ``sharing``: ``"fifo"`` (one message at a time per link, NICs shared FIFO) or ``"fair"``
    (bandwidth split equally among a link's messages in flight).
    """

    def __init__(self, link_of: Callable[[str, str], LinkParams | None],
                 nic_bandwidth_of: Callable[[str], float | None] = lambda v: None,
                 sharing: str = "fifo") -> None:
        if sharing not in ("fifo", "fair"):
            raise ValueError(f"sharing must be 'fifo' or 'fair', got {sharing!r}")
        self.sharing = sharing
        self._shared: dict[tuple[str, str], SharedLink] = {}
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
        entry = self._links.get((src, dst)) or self._entry(src, dst)
        link, latency_s, out_nic, in_nic = entry
        start = now_s if now_s > link.free_at_s else link.free_at_s
        if out_nic is None and in_nic is None:   # no NIC figures (most specs): the link alone
            duration = num_bytes / link.bandwidth_bytes_per_s
            link.free_at_s = done = start + duration
            link.busy_s += duration
            link.bytes_sent += num_bytes
            return done + latency_s
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

    def start_shared(self, now_s: float, src: str, dst: str, num_bytes: float, payload
                     ) -> tuple[SharedLink, float] | None:
        """Fair mode: put a message on the link; return ``(link, wake time)`` for the link's next
        completion (the caller schedules a wake-up carrying ``link.version``)."""
        link = self._shared.get((src, dst))
        if link is None:
            params = self._link_of(src, dst)
            if params is None:
                raise RuntimeError(f"no link {src} -> {dst} in the cluster spec")
            link = self._shared[(src, dst)] = SharedLink((src, dst), params)
        link.advance(now_s)
        link.active.append([float(num_bytes), payload])
        link.bytes_sent += num_bytes
        link.version += 1
        return link, link.next_done_s()

    def wake_shared(self, now_s: float, link: SharedLink) -> tuple[list, float | None]:
        """Fair mode: the messages finished by ``now_s`` (their payloads) and the next wake time."""
        link.advance(now_s)
        # A message is done when less than a nanosecond of transmission is left (float slack).
        eps = link.bandwidth_bytes_per_s * 1e-9
        done = [m[1] for m in link.active if m[0] <= eps]
        if done:
            link.active = [m for m in link.active if m[0] > eps]
        link.version += 1
        return done, link.next_done_s()

    def link_stats(self) -> dict[tuple[str, str], tuple[float, float]]:
        """``(busy_s, bytes_sent)`` of every link used so far."""
        stats = {k: (v[0].busy_s, v[0].bytes_sent) for k, v in self._links.items()}
        stats.update({k: (v.busy_s, v.bytes_sent) for k, v in self._shared.items()})
        return stats
