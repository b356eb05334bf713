"""Start one worker per plan node on Ray. The only module that imports Ray (lazily, in functions).

Placement: each actor asks for the custom resource ``helix_node:<node-name>`` (one unit). A real GPU
machine joins the cluster with ``ray start --address=HEAD --resources='{"helix_node:<name>": 1}'``, so
the worker for ``<name>`` lands on it. Without ``RAY_ADDRESS`` / ``--address`` we start a local Ray in
this process that offers every node's resource, so all workers share this machine.

Addresses: a worker binds the address Ray reports for the node it runs on (asked inside the actor,
so a worker that Ray restarts on a replacement machine binds that machine's), and the coordinator
and the other stages dial what it reports: no 127.0.0.1 assumed. A local Ray started here keeps
workers on 127.0.0.1 (nothing exposed); ``LaunchConfig.bind_host`` overrides both.

Priority: Ray starts worker processes 15 nice levels below their raylet; on a machine shared with
other work they then get little CPU. The workers run at the raylet's priority instead (a local Ray's
is ``helix serve``'s) unless :attr:`LaunchConfig.worker_niceness` asks for Ray's lower one.

Every wait has a timeout; an actor that fails to start or a node resource that never appears is a
:class:`~helix.core.errors.HelixUserError` naming the node.

Restarts: Ray does not restart the actors (``max_restarts=0``); :class:`helix.server.restarts.Supervisor`
watches them (:meth:`RayLauncher.check`) and starts a new one for a worker that died
(:meth:`RayLauncher.respawn`), paced by a back-off and never capped by a count, so a worker comes
back as long as a machine offering its resource does. Each new actor registers with the
coordinator, which makes the node rejoin.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.runtime import WorkerHandle
from helix.core.errors import HelixUserError
from helix.server.restarts import RestartPolicy, WorkerProbe

log = logging.getLogger("helix.launcher")


def node_resource(node: str) -> str:
    return f"helix_node:{node}"


@dataclass(frozen=True)
class LaunchConfig:
    """How workers are started on Ray."""

    address: str | None = None
    """Ray cluster to join (None: ``RAY_ADDRESS`` if set, else a local Ray started here)."""
    start_timeout_s: float = 120.0
    """Longest wait for the actors to report their addresses, once their nodes are there."""
    node_timeout_s: float = 60.0
    """Longest wait for a Ray node offering each plan node's ``helix_node:<name>`` to be alive."""
    torch_threads: int | None = 1
    """Intra-op threads per worker (1 keeps several CPU workers on one machine from fighting)."""
    bind_host: str | None = None
    """Address every worker binds. None: the address Ray reports for the worker's node when joining
    a cluster (each machine its own), 127.0.0.1 with a local Ray started here."""
    restarts: RestartPolicy = RestartPolicy()
    """How a worker whose process died is started again (it then registers and rejoins)."""
    connect_timeout_s: float = 60.0
    """Longest wait for ``ray.init`` (joining a cluster, or starting a local Ray)."""
    worker_niceness: int = 0
    """How much lower than its raylet's CPU priority each worker process runs: the niceness Ray
    adds when it starts a worker (its ``worker_niceness`` setting, read from ``RAY_worker_niceness``
    in the worker's environment). Ray's own default is 15, which on a shared machine starves the
    workers; 0 runs them at the priority of the raylet, which a local Ray inherits from
    ``helix serve`` (``helix serve --worker-niceness``)."""

    def __post_init__(self) -> None:
        if not 0 <= self.worker_niceness <= 19:
            raise HelixUserError(f"--worker-niceness must be in [0, 19], got {self.worker_niceness}")


class RayLauncher:
    """Owns the Ray connection and the worker actors of one ``helix serve``."""

    def __init__(self, config: LaunchConfig = LaunchConfig(), progress=None) -> None:
        """``progress(line)`` hears each step of the start (Ray up, each worker ready)."""
        self.config = config
        self.progress = progress or log.info
        self._actors: dict[str, object] = {}
        self._ready: dict[str, object] = {}   # node -> its actor's first addresses() call
        self._probe: dict[str, object] = {}   # node -> the liveness call in flight, once it is up
        self._spawned: dict[str, tuple] = {}  # node -> the arguments it was started with
        self._incarnation: dict[str, int] = {}
        self._remote_cls = None
        self._tag = uuid.uuid4().hex[:8]   # several serves may share one Ray cluster
        self._started_ray = False
        self.node_ips: dict[str, tuple[str, ...]] = {}
        """Plan node -> addresses of the live Ray nodes offering its resource (after :meth:`start`)."""

    def start(self, nodes: Sequence[str], model_path: str,
              coordinator_address: str | None = None, keys=None) -> list[WorkerHandle]:
        """Start a worker for each node; their addresses once all are up. With
        ``coordinator_address`` a worker that Ray restarts registers there and rejoins. ``keys``
        (:class:`~helix.net.keys.ClusterKeys`) go to each actor as an argument (its repr hides them)."""
        import ray
        t0 = time.monotonic()
        address = self.config.address or os.environ.get("RAY_ADDRESS")
        self.progress(f"starting Ray ({'joining ' + address if address else 'local'}) for "
                      f"{len(nodes)} worker(s) ...")
        self._connect(nodes)
        _check_coordinator_reachable(self.node_ips, coordinator_address)
        self.progress(f"Ray ready ({time.monotonic() - t0:.1f} s); starting workers {', '.join(nodes)}")
        for node in nodes:
            self.spawn(node, model_path, coordinator_address, keys)
        pending = {self._ready[node]: node for node in nodes}
        addresses: dict[str, dict] = {}
        deadline = time.monotonic() + self.config.start_timeout_s
        while pending:   # in the order they come up, each reported as it does
            ready, _ = ray.wait(list(pending), num_returns=1,
                                timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise HelixUserError(f"worker(s) {sorted(pending.values())} did not start within "
                                     f"{self.config.start_timeout_s:.0f} s")
            node = pending.pop(ready[0])
            try:
                addresses[node] = ray.get(ready[0], timeout=self.config.start_timeout_s)
            except ray.exceptions.RayError as exc:
                raise HelixUserError(f"worker {node!r} failed to start: {_last_line(exc)}") from None
            self.progress(f"worker {node} up ({len(addresses)}/{len(nodes)}, "
                          f"{time.monotonic() - t0:.1f} s) at {addresses[node]['data']}")
        return [WorkerHandle(n, addresses[n]["control"], addresses[n]["data"]) for n in nodes]

    def spawn(self, node: str, model_path: str, coordinator_address: str | None = None,
              keys=None) -> None:
        """Start ``node``'s worker actor on the Ray node offering ``helix_node:<node>`` (Ray
        connected); with ``coordinator_address`` it registers there once up."""
        if self._remote_cls is None:
            self._remote_cls = _ray_worker_class()
        k = self._incarnation[node] = self._incarnation.get(node, -1) + 1
        # One name per incarnation: the dead actor's name may not be free yet.
        actor = self._remote_cls.options(
            name=f"helix-worker-{node}-{self._tag}" + (f"-{k}" if k else ""), num_cpus=0,
            resources={node_resource(node): 1}, max_restarts=0,
            runtime_env=worker_runtime_env(self.config)).remote(
                node, model_path, self.config.bind_host, self.config.torch_threads, coordinator_address,
                keys)
        self._actors[node] = actor
        self._ready[node] = actor.addresses.remote()
        self._probe.pop(node, None)
        self._spawned[node] = (model_path, coordinator_address, keys)

    def respawn(self, node: str) -> None:
        """Start a new worker actor for ``node`` with the arguments of its last one (the last one
        died; the new one registers and the node rejoins)."""
        self.spawn(node, *self._spawned[node])

    def supervised(self) -> list[str]:
        """The nodes this launcher started a worker for."""
        return list(self._actors)

    def check(self, node: str) -> tuple[WorkerProbe, str]:
        """``node``'s worker now, without waiting: up (it answered a call), starting (its actor is
        not up yet: being created, or no Ray node offers its resource), silent (up before, and its
        last call is unanswered: busy or frozen) or dead (its process is gone; with Ray's reason)."""
        import ray
        up = node in self._probe
        ref = self._probe[node] if up else self._ready[node]
        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            return (WorkerProbe.SILENT if up else WorkerProbe.STARTING), ""
        try:
            ray.get(ref, timeout=1.0)
        except ray.exceptions.ActorUnavailableError:
            return WorkerProbe.SILENT, ""
        except ray.exceptions.RayActorError as exc:
            return WorkerProbe.DEAD, _last_line(exc)
        except ray.exceptions.GetTimeoutError:
            return WorkerProbe.SILENT, ""
        self._probe[node] = self._actors[node].pid.remote()
        return WorkerProbe.UP, ""

    def offered(self) -> set[str]:
        """Node names whose ``helix_node:<name>`` a live Ray node offers now (empty without Ray)."""
        import ray
        if not ray.is_initialized():
            return set()
        prefix = node_resource("")
        return {r[len(prefix):] for r in offered_resources(ray.nodes())}

    def _connect(self, nodes: Sequence[str]) -> None:
        import ray
        address = self.config.address or os.environ.get("RAY_ADDRESS")
        if ray.is_initialized():
            pass
        elif address:
            _check_reachable(address, self.config.connect_timeout_s)
            _bounded(lambda: ray.init(address=address, logging_level=logging.WARNING),
                     self.config.connect_timeout_s, f"the Ray cluster at {address}")
        else:
            # A local Ray under heavy load sometimes misses its own start-up deadline ("node timed
            # out during startup"): one more try, then one line instead of Ray's traceback.
            for attempt in (1, 2):
                try:
                    _bounded(lambda: ray.init(resources={node_resource(n): 1 for n in nodes},
                                              include_dashboard=False, logging_level=logging.WARNING,
                                              log_to_driver=True),
                             self.config.connect_timeout_s, "a local Ray")
                    break
                except HelixUserError:
                    raise
                except Exception as exc:   # Ray's start-up errors have no common base class
                    if ray.is_initialized():
                        ray.shutdown()
                    if attempt == 2:
                        raise HelixUserError(f"could not start a local Ray: {_last_line(exc)}") from None
                    log.warning("starting a local Ray failed (%s); trying once more", _last_line(exc))
            self._started_ray = True
            if self.config.bind_host is None:   # this machine only: keep the workers off the network
                self.config = dataclasses.replace(self.config, bind_host="127.0.0.1")
        self._wait_for_resources(nodes)

    def _wait_for_resources(self, nodes: Sequence[str]) -> None:
        """Wait up to ``node_timeout_s`` for a live Ray node offering each plan node's resource;
        past it, an error naming the missing nodes with the ``ray start`` line for each."""
        import ray
        deadline = time.monotonic() + self.config.node_timeout_s
        while True:
            offered = offered_resources(ray.nodes())
            missing = [n for n in nodes if not offered.get(node_resource(n))]
            if not missing:
                self.node_ips = {n: offered[node_resource(n)] for n in nodes}
                return
            if time.monotonic() > deadline:
                # The head's real address (a Ray client connection has none here: what was given).
                head = (getattr(ray.get_runtime_context(), "gcs_address", None) or self.config.address
                        or os.environ.get("RAY_ADDRESS") or "HEAD:6379")
                raise HelixUserError(missing_nodes_message(missing, head, self.config.node_timeout_s))
            time.sleep(0.5)

    def worker_pid(self, node: str) -> int:
        """The PID of ``node``'s worker process now (tests kill it)."""
        import ray
        return ray.get(self._actors[node].pid.remote(), timeout=30)

    def shutdown(self) -> None:
        """Kill the actors; stop Ray only if this launcher started it."""
        import ray
        if not ray.is_initialized():
            return
        for actor in self._actors.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception as exc:  # already dead: nothing to free
                log.debug("kill failed: %s", exc)
        self._actors.clear()
        self._ready.clear()
        self._probe.clear()
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False


def worker_runtime_env(config: LaunchConfig) -> dict:
    """The Ray runtime environment of every worker actor: its niceness
    (:attr:`LaunchConfig.worker_niceness`). Given per actor, it holds for a local Ray and for a
    cluster joined with ``--address`` alike (Ray merges these ``env_vars`` into the job's), as
    Ray's own job supervisor sets it."""
    return {"env_vars": {"RAY_worker_niceness": str(config.worker_niceness)}}


def offered_resources(ray_nodes: list[dict]) -> dict[str, tuple[str, ...]]:
    """``helix_node:<name>`` -> addresses of the live Ray nodes offering one unit of it, from
    ``ray.nodes()``."""
    offered: dict[str, list[str]] = {}
    for n in ray_nodes:
        if not n.get("Alive"):
            continue
        for resource, amount in n.get("Resources", {}).items():
            if resource.startswith("helix_node:") and amount >= 1:
                offered.setdefault(resource, []).append(n["NodeManagerAddress"])
    return {r: tuple(sorted(set(ips))) for r, ips in offered.items()}


def missing_nodes_message(missing: Sequence[str], head_address: str, timeout_s: float) -> str:
    """What to run on each missing machine, with the cluster's real head address."""
    lines = [f"no Ray node offers {', '.join(node_resource(n) for n in missing)} after "
             f"{timeout_s:g} s (--node-timeout): plan node(s) {', '.join(missing)} have no machine. "
             f"Start each on its machine with:"]
    lines += [f"  ray start --address={head_address} --resources='{{\"{node_resource(n)}\": 1}}'"
              for n in missing]
    return "\n".join(lines)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def _check_coordinator_reachable(node_ips: dict[str, tuple[str, ...]],
                                 coordinator_address: str | None) -> None:
    """A coordinator on a loopback address cannot be reached by a worker on another machine (it
    would fail to register, and its tokens would never come back): say so before starting any.
    Ray nodes on loopback addresses (a test cluster on one machine) and on this machine's own
    address are this machine."""
    import ray
    if not coordinator_address or not _is_loopback(coordinator_address.rpartition(":")[0]):
        return
    here = ray.util.get_node_ip_address()
    far = {n: ips for n, ips in node_ips.items() if any(ip != here and not _is_loopback(ip) for ip in ips)}
    if far:
        where = ", ".join(f"{n} ({'/'.join(ips)})" for n, ips in sorted(far.items()))
        raise HelixUserError(f"the coordinator listens on {coordinator_address}, which worker(s) on "
                             f"other machines cannot reach: {where}; pass --host with this machine's "
                             f"address ({here}) or 0.0.0.0")


def _ray_worker_class():
    """:class:`worker.actor.WorkerActor` as a Ray actor class that binds its node's address when
    given no host (the node is only known inside the actor) and says which Ray node it is on."""
    import ray
    from worker.actor import WorkerActor

    class RayWorkerActor(WorkerActor):
        def __init__(self, node: str, model_path: str, host: str | None = None, *args, **kwargs):
            super().__init__(node, model_path, host or ray.util.get_node_ip_address(), *args, **kwargs)

        def ray_node(self) -> dict[str, str]:
            """``{"node_id", "ip"}`` of the Ray node this worker runs on."""
            return {"node_id": ray.get_runtime_context().get_node_id(),
                    "ip": ray.util.get_node_ip_address()}

    return ray.remote(RayWorkerActor)


def _check_reachable(address: str, timeout_s: float) -> None:
    """A ``HOST:PORT`` Ray address that does not accept connections is a one-line error at once;
    ``ray.init`` itself retries for minutes, printing C++ warnings. (``auto`` and ``ray://`` client
    addresses are left to Ray.)"""
    if address == "auto" or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=min(timeout_s, 10.0)):
            pass
    except ValueError:
        raise HelixUserError(f"--address {address!r}: expected HOST:PORT (e.g. 10.0.0.1:6379)") from None
    except OSError as exc:
        raise HelixUserError(f"cannot reach the Ray cluster at {address}: "
                             f"{exc.strerror or type(exc).__name__}; is `ray start --head` running "
                             f"there, and is the port open?") from None


_PARKED = threading.Event()   # never set: threads that started Ray's processes wait on it


def _bounded(fn, timeout_s: float, what: str) -> None:
    """Run ``fn`` (a ``ray.init``) with a deadline: past it, a one-line error (the call itself may
    go on in its daemon thread; the command is about to exit).

    The thread never ends: a local Ray's processes get ``PR_SET_PDEATHSIG``, which the kernel ties to
    the *thread* that started them, so a thread that returned would take GCS and the raylet with it."""
    result: list[BaseException | None] = []
    done = threading.Event()

    def run():
        try:
            fn()
            result.append(None)
        except BaseException as exc:   # handed to the caller's thread as is
            result.append(exc)
        finally:
            done.set()
        _PARKED.wait()
    # Ray warns that it set no SIGTERM handler outside the main thread; the server has its own.
    ray_log = logging.getLogger("ray")
    for target in (ray_log, *ray_log.handlers):
        if _QUIET not in target.filters:
            target.addFilter(_QUIET)
    threading.Thread(target=run, name="helix-ray-init", daemon=True).start()
    if not done.wait(timeout_s):
        raise HelixUserError(f"{what} did not answer within {timeout_s:.0f} s")
    if result[0] is not None:
        raise result[0]


class _DropMessage(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


_QUIET = _DropMessage("SIGTERM handler is not set")


def _last_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__
