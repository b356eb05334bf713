"""The event loop, and the coordinator and worker logic it dispatches each event type to.

Request life: arrival (or, offline, pulled from the workload whenever KV allows) -> the scheduler
gives it a pipeline -> token ids go to stage 0 -> each stage's step policy runs its tokens (prefill
chunks, then one token per decode step) and forwards the hidden states of new positions to the next
stage -> the last stage samples a token and sends it to the coordinator -> the coordinator streams it
and feeds it back to stage 0 -> ... -> the last token frees the request's KV on every stage.

Memory stays bounded: the heap holds only pending events, finished requests are dropped (their
numbers live on in :class:`~helix.sim.metrics.MetricsCollector`'s flat arrays).
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from coordinator.pipeline import Pipeline, RequestInfo
from coordinator.schedulers import Scheduler
from coordinator.task_placement import TaskPlacement
from coordinator.kv_estimator import KVEstimator
from helix.core.plan import COORDINATOR, Plan
from helix.core.serving import UNCHUNKED_STEP_TOKENS
from helix.sim.elastic import ElasticHandlers, NodeDrain, NodeJoin
from helix.sim.replan import ReplanConfig
from helix.sim.events import (NO_EVENTS, CoordinatorSchedule, DrainStart, Event, LinkWake, NodeDetected,
                              NodeDown, NodeJoins, NodeUp, RequestArrival, RequestFinish, StepFinish,
                              StepStart, TransferFinish)
from helix.sim.failures import FailureHandlers, NodeFailure
from helix.sim.hop import CoordinatorHop
from helix.sim.metrics import (LatencyStats, MetricsCollector, SimResult, steady_decode_tokens_per_s,
                               steady_window_start_s)
from helix.sim.network import Network
from helix.sim.request import SimRequest
from helix.sim.tasks import TaskMix, TaskRouting
from helix.sim.worker import SimWorker
from helix.sim.workload import TraceRequest

MODES = ("offline", "online")

#: A message's items are ``(request id, tokens, request, stage index, epoch)``: the inputs of
#: ``tokens`` more positions for that stage, or (to the coordinator) one sampled token; ``epoch``
#: is the request's when it was sent (an item of an older epoch is stale).
_NUM_TOKENS = operator.itemgetter(1)

#: Tests set this to verify that every skipped schedule() would indeed have found nothing to do.
CHECK_SKIPPED_STEPS = False


@dataclass(frozen=True)
class SimConfig:
    """How to run a simulation."""

    mode: str = "offline"
    """``offline``: keep the cluster saturated (admit whenever KV allows, arrival times ignored);
    ``online``: requests arrive at the workload's times and queue at the coordinator."""
    duration_s: float | None = 600.0
    """Simulated seconds; None runs until every request of the workload has finished."""
    chunk_tokens: int | None = None
    """Chunked-prefill token budget per step; 0 = whole prompts (no chunking); None = the spec's
    ``serving.chunk_tokens``, what ``helix serve``'s workers run with."""
    max_batched_tokens_unchunked: int = UNCHUNKED_STEP_TOKENS
    """Step token budget when chunking is off (a longer prompt still runs, alone)."""
    kv_high_water: float | None = None
    """Overrides the spec's ``serving.kv_high_water`` (the coordinator's KV masking) when set.
    Batch size, block size and KV pools always come from the spec (``serving:``), as in
    ``helix serve``."""
    expected_output_tokens: float | None = None
    """Output length the coordinator reserves KV for; None = the workload's mean."""
    seed: int = 0
    link_sharing: str = "fifo"
    """``fifo``: a link sends one message at a time; ``fair``: its bandwidth is split equally among
    the messages in flight (see :mod:`helix.sim.network`)."""
    bucket_s: float = 1.0
    """Width of the throughput timeline's buckets."""
    label: str = ""
    record_events: bool = False
    """Keep ``(time_s, event type, subject)`` of every processed event in ``Simulator.event_log``
    (debugging; off by default so memory stays bounded)."""
    failures: tuple[NodeFailure, ...] = ()
    """Workers that go down during the run (``helix simulate --fail NODE@T[+DOWN]``)."""
    drains: tuple[NodeDrain, ...] = ()
    """Workers drained during the run (``helix simulate --drain NODE@T``)."""
    joins: tuple[NodeJoin, ...] = ()
    """Workers absent until they join during the run (``helix simulate --join NODE@T``)."""
    replan: ReplanConfig | None = None
    """Re-plan as nodes join and leave and the mix drifts (``helix simulate --replan``,
    :mod:`helix.sim.replan`); None: the plan stays."""
    tasks: TaskMix | None = None
    """Requests of many fine-tuned tasks (``helix simulate --tasks N``): steps pay their adapter
    terms, tasks are placed across pipelines (:mod:`helix.sim.tasks`); None: the base model only."""


class Simulator(FailureHandlers, ElasticHandlers, TaskRouting):
    """One run: workers with real step policies, a real scheduler, simulated links and clock."""

    hop: CoordinatorHop | None = None
    """The coordinator's measured cost per token (:mod:`helix.sim.hop`; set by
    ``build_simulator`` from the spec); None: free, the default."""

    sampler: Callable[[float], float] | None = None
    """Called with each sample time as the clock passes it, before that time's events run; returns
    the next sample time (:class:`helix.sim.live_frames.FrameRecorder` attaches itself). None: no
    samples, the default."""

    def __init__(self, config: SimConfig, workload: tuple[TraceRequest, ...], scheduler: Scheduler,
                 workers: Mapping[str, SimWorker], network: Network,
                 activation_bytes_per_token: int, token_id_bytes: int, *,
                 flow_plan: Plan | None = None,
                 remake: Callable[[Plan, KVEstimator], Scheduler] | None = None,
                 placement: TaskPlacement | None = None) -> None:
        """``activation_bytes_per_token``: one hidden state between stages; ``token_id_bytes``: one
        token id between the coordinator and a stage (``build_simulator`` takes both from the
        model, as the planner does, so link loads match the plan's arc capacities).
        ``flow_plan`` (the plan, with its flow graph's capacities) and ``remake`` (builds the
        scheduler for a plan): when both are given, drains and joins re-solve the max flow over
        the nodes that take requests, as the live coordinator does (:mod:`helix.sim.elastic`)."""
        if config.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {config.mode!r}")
        self.config = config
        self.workload = workload
        self.scheduler = scheduler
        self.workers = dict(workers)
        self.network = network
        self.activation_bytes_per_token = activation_bytes_per_token
        self.token_id_bytes = token_id_bytes
        self.metrics = MetricsCollector(config.bucket_s)
        mean_out = sum(r.output_tokens for r in workload) / max(1, len(workload))
        self.expected_output_tokens = round(config.expected_output_tokens or mean_out)
        self.now_s = 0.0
        self.queue: deque[SimRequest] = deque()
        self._next_index = 0
        self._schedule_pending = False
        self._observe_hops = scheduler.uses_hop_delays
        self._heap: list[tuple[float, int, Event]] = []
        self._seq = itertools.count()
        self._event_seq = 0   # the heap sequence number of the event being handled
        self._inboxes = False
        """Whether inputs reaching a busy worker wait in its inbox until its step ends (set by
        ``run``; see ``on_inputs_at_worker``)."""
        self.arrived = self.admitted = self.rejected = self.preemptions = self.events = 0
        self.active: dict[int, SimRequest] = {}
        """Requests with a pipeline (admitted, not finished), by id."""
        self.requests_moved = self.moved_prefill_tokens = 0
        unknown = sorted({f.node for f in config.failures} - set(self.workers))
        if unknown:
            raise ValueError(f"failures name unknown node(s) {unknown}")
        self.event_log: list[tuple[float, str, str]] | None = [] if config.record_events else None
        self._init_elastic(flow_plan, remake)
        self._init_tasks(placement)   # tasks across pipelines (helix.sim.tasks); None: no tasks
        self.handlers: dict[type[Event], Callable[..., Iterable[Event]]] = {
            RequestArrival: self.on_arrival, CoordinatorSchedule: self.on_coordinator_schedule,
            TransferFinish: self.on_transfer_finish, LinkWake: self.on_link_wake,
            StepStart: self.on_step_start, StepFinish: self.on_step_finish,
            RequestFinish: self.on_request_finish, NodeDown: self.on_node_down,
            NodeDetected: self.on_node_detected, NodeUp: self.on_node_up,
            DrainStart: self.on_drain_start, NodeJoins: self.on_node_joins}
        """The handler of each event type: it runs the event and returns the events it causes."""

    # --- loop ---------------------------------------------------------------------------------------
    def push(self, event: Event) -> None:
        heapq.heappush(self._heap, (event.time_s, next(self._seq), event))

    def run(self) -> SimResult:
        """Run to ``duration_s`` (or until the workload is done) and summarize."""
        wall0 = time.perf_counter()
        if self.config.mode == "online":
            if self.workload:
                self.push(RequestArrival(self.workload[0].arrival_s, 0))
        else:
            self.push(CoordinatorSchedule(0.0))
        for f in self.config.failures:
            self.push(NodeDown(f.at_s, self.workers[f.node], f.detect_s, f.down_for_s))
        for ev in self._elastic_events():
            self.push(ev)
        heap, pop, push, seq, handlers = (self._heap, heapq.heappop, heapq.heappush, self._seq,
                                          self.handlers)
        until = self.config.duration_s
        config = self.config
        # Inboxes hold inputs back from everything that could look at a busy worker's requests
        # before its step ends: samples, event logs, and the handlers of failures and elastic events.
        self._inboxes = self.sampler is None and self.event_log is None and not (
            config.failures or config.drains or config.joins or config.replan)
        events = 0
        sample_s = math.inf if self.sampler is None else 0.0   # the next sample time
        while heap:
            if until is not None and heap[0][0] > until:
                break
            t, self._event_seq, event = pop(heap)
            while t >= sample_s:
                sample_s = self.sampler(sample_s)
            self.now_s = t
            events += 1
            if self.event_log is not None:
                self.event_log.append((t, type(event).__name__, event.subject()))
            for new in handlers[event.__class__](event):
                push(heap, (new.time_s, next(seq), new))
        self.events = events
        end_s = until if (until is not None and heap) else self.now_s
        while end_s >= sample_s:
            sample_s = self.sampler(sample_s)
        return self._result(end_s, time.perf_counter() - wall0)

    # --- coordinator --------------------------------------------------------------------------------
    def _kick_coordinator(self, now_s: float) -> Iterable[Event]:
        if self._schedule_pending:
            return NO_EVENTS
        self._schedule_pending = True
        return (CoordinatorSchedule(now_s),)

    def on_arrival(self, ev: RequestArrival) -> Iterable[Event]:
        now_s, index = ev.time_s, ev.index
        r = self.workload[index]
        self.queue.append(SimRequest(index, now_s, r.prompt_tokens, r.output_tokens, r.task))
        self.arrived += 1
        if self.hop is not None:   # the coordinator handles it first (helix.sim.hop)
            self.hop.arrive(index, now_s)
        out = list(self._kick_coordinator(now_s))
        if index + 1 < len(self.workload):
            out.append(RequestArrival(self.workload[index + 1].arrival_s, index + 1))
        return out

    def _pull_offline(self, now_s: float) -> bool:
        """Offline: the workload's next request joins the queue now, through the coordinator's
        hop as an arrival does (False: online, or none left)."""
        if self.config.mode != "offline" or self._next_index >= len(self.workload):
            return False
        r = self.workload[self._next_index]
        self.queue.append(SimRequest(self._next_index, now_s, r.prompt_tokens, r.output_tokens,
                                     r.task))
        if self.hop is not None:
            self.hop.arrive(self._next_index, now_s)
        self._next_index += 1
        self.arrived += 1
        return True

    def _next_waiting(self, now_s: float) -> SimRequest | None:
        if not self.queue:
            self._pull_offline(now_s)
        return self.queue[0] if self.queue else None

    def _handled_at(self, req: SimRequest, now_s: float) -> float | None:
        """When the coordinator's hop is done with ``req``, if later than now: the schedule is
        then called again at that time (``None``: it may be scheduled now)."""
        if self.hop is None or (ready_s := self.hop.ready_s(req.request_id, now_s)) is None:
            return None
        self._schedule_pending = True
        return ready_s

    def on_coordinator_schedule(self, ev: CoordinatorSchedule) -> Iterable[Event]:
        """Admit waiting requests in FIFO order until one fits nowhere (it keeps waiting)."""
        now_s = ev.time_s
        if self.placement is not None:   # tasks placed across pipelines (helix.sim.tasks)
            return self._schedule_tasks(now_s)
        self._schedule_pending = False
        out: list[Event] = []
        while (req := self._next_waiting(now_s)) is not None:
            if (ready_s := self._handled_at(req, now_s)) is not None:
                out.append(CoordinatorSchedule(ready_s))   # the coordinator is still handling it
                break
            info = RequestInfo(req.request_id, req.prompt_tokens, self.expected_output_tokens)
            pipeline = self.scheduler.schedule(info)
            if pipeline is None:
                if self.scheduler.num_admitted == 0 and not self.absent:
                    self._reject(req)  # masked on an empty cluster: it can never fit
                    continue
                break
            if not self._fits_workers(req, pipeline):
                self.scheduler.release(req.request_id)
                self._reject(req)
                continue
            self.queue.popleft()
            out.extend(self._start(now_s, req, pipeline))
        return out

    def _reject(self, req: SimRequest) -> None:
        self.queue.popleft()
        self.rejected += 1

    def _fits_workers(self, req: SimRequest, pipeline: Pipeline) -> bool:
        """The worker refuses a request that could never fit its whole KV pool (policy.add)."""
        need = req.prompt_tokens + req.output_tokens - req.received   # a moved one has streamed some
        return all(self.workers[s.node].kv_capacity_tokens >= need for s in pipeline.stages)

    def _start(self, now_s: float, req: SimRequest, pipeline: Pipeline) -> Iterable[Event]:
        req.pipeline = pipeline
        req.workers = tuple(self.workers[s.node] for s in pipeline.stages)
        req.sent_at_s = [now_s] * len(pipeline.stages)
        self.active[req.request_id] = req
        for w in req.workers:
            w.routed += 1
            w.last_routed_s = now_s
            if w.first_routed_s is None:
                w.first_routed_s = now_s
        if req.admitted_s is None:   # not a request that moved off a dead node
            req.admitted_s = now_s
            if self.config.mode == "offline":
                req.arrival_s = now_s  # offline latency counts from admission, not from time 0
            self.admitted += 1
            self.metrics.prompt_tokens_admitted += req.prompt_tokens
        first = req.workers[0]
        return self._send(now_s, COORDINATOR, first, req.prompt_tokens * self.token_id_bytes,
                          [(req.request_id, req.prompt_tokens, req, 0, req.epoch)])

    def on_transfer_finish(self, ev: TransferFinish) -> Iterable[Event]:
        if ev.dst is None:
            return self.on_tokens_at_coordinator(ev.time_s, ev.items)
        return self.on_inputs_at_worker(ev.time_s, ev.dst, ev.items)

    def on_tokens_at_coordinator(self, now_s: float, items: list) -> Iterable[Event]:
        """Sampled tokens arrive: stream them, finish requests, feed the rest back to stage 0."""
        out: list[Event] = []
        feeds: dict[SimWorker, list] = {}
        metrics, hop = self.metrics, self.hop
        for _, _, req, _, epoch in items:
            if req.finish_s is not None or epoch != req.epoch:
                continue   # finished, or sampled on a pipeline the request has left
            req.received += 1
            first = req.received == 1
            # The caller sees it once the coordinator served it (helix.sim.hop; None: at once).
            seen_s = now_s if hop is None else hop.deliver(now_s, self.workers.values())
            metrics.on_token(seen_s, first, req.arrival_s if first else req.last_token_s)
            if first:
                req.first_token_s = seen_s
            req.last_token_s = seen_s
            if req.received >= req.output_tokens:
                out.append(RequestFinish(now_s, req))
            else:
                feeds.setdefault(req.workers[0], []).append((req.request_id, 1, req, 0, req.epoch))
        for w, its in feeds.items():
            for item in its:
                item[2].sent_at_s[0] = now_s
            out.extend(self._send(now_s, COORDINATOR, w, len(its) * self.token_id_bytes, its))
        return out

    def on_request_finish(self, ev: RequestFinish) -> Iterable[Event]:
        now_s, req = ev.time_s, ev.request
        req.finish_s = now_s
        self.active.pop(req.request_id, None)
        out: list[Event] = []
        for w in req.workers:
            w.drop(req.request_id)
            w.maybe_ready = True
            # Freed KV may unblock a request waiting in this worker's queue.
            if not w.busy and not w.start_pending and w.policy.has_work():
                w.start_pending = True
                out.append(StepStart(now_s, w))
        self.scheduler.release(req.request_id)
        self.metrics.on_finish(req.output_tokens, req.received, req.first_token_s, req.last_token_s)
        self.replan_observe(now_s, req)   # the mix the re-plan trigger watches
        req.workers = ()
        if self.draining:
            self.note_drained(now_s)
        out.extend(self._kick_coordinator(now_s))
        return out

    # --- network ------------------------------------------------------------------------------------
    def _send(self, now_s: float, src: str, dst: SimWorker | None, nbytes: float,
              items: list) -> Iterable[Event]:
        """Put a message on the link ``src -> dst`` (None = the coordinator)."""
        dst_name = COORDINATOR if dst is None else dst.name
        if self.network.sharing == "fifo":
            arrive_s = self.network.send(now_s, src, dst_name, nbytes)
            if dst is not None and dst.busy and arrive_s < dst.busy_until_s and self._inboxes:
                # It arrives during the step in progress: straight to the inbox, keyed by the time
                # and the sequence number its TransferFinish would have had (no event at all).
                dst.inbox.append((arrive_s, next(self._seq), items))
                return NO_EVENTS
            return (TransferFinish(arrive_s, dst, items),)
        link, wake_s = self.network.start_shared(now_s, src, dst_name, nbytes, (dst, items))
        return (LinkWake(wake_s, link, link.version),)

    def on_link_wake(self, ev: LinkWake) -> Iterable[Event]:
        now_s, link = ev.time_s, ev.link
        if link.version != ev.version:
            return NO_EVENTS   # the link changed since this wake-up was set
        done, wake_s = self.network.wake_shared(now_s, link)
        out: list[Event] = [TransferFinish(now_s + link.latency_s, dst, items) for dst, items in done]
        if wake_s is not None:
            out.append(LinkWake(wake_s, link, link.version))
        return out

    # --- workers ------------------------------------------------------------------------------------
    def on_inputs_at_worker(self, now_s: float, w: SimWorker, items: list) -> Iterable[Event]:
        if w.down:
            return NO_EVENTS   # lost with the node
        if w.busy and self._inboxes:
            # Nothing looks at a busy worker's requests before its step ends but the finish of a
            # request (which the feeding then skips, as it drops what it fed): feeding them all
            # then, in arrival order, ahead of the step's completion, gives the same state.
            w.inbox.append((now_s, self._event_seq, items))
            return NO_EVENTS
        self._feed(w, items)
        if w.busy or w.start_pending:
            return NO_EVENTS
        heap = self._heap
        if (heap and heap[0][0] <= now_s) or self.event_log is not None:
            # More may happen at this instant (other inputs): the step starts after it.
            w.start_pending = True
            return (StepStart(now_s, w),)
        # Nothing else is due at this instant, so a StepStart pushed now would be the next event
        # popped: start the step at once (same run, one event fewer; kept when events are logged).
        return self.start_step(now_s, w)

    def _feed(self, w: SimWorker, items: list) -> None:
        """Give ``w``'s policy the inputs of ``items`` (a new request is admitted)."""
        get = w.requests.get
        fed = []
        append = fed.append
        for rid, n, req, idx, epoch in items:
            entry = get(rid)
            if entry is not None:
                # Present: neither finished nor moved (both drop it), so the epoch of its entry
                # is the request's.
                if epoch == entry[4]:
                    append((rid, n))
            elif req.finish_s is None and epoch == req.epoch:
                w.admit(req, idx, req.pipeline.stages[idx].start, n)
        if fed:
            w.policy.feed_many(fed)
        w.maybe_ready = True

    def _empty_inbox(self, w: SimWorker) -> None:
        """Feed what reached ``w`` during its step, as if fed on arrival (it is, to any reader)."""
        inbox = w.inbox
        w.inbox = []
        if len(inbox) > 1:
            inbox.sort()   # by (arrival time, sequence number): unique, so items never compare
            items = [item for _, _, its in inbox for item in its]
        else:
            items = inbox[0][2]
        self._feed(w, items)

    def on_step_start(self, ev: StepStart) -> Iterable[Event]:
        ev.worker.start_pending = False
        return self.start_step(ev.time_s, ev.worker)

    def start_step(self, now_s: float, w: SimWorker) -> Iterable[Event]:
        if w.busy or w.down:
            return NO_EVENTS
        if not w.maybe_ready:
            if CHECK_SKIPPED_STEPS:
                skipped = w.policy.schedule()
                assert skipped.is_empty and not skipped.preempted_ids, (w.name, skipped)
            return NO_EVENTS
        policy = w.policy
        plan = policy.schedule()
        # Whether another schedule() could find work without new inputs or freed KV: a step that
        # hit a limit, an unfinished prompt, a preemption or a blocked queue. Otherwise skip the
        # policy's schedule() until inputs arrive (most steps of a pipeline stage end idle).
        config = policy.config
        chunks = plan.prefill_chunks
        num_seqs = len(plan.decode_ids) + len(chunks)
        w.maybe_ready = bool(plan.preempted_ids) or policy.num_waiting > 0 \
            or num_seqs >= config.max_num_seqs \
            or (num_seqs if not chunks else plan.num_tokens) >= config.max_num_batched_tokens \
            or any(not c.is_last for c in chunks)
        if plan.preempted_ids:
            w.num_preemptions += len(plan.preempted_ids)
            self.preemptions += len(plan.preempted_ids)
        if num_seqs == 0:
            return NO_EVENTS
        used = policy.blocks.num_used_blocks
        if used > w.peak_used_blocks:
            w.peak_used_blocks = used
        duration_s = w.step_time_s(plan)
        if self.hop is not None:   # CPU the coordinator took from this worker's core
            duration_s += self.hop.charge(w)
        w.busy = True
        w.busy_until_s = end_s = now_s + duration_s
        return (StepFinish(end_s, w, plan, duration_s, w.epoch),)

    def on_step_finish(self, ev: StepFinish) -> list[Event]:
        """Forward the hidden states of newly computed positions; the last stage samples."""
        w = ev.worker
        if ev.epoch != w.epoch:
            return []   # the worker went down during this step: it never finished
        now_s, plan = ev.time_s, ev.plan
        w.busy = False
        w.busy_s += ev.duration_s
        w.num_steps += 1
        if w.inbox:
            self._empty_inbox(w)
        w.policy.complete(plan)
        # Per destination (None: the coordinator), the items of its message, in first-seen order.
        outs: dict[SimWorker | None, list] = {}
        get = w.requests.get
        # Positions [.., end) of each request in the plan are now computed here. A decode's end is
        # past its prompt (the policy decodes only after the prompt), so only chunks are first passes.
        observe = self._observe_hops
        for rid, pos in zip(plan.decode_ids, plan.decode_positions):
            entry = get(rid)
            if entry is None:
                continue  # finished while this step ran
            req, idx, nxt, sent, epoch = entry
            if nxt is not None:
                if pos >= sent:  # a stage recomputing after preemption forwards nothing twice
                    entry[3] = end = pos + 1
                    if observe:
                        req.sent_at_s[idx + 1] = now_s
                    batch = outs.get(nxt)
                    if batch is None:
                        outs[nxt] = [(rid, end - sent, req, idx + 1, epoch)]
                    else:
                        batch.append((rid, end - sent, req, idx + 1, epoch))
            elif pos == req.prompt_tokens + req.generated - 1:
                req.generated += 1  # the last stage samples a new token from its newest position
                batch = outs.get(None)
                if batch is None:
                    outs[None] = [(rid, 1, req, idx, epoch)]
                else:
                    batch.append((rid, 1, req, idx, epoch))
        if plan.prefill_chunks:
            self._forward_chunks(now_s, w, plan.prefill_chunks, outs)
        out: list[Event] = []
        for dst, items in outs.items():
            if dst is None:
                nbytes = len(items) * self.token_id_bytes
            else:   # the hidden states the next stage gets
                nbytes = sum(map(_NUM_TOKENS, items)) * self.activation_bytes_per_token
            out.extend(self._send(now_s, w.name, dst, nbytes, items))
        out.extend(self.start_step(now_s, w))
        return out

    def _forward_chunks(self, now_s: float, w: SimWorker, chunks, outs: dict) -> None:
        """``on_step_finish`` for the prefill chunks of its step (after its decodes)."""
        requests = w.requests
        observe = self._observe_hops
        for c in chunks:
            entry = requests.get(c.request_id)
            if entry is None:
                continue  # finished while this step ran
            req, idx, nxt, sent, epoch = entry
            end = c.start + c.num_tokens
            if observe and end == req.prompt_tokens:   # its first pass: the prompt
                prev = COORDINATOR if idx == 0 else req.pipeline.stages[idx - 1].node
                self.scheduler.observe_hop(prev, w.name, now_s - req.sent_at_s[idx])
            if nxt is not None:
                if end > sent:  # a stage recomputing after preemption forwards nothing twice
                    entry[3] = end
                    if observe:
                        req.sent_at_s[idx + 1] = now_s
                    outs.setdefault(nxt, []).append((c.request_id, end - sent, req, idx + 1,
                                                     epoch))
            elif end == req.prompt_tokens + req.generated:
                req.generated += 1  # the last stage samples a new token from its newest position
                outs.setdefault(None, []).append((c.request_id, 1, req, idx, epoch))

    # --- summary ------------------------------------------------------------------------------------
    def _result(self, end_s: float, wall_s: float) -> SimResult:
        m = self.metrics
        span = end_s if end_s > 0 else 1.0
        links = {f"{a}->{b}": busy / span for (a, b), (busy, _) in self.network.link_stats().items()}
        timeline = tuple(c / m.bucket_s for c in m.tokens_per_bucket)
        # Saturated to the end: requests were still waiting for KV (none waiting: a drain).
        saturated = self.config.mode == "offline" and bool(
            self.queue or self._next_index < len(self.workload))
        steady = steady_decode_tokens_per_s(timeline, m.bucket_s, end_s) if saturated else None
        return SimResult(
            label=self.config.label, mode=self.config.mode, scheduler=self.scheduler.name,
            duration_s=end_s, decode_throughput_tokens_per_s=m.tokens_generated / span,
            steady_decode_throughput_tokens_per_s=steady,
            steady_from_s=None if steady is None else steady_window_start_s(end_s, m.bucket_s),
            requests_arrived=self.arrived, requests_admitted=self.admitted,
            requests_completed=m.requests_completed,
            requests_unfinished=self.arrived - m.requests_completed - self.rejected,
            requests_rejected=self.rejected, tokens_generated=m.tokens_generated,
            tokens_requested_completed=m.tokens_requested_completed,
            tokens_generated_completed=m.tokens_generated_completed, preemptions=self.preemptions,
            ttft=LatencyStats.of(m.ttft_s), inter_token_latency=LatencyStats.of(m.itl_s),
            request_decode_latency=LatencyStats.of(m.request_decode_s),
            node_utilization={n: w.busy_s / span for n, w in self.workers.items()},
            link_utilization=links, throughput_timeline_tokens_per_s=timeline, bucket_s=m.bucket_s,
            wall_s=wall_s, events=self.events, requests_moved=self.requests_moved,
            moved_prefill_tokens=self.moved_prefill_tokens, phases=self.phases(end_s),
            replans=tuple(self.replans),
            node_requests={n: w.routed for n, w in self.workers.items()},
            samples={"ttft_s": m.ttft_s, "itl_s": m.itl_s, "request_decode_s": m.request_decode_s})
