"""A worker process: one slice engine behind a ZeroMQ data plane and a gRPC control service.

Plain class (a test builds it directly; :mod:`worker.actor` wraps it for Ray). The control service
configures the slice and the peer address book, loads and unloads adapter tasks, and answers health,
stats, drain and shutdown. Once configured, a loop thread repeats: take every data-plane message that
arrived, run one engine step, forward what it produced along each request's :class:`~helix.net.wire.Route`:

- a middle stage sends hidden states to the next hop (one message per destination per step);
- the last stage sends the sampled tokens to the coordinator *and* each unfinished request's token
  straight to its first stage as the next step's input; a finished request is released on the
  route's other stages.

A ``Release`` (cancellation, or a finish reported by the last stage) frees the request's KV; a short
tombstone list drops inputs of a released request that were still in flight.

A request the engine drops (an input it refuses, or a step that raised; see
:meth:`~worker.engine.SliceEngine.take_failures`) is reported to the coordinator at once
(a :class:`~helix.net.wire.Failures` message), which answers its client with the error and releases it on every stage; the
other requests keep running. A data-plane message that does not decode is logged and dropped.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import OrderedDict, defaultdict
from dataclasses import fields, replace
from typing import Any

from helix.core.errors import HelixUserError
from helix.core.plan import COORDINATOR
from helix.net.control import ControlServer, WORKER_SERVICE, service_handler, start_server
from helix.net.stats import WorkerStats
from worker.adapter_cache import CacheStats
from worker.adapter_files import probe_adapter
from worker.engine import RequestFailure, SliceEngine
from worker.engine_config import EngineConfig
from helix.net.io_types import StageInput, StageOutput
from helix.net.data_plane import DataPlane
from helix.net.keys import ClusterKeys
from helix.net.wire import (Failure, Failures, InputBatch, Release, Route, TokenBatch, TokenEvent, WireError,
                         WireInput)

log = logging.getLogger("helix.worker")

_TOMBSTONES = 4096
_IDLE_POLL_S = 0.005
_MAX_MESSAGES_PER_STEP = 1024

#: How long a stats call waits for a running step before it answers the last step's figures.
STATS_WAIT_S = 0.2


def engine_config_from(overrides: dict[str, Any]) -> EngineConfig:
    known = {f.name for f in fields(EngineConfig)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise HelixUserError(f"unknown engine option(s) {bad}; known: {sorted(known)}")
    if "eos_token_ids" in overrides:
        overrides = {**overrides, "eos_token_ids": tuple(overrides["eos_token_ids"])}
    return EngineConfig(**overrides)


def _cache_fields(cache: CacheStats | None) -> dict[str, Any]:
    if cache is None:
        return {}
    return {"adapter_cache_hits": cache.hits, "adapter_cache_misses": cache.misses,
            "adapter_cache_evictions": cache.evictions, "adapter_cache_bytes": cache.bytes_cached,
            "adapter_cache_budget_bytes": cache.budget_bytes, "adapter_load_s_p50": cache.load_s_p50,
            "adapter_load_s_p99": cache.load_s_p99}


class WorkerServer:
    """Serves one slice of ``model_path`` as node ``node``."""

    def __init__(self, node: str, model_path: str, host: str = "127.0.0.1", data_port: int = 0,
                 control_port: int = 0, torch_threads: int | None = None,
                 keys: ClusterKeys | None = None) -> None:
        """``keys``: CURVE on the data plane, TLS and the cluster token on every control call."""
        self.node = node
        self.model_path = model_path
        self.torch_threads = torch_threads
        self.engine: SliceEngine | None = None
        self.data = DataPlane(host, data_port, keys=keys)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._routes: dict[Any, Route] = {}
        self._released: OrderedDict[Any, None] = OrderedDict()
        self._steps = 0
        self._step_avg_s = 0.0
        self._step_s_total = 0.0
        self._last_ok: float | None = None
        self._last_error: str | None = None
        self._draining = False
        self._last_stats: WorkerStats | None = None
        self.control: ControlServer = start_server([self._handler()], host, control_port, keys=keys)

    # --- control ----------------------------------------------------------------------------------
    @property
    def addresses(self) -> dict[str, str]:
        return {"node": self.node, "control": self.control.address, "data": self.data.address}

    def configure(self, start: int, end: int, engine: dict[str, Any] | None = None) -> dict:
        """Load layers ``[start, end)`` and start the loop; raises on a bad checkpoint or slice."""
        if self.torch_threads:
            import torch
            torch.set_num_threads(self.torch_threads)
        config = engine_config_from(engine or {})
        new_engine = SliceEngine.from_checkpoint(self.model_path, start, end, config)
        with self._lock:
            self.engine = new_engine
            self._routes.clear()
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"helix-worker-{self.node}",
                                            daemon=True)
            self._thread.start()
        return self.stats().to_dict()

    def set_peers(self, peers: dict[str, str]) -> None:
        self.data.set_peers(peers)

    def stats(self, wait_s: float = STATS_WAIT_S) -> WorkerStats:
        """The worker's figures. A step holds the engine's lock; when it is still running after
        ``wait_s`` (a long prompt step on a loaded machine) the figures of the last poll that got the
        lock are answered, with this moment's step counters, so a busy worker is never mistaken for a frozen one
        (a frozen process answers nothing, and the coordinator's health checks see that)."""
        if not self._lock.acquire(timeout=wait_s):
            last = self._last_stats
            if last is not None:
                return replace(last, steps_total=self._steps, draining=self._draining,
                               step_time_s_avg=self._step_avg_s, last_step_unix_s=self._last_ok,
                               last_error=self._last_error, step_time_s_total=self._step_s_total,
                               bytes_sent_to=self.data.bytes_sent_to())
            self._lock.acquire()
        try:
            self._last_stats = stats = self._stats_locked()
            return stats
        finally:
            self._lock.release()

    def _stats_locked(self) -> WorkerStats:
        e = self.engine
        cache = e.adapters.cache_stats() if e else None
        return WorkerStats(
            node=self.node, configured=e is not None,
            start=e.weights.start if e else 0, end=e.weights.end if e else 0,
            kv_blocks_total=e.blocks.num_blocks if e else 0,
            kv_blocks_used=e.blocks.num_used_blocks if e else 0,
            block_size_tokens=e.blocks.block_size_tokens if e else 0,
            dtype=e.config.dtype if e else "", max_batch_seqs=e.config.max_num_seqs if e else 0,
            step_tokens=e.config.max_num_batched_tokens if e else 0,
            chunked_prefill=e.config.chunked_prefill if e else True,
            num_waiting=len(e.policy.waiting_ids) if e else 0,
            num_running=len(e.policy.running_ids) if e else 0,
            num_requests=len(self._routes),
            steps_total=self._steps, step_time_s_avg=self._step_avg_s,
            last_step_unix_s=self._last_ok, last_error=self._last_error,
            draining=self._draining,
            num_preemptions_total=e.policy.num_preemptions_total if e else 0,
            step_time_s_total=self._step_s_total, bytes_sent_to=self.data.bytes_sent_to(),
            **_cache_fields(cache))

    def drain(self, draining: bool = True) -> None:
        """Stop taking new requests (the coordinator stops routing here); running ones finish.
        ``draining=False`` takes requests again (``helix undrain``)."""
        self._draining = draining

    def load_adapter(self, name: str, path: str) -> dict:
        """Register task ``name`` from ``path``: its files' headers are checked for this slice
        (outside the step lock: steps go on meanwhile); its parameters stay on disk until a request
        needs them (the engine's adapter cache). Its kind and the bytes it holds when ready."""
        engine = self._configured()
        probe = probe_adapter(name, path, engine.weights, engine.adapters.limits)
        with self._lock:
            engine.adapters.add_registered(name, path, probe)
        return {"name": name, "kind": probe.kind, "nbytes": probe.nbytes}

    def unload_adapter(self, name: str) -> dict:
        """Drop task ``name`` (at once, or when its requests still here end); ``unloaded``: gone now."""
        engine = self._configured()
        with self._lock:
            return {"name": name, "unloaded": engine.adapters.unload(name)}

    def _configured(self) -> SliceEngine:
        if self.engine is None:
            raise HelixUserError(f"worker {self.node}: no slice configured yet")
        return self.engine

    def wait_stopped(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s``; True once :meth:`shutdown` ran (e.g. over gRPC)."""
        return self._stop.wait(timeout_s)

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self.control.stop()
        self.data.close()

    def _handler(self):
        def configure(req, _ctx):
            return self.configure(int(req["start"]), int(req["end"]), req.get("engine"))

        def set_peers(req, _ctx):
            self.set_peers(req["peers"])
            return {}

        def health(_req, _ctx):
            s = self.stats()
            return {"node": self.node, "configured": s.configured, "last_step_unix_s": s.last_step_unix_s,
                    "last_error": s.last_error}

        def shutdown(_req, _ctx):
            threading.Thread(target=self.shutdown, daemon=True).start()
            return {}

        def drain(req, _ctx):
            self.drain(bool(req.get("draining", True)))
            return {}

        return service_handler(WORKER_SERVICE, {
            "Configure": configure, "SetPeers": set_peers, "Health": health,
            "Stats": lambda _r, _c: self.stats().to_dict(), "Drain": drain, "Shutdown": shutdown,
            "LoadAdapter": lambda r, _c: self.load_adapter(str(r.get("name", "")), str(r.get("path", ""))),
            "UnloadAdapter": lambda r, _c: self.unload_adapter(str(r.get("name", "")))})

    # --- data loop --------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            busy = self.engine is not None and self.engine.has_work()
            msgs = self._receive(0.0 if busy else _IDLE_POLL_S)
            if not msgs and not busy:
                continue
            try:
                self._step(msgs)
            except Exception:   # a bug in this class: keep serving; health and stats report it
                self._last_error = traceback.format_exc(limit=4)
                log.exception("worker %s: step failed", self.node)

    def _receive(self, timeout_s: float) -> list:
        """Every message that arrived (waiting up to ``timeout_s`` for the first). A message that does
        not decode is logged and dropped, one at a time, so it costs neither the loop nor the good
        messages queued around it."""
        msgs: list = []
        for _ in range(_MAX_MESSAGES_PER_STEP):
            try:
                msg = self.data.recv(0.0 if msgs else timeout_s)
            except WireError as exc:
                self._last_error = f"bad data-plane message: {type(exc).__name__}: {exc}"
                log.warning("worker %s: dropped a bad data-plane message: %s", self.node, exc)
                continue
            except Exception:   # not the message's fault (the socket?): retry on the next turn
                self._last_error = traceback.format_exc(limit=4)
                log.exception("worker %s: data-plane receive failed", self.node)
                break
            if msg is None:
                break
            msgs.append(msg)
        return msgs

    def _step(self, msgs: list) -> None:
        with self._lock:
            inputs = self._accept(msgs)
            engine = self.engine
            failed_before = engine.num_failed_steps
            t0 = time.perf_counter()
            try:
                outputs = engine.step(inputs)
                failures = engine.take_failures()
                failed = engine.num_failed_steps != failed_before
            except Exception as exc:   # outside any one request: fail the requests given to it
                log.exception("worker %s: engine step raised", self.node)
                ids = list(dict.fromkeys(i.request_id for i in inputs))
                engine.release(ids)
                outputs, failed = [], True
                failures = [*engine.take_failures(),
                            *(RequestFailure(rid, f"{type(exc).__name__}: {exc}") for rid in ids)]
            ran = engine.last_plan is not None and not engine.last_plan.is_empty
            if failed:
                self._last_error = failures[-1].message if failures else "step failed"
            elif ran:
                dt = time.perf_counter() - t0
                self._steps += 1
                self._step_avg_s = dt if self._steps == 1 else 0.9 * self._step_avg_s + 0.1 * dt
                self._step_s_total += dt
                self._last_ok = time.time()
            sends = self._route_outputs(outputs, failures) + self._report(failures)
        for peer, msg in sends:
            try:
                self.data.send(peer, msg)
            except Exception:   # e.g. an unknown peer: the other sends must still go out
                log.exception("worker %s: sending %s to %s failed", self.node, type(msg).__name__, peer)

    def _report(self, failures: list[RequestFailure]) -> list[tuple[str, object]]:
        """Tell the coordinator about requests dropped here (it frees them on every stage and
        answers their clients with the error); their later inputs are dropped on arrival."""
        if not failures:
            return []
        out = []
        for f in dict((f.request_id, f) for f in failures).values():
            log.warning("worker %s: request %r failed: %s", self.node, f.request_id, f.message)
            self._routes.pop(f.request_id, None)
            self._tombstone(f.request_id)
            out.append(Failure(f.request_id, self.node, f.message))
        return [(COORDINATOR, Failures(tuple(out)))]

    def _accept(self, msgs: list) -> list[StageInput]:
        inputs: list[StageInput] = []
        for msg in msgs:
            if isinstance(msg, Release):
                self._release(msg.request_ids)
                # Inputs of this batch that arrived before the release must not reach the engine.
                gone = set(msg.request_ids)
                inputs = [i for i in inputs if i.request_id not in gone]
            elif isinstance(msg, InputBatch):
                for w in msg.inputs:
                    rid = w.item.request_id
                    if rid in self._released:
                        continue
                    if w.route is not None:
                        self._routes[rid] = w.route
                    inputs.append(w.item)
            else:
                log.warning("worker %s: ignoring unexpected %s", self.node, type(msg).__name__)
        return inputs

    def _release(self, request_ids) -> None:
        self.engine.release(list(request_ids))
        for rid in request_ids:
            self._routes.pop(rid, None)
            self._tombstone(rid)

    def _tombstone(self, request_id) -> None:
        self._released[request_id] = None
        while len(self._released) > _TOMBSTONES:
            self._released.popitem(last=False)

    def _route_outputs(self, outputs: list[StageOutput],
                       failures: list[RequestFailure]) -> list[tuple[str, object]]:
        """Where this step's outputs go; an output with no route (a bug upstream) fails its request
        (appended to ``failures``) rather than the whole step's routing."""
        if not outputs:
            return []
        unrouted = [o.request_id for o in outputs if o.request_id not in self._routes]
        if unrouted:
            self.engine.release(unrouted)
            failures.extend(RequestFailure(rid, f"worker {self.node} has no route for it")
                            for rid in unrouted)
            outputs = [o for o in outputs if o.request_id in self._routes]
        if self.engine.weights.is_last:
            return self._route_tokens(outputs)
        by_peer: dict[str, list[WireInput]] = defaultdict(list)
        for o in outputs:
            route = self._routes[o.request_id]
            hop = route.next_after(self.node)
            new = replace(o.new_request, enter_layer=hop.enter_layer) if o.new_request else None
            item = StageInput(o.request_id, o.start_position, hidden_states=o.hidden_states,
                              new_request=new)
            by_peer[hop.node].append(WireInput(item, route if new is not None else None))
        return [(peer, InputBatch(tuple(items))) for peer, items in by_peer.items()]

    def _route_tokens(self, outputs: list[StageOutput]) -> list[tuple[str, object]]:
        self_feeding = self.engine.weights.is_first
        tokens, feed, sends = [], defaultdict(list), []
        for o in outputs:
            route = self._routes[o.request_id]
            tokens.append(TokenEvent(o.request_id, o.start_position, o.token, o.finish_reason, self.node,
                                     o.prompt_logprobs))
            if o.finish_reason is not None:
                for node in set(route.nodes) - {self.node}:
                    sends.append((node, Release((o.request_id,))))
                self._routes.pop(o.request_id, None)
            elif not self_feeding:
                item = StageInput(o.request_id, o.start_position, token_ids=(o.token.token_id,))
                feed[route.hops[0].node].append(WireInput(item))
        # The next step's input first: the coordinator's copy is only for streaming.
        out = [(peer, InputBatch(tuple(items))) for peer, items in feed.items()]
        return out + [(COORDINATOR, TokenBatch(tuple(tokens)))] + sends
