"""Emulated regions for scripts/geo_testbed.py: network namespaces, veth pairs, tbf, a delaying router.

Layout (``rid`` is a run id, so parallel runs never share a name)::

    rid-r0 (10.77.0.2/24) --eth0==veth==rid0-- rid-rt --rid1==veth==eth0-- rid-r1 (10.77.1.2/24)
                                               |  tun0  |
                                               +- rid2==veth==eth0-- rid-r2 (10.77.2.2/24)

The router namespace forwards between the region veths, but not directly: a policy rule per region
veth (``ip rule iif rid0 lookup 100``, table 100 ``default dev tun0``) sends every packet that enters
from a region into a TUN device, which :func:`run_router` (a Python process in the router namespace)
reads; it holds each packet for the one-way latency of its (source region, destination region) pair
and writes it back into the TUN, from where the main table routes it out of the destination region's
veth. The kernel has no netem (and no iptables), so this is where the delay comes from; every plane
(Ray, gRPC, ZeroMQ, the HTTP client) sees the real addresses and is delayed alike. ``tc tbf`` on the
router-side veths caps the rate into each region.
"""

from __future__ import annotations

import fcntl
import heapq
import json
import os
import select
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
ROUTE_TABLE = 100


def region_subnet(index: int) -> str:
    """The /24 of region ``index`` (the router is .1, hosts .2 and up)."""
    return f"10.77.{index}"


@dataclass
class NetConfig:
    """The emulated network: ``regions`` names; ``delay_ms[i][j]`` one-way latency from region i to j
    (the diagonal is unused: hosts of one region share a namespace and talk over loopback);
    ``rate_mbit`` the tbf rate into each region; ``hosts_per_region`` addresses per region
    namespace (.2, .3, ...); ``mtu`` of every link (large, so the Python router moves fewer packets)."""
    regions: tuple[str, ...] = ("r0", "r1", "r2")
    delay_ms: tuple[tuple[float, ...], ...] = ((0.0, 40.0, 60.0), (40.0, 0.0, 80.0), (60.0, 80.0, 0.0))
    rate_mbit: float = 150.0
    hosts_per_region: int = 1
    mtu: int = 9000


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run one command (no shell); raise with its stderr when ``check`` and it fails."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def namespaces_available() -> str | None:
    """None when this process can make network namespaces, veths and a TUN; else why not."""
    if os.geteuid() != 0:
        return "needs root (ip netns, veth, tc)"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun"
    probe = f"hxprobe{os.getpid()}"
    try:
        sh("ip", "netns", "add", probe)
    except (RuntimeError, FileNotFoundError, subprocess.TimeoutExpired) as exc:
        return f"cannot make a network namespace: {exc}"
    sh("ip", "netns", "del", probe, check=False)
    return None


@dataclass
class Network:
    """The namespaces and links of one run; :meth:`up` builds them, :meth:`down` removes everything
    it made (safe to call twice, and after a partial ``up``)."""
    run_id: str
    config: NetConfig = field(default_factory=NetConfig)
    router_proc: subprocess.Popen | None = None
    made_ns: list[str] = field(default_factory=list)
    router_stats: dict | None = None
    """After :meth:`down`: packets the router released and how late (seconds past their time)."""

    @property
    def stats_path(self) -> str:
        return f"/tmp/{self.run_id}-router.json"

    @property
    def router_ns(self) -> str:
        return f"{self.run_id}-rt"

    def ns(self, region: int) -> str:
        return f"{self.run_id}-{self.config.regions[region]}"

    def host(self, region: int, k: int = 0) -> str:
        """The address of host ``k`` of ``region``."""
        return f"{region_subnet(region)}.{2 + k}"

    def exec_prefix(self, region: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(region)]

    def _rt(self, *args: str) -> None:
        sh("ip", "-n", self.router_ns, *args)

    def up(self) -> None:
        cfg = self.config
        sh("ip", "netns", "add", self.router_ns)
        self.made_ns.append(self.router_ns)
        self._rt("link", "set", "lo", "up")
        for key in ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                    "net.ipv4.conf.default.rp_filter=0", "net.ipv4.conf.all.send_redirects=0",
                    "net.ipv4.conf.default.send_redirects=0"):
            sh("ip", "netns", "exec", self.router_ns, "sysctl", "-q", "-w", key)
        self._rt("tuntap", "add", "dev", "tun0", "mode", "tun")
        self._rt("link", "set", "tun0", "mtu", str(cfg.mtu), "up")
        for i in range(len(cfg.regions)):
            self._region_up(i)
        self._rt("route", "add", "default", "dev", "tun0", "table", str(ROUTE_TABLE))
        self.router_proc = subprocess.Popen(
            ["ip", "netns", "exec", self.router_ns, sys.executable, os.path.abspath(__file__),
             "router", json.dumps({"tun": "tun0", "delay_ms": [list(r) for r in cfg.delay_ms],
                                   "stats": self.stats_path})],
            start_new_session=True)
        time.sleep(0.3)
        if self.router_proc.poll() is not None:
            raise RuntimeError(f"the delaying router exited at once ({self.router_proc.returncode})")

    def _region_up(self, i: int) -> None:
        cfg, ns, rv = self.config, self.ns(i), f"{self.run_id}{i}"
        sh("ip", "netns", "add", ns)
        self.made_ns.append(ns)
        # Both ends are made inside the router namespace, then one moves: no name in the root one.
        self._rt("link", "add", rv, "mtu", str(cfg.mtu), "type", "veth", "peer", "name", "eth0",
                 "mtu", str(cfg.mtu))
        self._rt("link", "set", "eth0", "netns", ns)
        self._rt("addr", "add", f"{region_subnet(i)}.1/24", "dev", rv)
        self._rt("link", "set", rv, "up")
        sh("ip", "netns", "exec", self.router_ns, "sysctl", "-q", "-w", f"net.ipv4.conf.{rv}.rp_filter=0")
        self._rt("rule", "add", "iif", rv, "lookup", str(ROUTE_TABLE))
        # tbf: rate into the region; burst >= one MTU packet, queue ~ 50 ms at the rate.
        rate_bytes = cfg.rate_mbit * 1e6 / 8
        sh("ip", "netns", "exec", self.router_ns, "tc", "qdisc", "add", "dev", rv, "root", "tbf",
           "rate", f"{cfg.rate_mbit}mbit", "burst", str(max(4 * cfg.mtu, 32 * 1024)),
           "limit", str(int(max(rate_bytes * 0.05, 8 * cfg.mtu))))
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        for k in range(cfg.hosts_per_region):
            sh("ip", "-n", ns, "addr", "add", f"{self.host(i, k)}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "route", "add", "default", "via", f"{region_subnet(i)}.1")

    def pids(self) -> list[int]:
        """Every process living in one of this run's namespaces (all of them started by this run)."""
        out: list[int] = []
        for ns in self.made_ns:
            done = sh("ip", "netns", "pids", ns, check=False)
            out += [int(p) for p in done.stdout.split()]
        return out

    def down(self) -> None:
        """Kill the router and whatever still runs in this run's namespaces, then delete them (the
        veths go with the router namespace)."""
        if self.router_proc is not None and self.router_proc.poll() is None:
            kill_group(self.router_proc)
        if os.path.exists(self.stats_path):
            with open(self.stats_path) as f:
                self.router_stats = json.load(f)
            os.unlink(self.stats_path)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.pids()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while pids and time.monotonic() < deadline and self.pids():
                time.sleep(0.1)
        for ns in reversed(self.made_ns):
            sh("ip", "netns", "del", ns, check=False)
        self.made_ns.clear()


def kill_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM ``proc``'s own process group (it was started with ``start_new_session``), SIGKILL
    after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _region_of(addr: bytes) -> int | None:
    # 10.77.<region>.x
    return addr[2] if addr[0] == 10 and addr[1] == 77 else None


def run_router(tun: str, delay_ms: list[list[float]], stats_path: str | None = None) -> None:
    """Read IPv4 packets from ``tun``, write each back after its (src region, dst region) latency.
    Packets of one pair keep their order (same delay, FIFO by the heap's sequence number). On
    SIGTERM, writes to ``stats_path`` how late packets left (a starved router adds delay)."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", tun.encode(), IFF_TUN | IFF_NO_PI))
    os.set_blocking(fd, False)
    delay_s = [[d / 1e3 for d in row] for row in delay_ms]
    held: list[tuple[float, int, bytes]] = []   # (release time, sequence, packet)
    seq = 0
    late = {"packets": 0, "late_sum_s": 0.0, "late_max_s": 0.0, "over_1ms": 0, "over_10ms": 0}

    def stop(*_):
        if stats_path:
            with open(stats_path, "w") as f:
                json.dump(late, f)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    while True:
        now = time.monotonic()
        while held and held[0][0] <= now:
            lateness = now - held[0][0]
            late["packets"] += 1
            late["late_sum_s"] += lateness
            late["late_max_s"] = max(late["late_max_s"], lateness)
            late["over_1ms"] += lateness > 1e-3
            late["over_10ms"] += lateness > 1e-2
            try:
                os.write(fd, heapq.heappop(held)[2])
            except OSError:
                pass   # the kernel refused one packet (e.g. no route): a lossy link drops it
        timeout = max(0.0, held[0][0] - now) if held else 1.0
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            continue
        now = time.monotonic()
        while True:
            try:
                packet = os.read(fd, 65536)
            except BlockingIOError:
                break
            if len(packet) < 20 or packet[0] >> 4 != 4:
                continue   # IPv4 only
            src, dst = _region_of(packet[12:16]), _region_of(packet[16:20])
            d = delay_s[src][dst] if src is not None and dst is not None and \
                src < len(delay_s) and dst < len(delay_s) else 0.0
            heapq.heappush(held, (now + d, seq, packet))
            seq += 1


# Probes (no ping or iperf on these machines): a UDP echo for the round trip, a TCP bulk send for
# the rate. Each side is a short Python process in its namespace.
_ECHO = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 7007)); s.settimeout(20)
try:
    while True:
        data, peer = s.recvfrom(2048); s.sendto(data, peer)
except socket.timeout:
    pass
"""
_PING = """
import socket, sys, time, json
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
rtts = []
for k in range(int(sys.argv[2])):
    t0 = time.perf_counter(); s.sendto(b"x" * 56, (sys.argv[1], 7007))
    try:
        s.recvfrom(2048); rtts.append((time.perf_counter() - t0) * 1e3)
    except socket.timeout:
        pass
    time.sleep(0.05)
print(json.dumps(rtts))
"""
_SINK = """
import socket, sys, time, json
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], 7008)); srv.listen(1); srv.settimeout(30)
conn, _ = srv.accept(); n = 0; t0 = None
while True:
    b = conn.recv(1 << 20)
    if not b:
        break
    if t0 is None:
        t0 = time.perf_counter()
    n += len(b)
print(json.dumps({"bytes": n, "seconds": time.perf_counter() - t0}))
"""
_SOURCE = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], 7008), timeout=30)
c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
chunk = b"\\0" * (1 << 20); end = time.perf_counter() + float(sys.argv[2])
while time.perf_counter() < end:
    c.sendall(chunk)
c.close()
"""


def probe_rtt_ms(net: Network, src: int, dst: int, count: int = 10) -> list[float]:
    """Round trips (ms) of ``count`` 56-byte UDP datagrams from region ``src`` to ``dst`` and back."""
    echo = subprocess.Popen(net.exec_prefix(dst) + [sys.executable, "-c", _ECHO, net.host(dst)],
                            start_new_session=True)
    try:
        time.sleep(0.5)
        out = subprocess.run(net.exec_prefix(src) + [sys.executable, "-c", _PING, net.host(dst),
                                                     str(count)],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        return json.loads(out)
    finally:
        kill_group(echo, 1.0)


def probe_rate_mbit(net: Network, src: int, dst: int, seconds: float = 4.0) -> float:
    """Goodput (Mbit/s) of one TCP connection sending from region ``src`` to ``dst`` for ``seconds``."""
    sink = subprocess.Popen(net.exec_prefix(dst) + [sys.executable, "-c", _SINK, net.host(dst)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        time.sleep(0.5)
        subprocess.run(net.exec_prefix(src) + [sys.executable, "-c", _SOURCE, net.host(dst),
                                               str(seconds)], timeout=seconds + 60, check=True)
        got = json.loads(sink.communicate(timeout=30)[0])
        return got["bytes"] * 8 / got["seconds"] / 1e6
    finally:
        kill_group(sink, 1.0)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "router":
    args = json.loads(sys.argv[2])
    run_router(args["tun"], args["delay_ms"], args.get("stats"))
