"""Tokens and failures from the last stages: the data-plane receive loop, each token streamed to
its caller (detokenized, stop strings, the finish), a stage's refusal ending its request.

A mixin of :class:`coordinator.runtime.Coordinator` (it reads and writes the coordinator's state
under the coordinator's lock)."""

from __future__ import annotations

import logging
import time

from coordinator.requests import Delta, LiveRequest
from helix.core.errors import USER_FAILURE
from helix.net.wire import Failures, TokenBatch, TokenEvent, WireError

log = logging.getLogger("helix.coordinator")


class Streaming:
    """What arrives on the coordinator's data plane (the loop runs in its own thread)."""

    def _receive_loop(self) -> None:
        """Tokens and failures from the stages. A message that does not decode, or whose handling
        raises, is logged and dropped: the loop (every request's output) must outlive it."""
        while not self._stop.is_set():
            try:
                msg = self.data.recv(0.05)
            except WireError as exc:
                log.warning("coordinator: dropped a bad data-plane message: %s", exc)
                continue
            except Exception:   # not the message (a socket error?): do not spin on it
                log.exception("coordinator: data-plane receive failed")
                self._stop.wait(0.05)
                continue
            try:
                self._on_message(msg)
            except Exception:
                log.exception("coordinator: handling %s failed", type(msg).__name__)
            try:
                self.check_stalls()   # pipelines that stopped sending: no new requests there
            except Exception:
                log.exception("coordinator: stall check failed")

    def _on_message(self, msg) -> None:
        if isinstance(msg, TokenBatch):
            with self._lock:
                for ev in msg.tokens:
                    try:   # one bad event must not drop the rest of the batch
                        self._on_token(ev)
                    except Exception as exc:
                        log.exception("coordinator: token for request %r failed", ev.request_id)
                        req = self._live.get(ev.request_id)
                        if req is not None and not req.done:
                            self._end(req, "error", release_stages=True,
                                      error=f"internal error handling a token: {exc!r}")
        elif isinstance(msg, Failures):
            with self._lock:
                for f in msg.failures:
                    req = self._live.get(f.request_id)
                    if req is not None and not req.done:   # a stage dropped it: free it everywhere
                        user = f.message.startswith(USER_FAILURE)   # refused as bad input
                        error = f"{f.message[len(USER_FAILURE):]} (refused by worker {f.node})" \
                            if user else f"request failed on worker {f.node}: {f.message}"
                        self._end(req, "error", release_stages=True, error=error, user_error=user)
        elif msg is not None:
            log.warning("coordinator: unexpected %s on the data plane", type(msg).__name__)

    def _on_token(self, ev: TokenEvent) -> None:
        req = self._live.get(ev.request_id)
        if req is None or req.done:
            return   # cancelled while the token was in flight
        now = time.perf_counter()
        if self.observer is not None:
            if req.first_token_s is None:
                self.observer.first_token(now - req.arrival_s)
            else:
                self.observer.next_token(now - req.last_token_s)
        req.first_token_s = req.first_token_s or now
        req.last_token_s = now
        if req.pipeline is not None:
            self.stalls.output(req.pipeline.nodes, now)
            self.tokens_by_pipeline[req.pipeline.nodes] += 1
        req.num_output_tokens += 1
        req.output_token_ids.append(ev.token.token_id)
        text = req.detok.add(ev.token.token_id, final=ev.finish_reason is not None)
        req.handle.push(Delta((ev.token.token_id,), text, (ev.token,), ev.prompt_logprobs))
        if req.detok.stopped:
            # A stop string ends it as "stop" even on the token that also hit a limit (as vLLM).
            self._end(req, "stop", release_stages=ev.finish_reason is None,
                      stop_reason=req.detok.stop_string)
        elif ev.finish_reason is not None:
            self._end(req, ev.finish_reason, release_stages=False,
                      stop_reason=self._stop_token(req, ev) if ev.finish_reason == "stop" else None)

    def _stop_token(self, req: LiveRequest, ev: TokenEvent) -> int | None:
        """The ``stop_token_ids`` id that ended ``req``; None when it was EOS (checked first, as in
        vLLM) or the structured reply's end."""
        p, token_id = req.params, ev.token.token_id
        if not p.ignore_eos and token_id in self.codec.eos_token_ids:
            return None
        return token_id if token_id in p.stop_token_ids else None
