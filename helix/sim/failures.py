"""Node failures in the simulator, handled as the live coordinator handles them (see
``coordinator.membership``): a node goes down, is declared dead ``detect_s`` later, its requests move
to other pipelines from their prompt and streamed tokens, and it may come back empty.

A mixin of :class:`helix.sim.engine.Simulator` (its handlers for :class:`NodeDown`,
:class:`NodeDetected` and :class:`NodeUp`); :class:`NodeFailure` is what ``SimConfig.failures`` and
``helix simulate --fail`` describe.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from helix.sim.events import NO_EVENTS, Event, NodeDetected, NodeDown, NodeUp, StepStart

if TYPE_CHECKING:
    from helix.sim.request import SimRequest


@dataclass(frozen=True)
class NodeFailure:
    """``node`` goes down at ``at_s`` (its process dies or its link is cut) and, after
    ``down_for_s`` (None: never), comes back empty. The coordinator declares it dead ``detect_s``
    after it went down, as the live one does (two refused heartbeats: ~0.3 s; a frozen or cut-off
    node: ``dead_after_s``, 10 s by default), and moves its requests, as the live one does."""

    node: str
    at_s: float
    down_for_s: float | None = None
    detect_s: float = 0.3

    def __post_init__(self) -> None:
        if self.at_s < 0 or self.detect_s < 0 or (self.down_for_s is not None and self.down_for_s <= 0):
            raise ValueError(f"failure of {self.node}: times must be >= 0 (down time > 0)")


class FailureHandlers:
    """The simulator's handlers of node failures (a mixin of ``Simulator``)."""

    def on_node_down(self, ev: NodeDown) -> Iterable[Event]:
        w = ev.worker
        if w.down:
            return NO_EVENTS
        w.go_down()
        out: list[Event] = [NodeDetected(ev.time_s + ev.detect_s, w, w.epoch)]
        if ev.down_for_s is not None:
            out.append(NodeUp(ev.time_s + ev.down_for_s, w))
        return out

    def on_node_detected(self, ev: NodeDetected) -> Iterable[Event]:
        """As the live coordinator on a dead node: mask it (it reads full) and move its requests.
        Stale when it belongs to an earlier outage, or this outage was handled already (the node
        came back first)."""
        w = ev.worker
        if ev.epoch != w.epoch or w.detected_epoch == ev.epoch:
            return NO_EVENTS
        self.scheduler.kv.observe(w.name, 2 * self.scheduler.kv.capacity(w.name))
        return self._move_off(w, ev.time_s)

    def _move_off(self, w, now_s: float) -> list[Event]:
        """Move every request whose pipeline crossed ``w``'s outage: freed on the other stages, then
        queued first to prefill its prompt and the tokens already streamed on another pipeline (what
        was sampled but not yet delivered is generated again)."""
        w.detected_epoch = w.epoch
        moving = [r for r in self.active.values() if w in r.workers]
        for req in reversed(moving):   # appendleft: the oldest ends up first
            for x in req.workers:
                x.drop(req.request_id)
                x.maybe_ready = True
            self.scheduler.release(req.request_id)
            del self.active[req.request_id]
            req.prompt_tokens = self._prompt_of(req) + req.received
            req.generated = 0
            req.epoch += 1
            req.moves += 1
            req.pipeline, req.workers = None, ()
            self.requests_moved += 1
            self.moved_prefill_tokens += req.prompt_tokens
            self.queue.appendleft(req)
        out = list(self._kick_coordinator(now_s))
        for x in self.workers.values():   # dropped requests freed KV that may unblock others
            if not x.down and not x.busy and not x.start_pending and x.policy.has_work():
                x.start_pending = True
                out.append(StepStart(now_s, x))
        if self.draining:
            self.note_drained(now_s)
        return out

    def _prompt_of(self, req: SimRequest) -> int:
        """The request's original prompt length (its workload entry)."""
        return self.workload[req.request_id].prompt_tokens

    def on_node_up(self, ev: NodeUp) -> Iterable[Event]:
        """The node answers again, empty. If nobody noticed it was gone, it is noticed now (as a
        restarted worker's registration makes the live coordinator move the node's requests)."""
        w = ev.worker
        if not w.down:
            return NO_EVENTS
        w.down = False
        out = self._move_off(w, ev.time_s) if w.detected_epoch != w.epoch else []
        if self.takes_requests(w.name):   # a draining or not yet joined node stays masked
            self.scheduler.kv.observe(w.name, 0.0)
        out.extend(self._kick_coordinator(ev.time_s))
        return out
