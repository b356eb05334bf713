"""The live coordinator: request pool, pipeline choice, token streaming, admission control.

It drives the *same* scheduling objects as the simulator (:func:`coordinator.schedulers.make_scheduler`
with ``helix``: IWRR per vertex over the plan's flows, KV masking by
:class:`~coordinator.kv_estimator.KVEstimator`), corrects the KV estimate with the workers' real block
counts (a stats poller calls :meth:`KVEstimator.observe` every ``stats_interval_s``), and moves
requests over the ZeroMQ data plane:

``submit`` -> schedule (or wait in a bounded queue; full -> :class:`QueueFull`) -> token ids, the
``NewRequest`` and the route to the first stage -> ... -> the last stage samples and sends the token
here (and straight to the first stage) -> detokenize, stop strings, stream to the caller. A finish,
a stop string or a cancellation releases the scheduler's reservation and, unless the last stage
already did, frees the request's KV on every stage of its pipeline.

``submit`` checks every request once (:class:`~coordinator.requests.RequestLimits`: vocabulary,
context, the KV the roomiest pipeline can hold, logprobs), for the HTTP and the gRPC API alike. A
request a stage drops anyway (a ``helix.net.wire.Failures`` message) ends with an error, freed everywhere;
the others go on. The waiting queue is strict FIFO; it moves when a request ends and after every
stats poll.

How it runs is :class:`~coordinator.runtime_config.RuntimeConfig`; what the stages send back is
handled by :class:`~coordinator.streaming.Streaming`, one of its mixins.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from coordinator.adapters import Adapters
from coordinator.admission import QueueFull, WaitingBound
from coordinator.drain import DrainBook, Draining
from coordinator.events import EventLog
from coordinator.health import NodeHealth
from coordinator.kv_estimator import KVEstimator, OutputLengthMean
from coordinator.membership import Membership, NoPipeline
from coordinator.pipeline import RequestInfo
from coordinator.reshape import Reshaping
from coordinator.requests import (Done, LiveRequest, RequestHandle, RequestLimits,
                                  generation_max_new_tokens, max_kv_tokens)
from coordinator.runtime_config import RuntimeConfig
from coordinator.schedulers import HelixScheduler, make_scheduler
from coordinator.streaming import Streaming
from coordinator.textcodec import Detokenizer, TextCodec
from coordinator.workers import PLAN_ENGINE_OPTIONS, WorkerHandle, check_serving, engine_options
from helix.core.errors import HelixUserError
from helix.core.gguf import checkpoint_folder
from helix.core.plan import COORDINATOR, Plan
from helix.core.serving import ServingLimits
from helix.core.slices import LayerSlice
from helix.net.control import WORKER_SERVICE, ControlClient, ControlError
from helix.net.io_types import NewRequest, StageInput
from helix.net.sampling import SamplingParams
from helix.net.stats import WorkerStats
from helix.net.data_plane import DataPlane
from helix.net.keys import ClusterKeys
from helix.net.wire import Hop, InputBatch, Release, Route, WireInput

log = logging.getLogger("helix.coordinator")

__all__ = ["Coordinator", "NoPipeline", "QueueFull", "RuntimeConfig", "WorkerHandle"]


class Observer(Protocol):
    """Latency and usage hooks (the HTTP server's Prometheus metrics implement them)."""

    def first_token(self, ttft_s: float) -> None: ...
    def next_token(self, itl_s: float) -> None: ...
    def finished(self, reason: str, e2e_s: float, queue_s: float, prompt_tokens: int,
                 completion_tokens: int, started: bool) -> None:
        """Every request that ends: ``reason`` stop/length/abort/error; ``queue_s`` waiting for a
        pipeline (to the end, if it never got one); ``started`` whether a token came back."""


def live_scheduler(plan: Plan, kv: KVEstimator) -> HelixScheduler:
    """The simulator's Helix scheduler (IWRR over the plan's flows, KV masking, fallback hops); a
    plan with no pipeline the engine can run (a layer-0 node is a first stage only, see
    :class:`~coordinator.pipeline.Topology`) is a user error."""
    sched = make_scheduler("helix", plan, kv)
    if not sched.fallback.has_path(sched.fallback.mask_of(sched.fallback.nodes)):
        raise HelixUserError("the plan has no pipeline the workers can run (a node holding layer 0 "
                             "can only be a first stage)")
    return sched


class Coordinator(Draining, Membership, Reshaping, Adapters, Streaming):
    """Serves ``plan`` with the workers given to :meth:`attach`."""

    _make_scheduler = staticmethod(live_scheduler)

    def __init__(self, plan: Plan, model_path: str, config: RuntimeConfig = RuntimeConfig(),
                 codec: TextCodec | None = None, host: str = "127.0.0.1",
                 observer: Observer | None = None, keys: ClusterKeys | None = None) -> None:
        """``keys``: CURVE on the data plane, TLS and the cluster token to the workers' control
        services (the workers need the same keys); None: plain sockets."""
        self.serving = check_serving(plan)
        overridden = sorted(set(config.engine) & set(PLAN_ENGINE_OPTIONS))
        if overridden:
            raise HelixUserError(f"engine option(s) {overridden} come from the plan's serving "
                                 f"section, not from the runtime config")
        self.plan = plan
        self.model_path = str(checkpoint_folder(model_path))   # a GGUF's converted folder
        self.config = config
        self.codec = codec or TextCodec(self.model_path)
        if config.max_model_len is not None:
            self.codec.cap_context(config.max_model_len)
        self.observer = observer
        self.keys = keys
        self.data = DataPlane(host, keys=keys)
        self.workers: dict[str, WorkerHandle] = {}
        self.clients: dict[str, ControlClient] = {}
        self.stats: dict[str, WorkerStats] = {}
        self.scheduler: HelixScheduler | None = None
        self.pipeline_counts: Counter[tuple[str, ...]] = Counter()
        self.tokens_by_pipeline: Counter[tuple[str, ...]] = Counter()
        """Tokens generated through each pipeline since start (the live view's decode rates)."""
        self.events = EventLog()
        """Failures, restarts, drains, joins and re-plans of the last hour (coordinator.events)."""
        self._lock = threading.RLock()
        self._live: dict[int, LiveRequest] = {}
        self._waiting: deque[LiveRequest] = deque()
        self._next_id = 0
        self.limits: RequestLimits | None = None
        self.output_length = OutputLengthMean(config.expected_output_tokens)
        """What a request reserves KV for (the running mean of served output lengths)."""
        self._kv_tokens: dict[frozenset[str], int] = {}   # _max_kv_tokens by excluded nodes
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # Health, in this process's monotonic clock: each node's state from the stats polls
        # (coordinator.health), when its successful-step count last grew, and since when no
        # pipeline of usable nodes exists (None: one does).
        self.health: NodeHealth | None = None
        self._engine: dict = {}
        self._stepped_s: dict[str, float] = {}
        self._no_route_since: float | None = None
        self.drains = DrainBook()   # nodes drained by the operator (coordinator.drain)
        self._adapters_init()       # fine-tuned tasks (coordinator.adapters)
        self._probe_lock = threading.Lock()
        self._poll_pool: ThreadPoolExecutor | None = None
        # Failover: the current id of a request that moved (by the id its caller holds), and the
        # old ids each dead node may still hold KV for (released when it answers again).
        self._alias: dict[int, int] = {}
        self._orphans: dict[str, set[int]] = {}
        self.requests_moved = 0
        self.moved_prefill_tokens = 0
        """Tokens prefilled again because their request moved off a dead node."""
        self.waiting_bound = WaitingBound(config.max_waiting_requests, config.min_waiting_requests,
                                          config.max_queue_wait_s, config.expected_restart_s,
                                          default_retry_s=config.retry_after_s)
        """How many new requests may wait (coordinator.admission)."""
        self._outages_init()   # lost nodes, restarts, the capacity serving (coordinator.membership)

    # --- workers ----------------------------------------------------------------------------------
    def attach(self, workers: Sequence[WorkerHandle]) -> None:
        """Configure every worker's slice and peers, build the scheduler, start serving."""
        missing = {p.node for p in self.plan.placements} - {w.node for w in workers}
        if missing:
            raise HelixUserError(f"no worker for plan node(s) {sorted(missing)}")
        for w in workers:
            self.workers[w.node] = w
            self.clients[w.node] = ControlClient(w.control_address, WORKER_SERVICE, keys=self.keys)
        self._engine = {"eos_token_ids": list(self.codec.eos_token_ids), **self.config.engine}
        with ThreadPoolExecutor(max_workers=len(workers)) as pool:
            replies = dict(zip([w.node for w in workers], pool.map(
                lambda w: self._load_slice(self.plan.placement_of(w.node), self.serving,
                                           self.clients[w.node]), workers)))
        peers = {w.node: w.data_address for w in workers} | {COORDINATOR: self.data.address}
        for node, client in self.clients.items():
            client.call("SetPeers", {"peers": peers})
        self.data.set_peers(peers)
        self.stats = {n: WorkerStats.from_dict(r) for n, r in replies.items()}
        self.health = NodeHealth(self.stats, self.config.health, time.monotonic())
        self._poll_pool = ThreadPoolExecutor(max_workers=min(32, len(workers)),
                                             thread_name_prefix="helix-poll")
        kv = KVEstimator({n: s.kv_capacity_token_layers for n, s in self.stats.items()},
                         self.serving.kv_high_water)
        self.scheduler = live_scheduler(self.plan, kv)
        self._flows = self.plan.arc_flows   # what the scheduler routes on (re-solved when nodes die)
        self.limits = RequestLimits(self.codec.vocab_size, self.codec.max_context_tokens,
                                    self._max_kv_tokens(),
                                    default_max_tokens=generation_max_new_tokens(self.model_path))
        for target, name in ((self._receive_loop, "receiver"), (self._stats_loop, "stats")):
            t = threading.Thread(target=target, name=f"helix-coordinator-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def _load_slice(self, layers: LayerSlice, serving: ServingLimits, client: ControlClient,
                    which: str = "slice") -> dict:
        """Have ``layers.node``'s worker (``client``) load ``layers``, its engine run with what
        ``serving`` says for it; the worker's stats. ``which`` names the slice in the error."""
        engine = {**self._engine, **engine_options(serving, layers.node)}
        try:
            return client.call("Configure", {"start": layers.start, "end": layers.end, "engine": engine},
                               timeout_s=self.config.configure_timeout_s)
        except ControlError as exc:
            raise HelixUserError(f"worker {layers.node!r} failed to load its {which} [{layers.start}, "
                                 f"{layers.end}) of {self.model_path}: "
                                 f"{exc.details.strip().splitlines()[-1]}") from None

    # --- requests ---------------------------------------------------------------------------------
    def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams, stop: Sequence[str] = (),
               loop: asyncio.AbstractEventLoop | None = None, adapter: str | None = None,
               sibling: bool = False) -> RequestHandle:
        """Admit a request (or queue it); raises :class:`QueueFull` or :class:`HelixUserError`
        (:class:`~coordinator.adapters.UnknownAdapter` when ``adapter`` names no loaded task).
        ``sibling``: another sequence of a reply whose first one was admitted (``n > 1``); it may
        wait past ``max_waiting_requests``, or a reply with more sequences than the queue holds
        would be refused with a 503 that no retry could ever pass."""
        if self.scheduler is None:
            raise RuntimeError("coordinator has no workers yet (call attach)")
        params = self.limits.resolve(len(prompt_token_ids), params)
        prompt = self.limits.check(prompt_token_ids, params)
        bad_stop = [s for s in stop if not isinstance(s, str)]
        if bad_stop:
            raise HelixUserError(f"stop must be strings, got {bad_stop[:5]!r}")
        with self._lock:
            self._check_route()
            self.check_adapter(adapter)
            self.note_task_request(adapter, len(prompt), params.max_tokens)
            rid = self._next_id
            self._next_id += 1
            handle = RequestHandle(rid, self.cancel, loop)
            req = LiveRequest(rid, prompt, params,
                              Detokenizer(self.codec, tuple(s for s in stop if s)), handle,
                              adapter=adapter)
            # FIFO: a newcomer never overtakes requests already waiting for a pipeline.
            if self._waiting or not self._try_dispatch(req):
                if not sibling:
                    self._check_queue()   # QueueFull past the bound (coordinator.membership)
                self._waiting.append(req)
            self._live[rid] = req
        return handle

    def cancel(self, request_id: int) -> None:
        """Abort a request: free its reservation and its KV on every stage."""
        with self._lock:
            req = self._live.get(self._alias.get(request_id, request_id))
            if req is None or req.done:
                return
            if req in self._waiting:
                self._waiting.remove(req)
            self._end(req, "abort", release_stages=True)

    def _try_dispatch(self, req: LiveRequest, pipeline=None) -> bool:
        """Reserve a pipeline for ``req`` (or take ``pipeline``, reserved for it already) and send it
        to the first stage; False when every pipeline is masked. A send that raises undoes the
        reservation, then re-raises."""
        ids, params = req.dispatch_token_ids(), req.dispatch_params()
        pipeline = pipeline or self._schedule(req, len(ids), params.max_tokens)
        if pipeline is None:
            return False
        try:
            route = Route(tuple(Hop(s.node, s.start) for s in pipeline.stages))
            first = pipeline.stages[0]
            new = NewRequest(req.request_id, len(ids), params, ids, enter_layer=first.start,
                             adapter=req.adapter)
            item = StageInput(req.request_id, 0, token_ids=ids, new_request=new)
            self.data.send(first.node, InputBatch((WireInput(item, route),)))
        except BaseException:
            self.scheduler.release(req.request_id)
            raise
        req.pipeline = pipeline
        req.dispatched_s = req.dispatched_s or time.perf_counter()
        self.pipeline_counts[pipeline.nodes] += 1
        return True

    def _schedule(self, req: LiveRequest, num_tokens: int, max_tokens: int):
        """A pipeline reserved for ``req`` under its current id (``num_tokens`` to prefill, at most
        ``max_tokens`` to generate), or None when every one is masked."""
        # KV for the expected output, not for max_tokens (which may be the whole context).
        info = RequestInfo(req.request_id, num_tokens, self.output_length.reservation(max_tokens))
        return self.scheduler.schedule(info, self.task_nodes(req.adapter))

    def _admit_waiting(self) -> None:
        """Dispatch waiting requests, oldest first, while a pipeline has room (under the lock).

        A head that no serving pipeline could ever hold (its nodes drained since it was queued), or
        whose dispatch raised, is ended with an error rather than left blocking everyone behind it."""
        while self._waiting:
            req = self._waiting[0]
            # No pipeline of the nodes taking requests holds it now (some drain): the client may
            # retry (503 with Retry-After), as when no pipeline is left; a bug is a 500.
            retry_after_s: int | None = self.config.retry_after_s
            try:
                if self._try_dispatch(req):
                    self._waiting.popleft()
                    continue
                error = self._never_fits(req)
            except Exception as exc:   # a bug: the request fails, the queue moves on
                log.exception("coordinator: dispatching request %d failed", req.request_id)
                error = f"internal error while dispatching the request: {type(exc).__name__}: {exc}"
                retry_after_s = None
            if error is None:   # masked for now: it waits (FIFO) until a request ends or usage drops
                self._admit_other_tasks()   # (with tasks placed, other tasks' requests may pass)
                return
            self._waiting.popleft()
            self._finish(req, "error", release_stages=False, error=error, retry_after_s=retry_after_s)

    def _never_fits(self, req: LiveRequest) -> str | None:
        """Why no pipeline of nodes that still take requests can ever hold ``req``, or None (always
        None while a plan is applied: its nodes come back with their new slices)."""
        if self.reshaping:
            return None
        draining = frozenset(self.draining_nodes())
        room = self._max_kv_tokens(draining)
        total = len(req.prompt_token_ids) + req.params.max_tokens
        if total <= room:
            return None
        why = f" (node(s) {sorted(draining)} are draining)" if draining else ""
        return (f"no pipeline that takes requests can hold this request's KV cache ({total} "
                f"tokens){why}; the largest holds {room}")

    def _max_kv_tokens(self, exclude: frozenset[str] = frozenset()) -> int:
        """:func:`~coordinator.requests.max_kv_tokens` of the pipelines avoiding ``exclude``."""
        cached = self._kv_tokens.get(exclude)
        if cached is None:
            kv = self.scheduler.kv
            limits = {p.node: (kv.high_water * kv.capacity(p.node), p.end - p.start)
                      for p in self.plan.placements if p.node not in exclude}
            cached = self._kv_tokens[exclude] = max_kv_tokens(
                self.scheduler.fallback or self.scheduler.topology, limits)
        return cached

    def _end(self, req: LiveRequest, reason: str, release_stages: bool, error: str | None = None,
             user_error: bool = False, stop_reason: str | int | None = None) -> None:
        """Finish ``req`` (under the lock), then admit waiting requests."""
        self._finish(req, reason, release_stages, error, user_error=user_error, stop_reason=stop_reason)
        self._admit_waiting()

    def _finish(self, req: LiveRequest, reason: str, release_stages: bool, error: str | None = None,
                retry_after_s: int | None = None, user_error: bool = False,
                stop_reason: str | int | None = None) -> None:
        """Finish ``req`` (under the lock): release KV, tell the caller (``stop_reason``:
        :attr:`Done.stop_reason`)."""
        req.done = True
        if reason in ("stop", "length"):
            self.output_length.observe(req.num_output_tokens)
            self.waiting_bound.completed(time.monotonic())
        self._live.pop(req.request_id, None)
        self._alias.pop(req.handle.request_id, None)
        if req.pipeline is not None:
            self.scheduler.release(req.request_id)
        req.handle.push(Done(reason, len(req.prompt_token_ids), req.num_output_tokens, error,
                             retry_after_s, user_error, stop_reason))
        if req.pipeline is not None and release_stages:
            for node in dict.fromkeys(req.pipeline.nodes):
                try:   # one stage we cannot reach must not keep the others' KV
                    self.data.send(node, Release((req.request_id,)))
                except Exception:
                    log.exception("coordinator: releasing request %r on %s failed", req.request_id, node)
        if self.observer is not None:
            now = time.perf_counter()
            self.observer.finished(reason, now - req.arrival_s, (req.dispatched_s or now) - req.arrival_s,
                                   len(req.prompt_token_ids), req.num_output_tokens,
                                   req.first_token_s is not None)

    @property
    def num_running(self) -> int:
        with self._lock:
            return len(self._live) - len(self._waiting)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def requests_by_pipeline(self) -> Counter[tuple[str, ...]]:
        """How many requests hold each pipeline now (by its nodes in order)."""
        with self._lock:
            return Counter(r.pipeline.nodes for r in self._live.values()
                           if not r.done and r.pipeline is not None)

    def pipeline_tokens(self) -> dict[tuple[str, ...], int]:
        """A copy of :attr:`tokens_by_pipeline`."""
        with self._lock:
            return dict(self.tokens_by_pipeline)

    def kv_usage_fraction(self) -> dict[str, float]:
        return {n: (s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else 0.0)
                for n, s in self.stats.items()}

    def close(self, shutdown_workers: bool = False) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2.0)
        for client in self.clients.values():
            if shutdown_workers:
                try:
                    client.call("Shutdown", timeout_s=2.0)
                except ControlError:
                    pass
            client.close()
        if self._poll_pool is not None:
            self._poll_pool.shutdown(wait=False, cancel_futures=True)
        self.data.close()
