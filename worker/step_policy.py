"""Iteration-level step scheduling for one worker (pure: no torch, no clock, deterministic).

This is the Orca / Sarathi policy that decides, before every model step, which tokens of which requests
run. The live engine (:mod:`worker.engine`) and the simulator drive the very same object; only the clock
that surrounds it differs.

How to drive it::

    from worker.kv_blocks import KVBlockManager
    from worker.step_policy import StepPolicy, PolicyConfig

    policy = StepPolicy(PolicyConfig(max_num_seqs=64, max_num_batched_tokens=512),
                        KVBlockManager(num_blocks=1000, block_size_tokens=16))
    policy.add("r1", num_prompt_tokens=300, max_new_tokens=50)   # joins at the next schedule()
    while policy.has_work():
        plan = policy.schedule()          # StepPlan: decode ids, prefill chunks, preempted ids
        ...run the model on plan (simulator: advance time by the step's cost)...
        policy.complete(plan, finished_ids=[...])   # finished requests leave at once

Token model. Per request the policy counts three numbers:
``num_available`` tokens whose *inputs* are present at this worker (token ids on the first stage, hidden
states on later ones), ``num_computed`` tokens whose KV is in the cache, and ``num_prompt_tokens``, the end
of its prefill phase. A request is *prefilling* while ``num_computed < num_prompt_tokens`` and *decoding*
after. It is *ready* when ``num_available > num_computed``.

- ``self_feeding=True`` (default; a whole-model worker, or a test): after a step that computed all of a
  request's available tokens, the sampled token becomes available at once (``num_available += 1``).
- ``self_feeding=False`` (a pipeline stage): inputs arrive from elsewhere; call ``feed(rid, n)`` when
  ``n`` more tokens' inputs arrive (a prefill chunk from upstream, or the next decode token). ``add`` may
  then pass ``num_available_tokens`` < prompt length.

One step (``schedule``):
1. *Decode-maximal*: every ready decoding request, oldest admission first, gets its one token, while the
   step has room (``max_num_seqs``, ``max_num_batched_tokens``).
2. *Chunked prefill*: then prefill chunks, first come first served: already running (partly prefilled)
   requests first, then waiting ones in arrival order. With chunking on, a chunk is as long as the
   remaining token budget (and the free KV) allows; with chunking off a prompt runs whole, and a
   prompt longer than the budget may run only as the first prefill of a step. FCFS is strict: when the
   head of the waiting queue cannot be admitted, nobody behind it is.
3. *Preemption*: when a running request cannot get a KV block, the newest running request not yet in
   this step is preempted (its blocks freed; it returns to the head of the waiting queue and later
   recomputes all its available tokens as a new prefill). The victim may be the request itself.

Admission (``add``) raises :class:`helix.errors.HelixUserError` when ``num_prompt_tokens +
max_new_tokens`` exceeds the KV capacity of the whole pool: such a request could never finish.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from helix.errors import HelixUserError
from helix.serving import ServingSpec
from worker.kv_blocks import KVBlockManager


@dataclass(frozen=True)
class PolicyConfig:
    """Limits of one step."""

    max_num_seqs: int = ServingSpec().max_batch_seqs
    """Most requests in one step (decodes + prefill chunks): the plan's ``max_batch_seqs``."""
    max_num_batched_tokens: int = 512
    """Token budget of one step (decode tokens + prefill chunk tokens)."""
    chunked_prefill: bool = True
    """Cut prompts into chunks that fill the budget (Sarathi); False = whole prompts only (Orca)."""
    self_feeding: bool = True
    """After a request's last available token is computed, its next token is available at once."""

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_seqs and max_num_batched_tokens must be >= 1, got "
                             f"{self.max_num_seqs}, {self.max_num_batched_tokens}")


@dataclass(frozen=True)
class PrefillChunk:
    """Positions ``[start, start + num_tokens)`` of ``request_id`` run as prefill in this step."""

    request_id: Hashable
    start: int
    num_tokens: int
    is_last: bool
    """True when this chunk completes the prefill phase: the last stage samples the next token from
    its final position (a later stage still needs the hidden states of every position)."""

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


@dataclass(frozen=True)
class StepPlan:
    """What one step runs. Decodes run position ``decode_positions[i]`` of ``decode_ids[i]``."""

    decode_ids: tuple[Hashable, ...] = ()
    decode_positions: tuple[int, ...] = ()
    prefill_chunks: tuple[PrefillChunk, ...] = ()
    preempted_ids: tuple[Hashable, ...] = ()
    """Requests whose KV was dropped before this step; they will recompute from position 0."""

    @property
    def num_tokens(self) -> int:
        return len(self.decode_ids) + sum(c.num_tokens for c in self.prefill_chunks)

    @property
    def num_seqs(self) -> int:
        return len(self.decode_ids) + len(self.prefill_chunks)

    @property
    def is_empty(self) -> bool:
        return self.num_seqs == 0


@dataclass
class _Req:
    request_id: Hashable
    num_prompt_tokens: int
    max_total_tokens: int
    num_available: int
    num_computed: int = 0
    num_preemptions: int = 0

    @property
    def decoding(self) -> bool:
        return self.num_computed >= self.num_prompt_tokens

    @property
    def pending(self) -> int:
        return self.num_available - self.num_computed


class StepPolicy:
    """Iteration-level scheduler over a :class:`KVBlockManager` (see the module docstring)."""

    def __init__(self, config: PolicyConfig, blocks: KVBlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self._reqs: dict[Hashable, _Req] = {}
        self._waiting: list[Hashable] = []   # FCFS; preempted requests go back to the front
        self._running: list[Hashable] = []   # admission order (oldest first)
        self.num_preemptions_total = 0

    # --- requests in and out -------------------------------------------------------------------
    def add(self, request_id: Hashable, num_prompt_tokens: int, max_new_tokens: int = 0,
            num_available_tokens: int | None = None) -> None:
        """Queue a request; it can run from the next ``schedule()`` on."""
        if request_id in self._reqs:
            raise ValueError(f"request {request_id!r} is already queued")
        if num_prompt_tokens < 1:
            raise HelixUserError(f"request {request_id!r}: empty prompt")
        total = num_prompt_tokens + max_new_tokens
        cap = self.blocks.capacity_tokens
        if total > cap:
            raise HelixUserError(
                f"request {request_id!r} needs KV for {total} tokens (prompt {num_prompt_tokens} + "
                f"max_new_tokens {max_new_tokens}) but this worker holds at most {cap} tokens "
                f"({self.blocks.num_blocks} blocks x {self.blocks.block_size_tokens})")
        avail = num_prompt_tokens if num_available_tokens is None else num_available_tokens
        self._reqs[request_id] = _Req(request_id, num_prompt_tokens, total, avail)
        self._waiting.append(request_id)

    def feed(self, request_id: Hashable, num_tokens: int = 1) -> None:
        """``num_tokens`` more inputs of ``request_id`` arrived (for ``self_feeding=False``)."""
        self._reqs[request_id].num_available += num_tokens

    def finish(self, request_id: Hashable) -> None:
        """Drop a request now (finished or aborted) and free its KV."""
        if request_id not in self._reqs:
            return
        del self._reqs[request_id]
        if request_id in self._running:
            self._running.remove(request_id)
        if request_id in self._waiting:
            self._waiting.remove(request_id)
        self.blocks.free(request_id)

    # --- the step ------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Pick the work of the next step (see the module docstring for the rules)."""
        step = _StepBuilder(self.config)
        preempted: list[Hashable] = []
        # One pass splits running requests into ready decodes and prefills (same order and result
        # as filtering twice; a request only changes class here by being preempted, and preempted
        # ones are skipped below). Pipeline stages hold many requests that are not ready, and the
        # simulator calls this for every step of every node, so the scan is kept cheap.
        reqs = self._reqs
        ready_decodes: list[Hashable] = []
        prefilling: list[Hashable] = []
        for r in self._running:
            q = reqs[r]
            if q.num_computed >= q.num_prompt_tokens:
                if q.num_available > q.num_computed:
                    ready_decodes.append(r)
            else:
                prefilling.append(r)
        for rid in ready_decodes:
            if rid in preempted or not step.room_for(1):
                continue
            req = reqs[rid]
            if self._grow(rid, req.num_computed + 1, step, preempted):
                step.decode(rid, req.num_computed)
        for rid in prefilling:
            if rid not in preempted:
                self._schedule_prefill(rid, step, preempted, running=True)
        while self._waiting and step.room_for(1):
            rid = self._waiting[0]
            if rid in preempted:
                break  # just preempted: it must not take back the blocks it gave up in this step
            if not self._schedule_prefill(rid, step, preempted, running=False):
                break  # strict FCFS: nobody overtakes the head of the queue
            self._waiting.pop(0)
            self._running.append(rid)
        return StepPlan(tuple(step.decode_ids), tuple(step.decode_positions), tuple(step.chunks),
                        tuple(preempted))

    def complete(self, plan: StepPlan, finished_ids: Iterable[Hashable] = ()) -> None:
        """Record that ``plan`` ran; ``finished_ids`` leave at once and free their KV."""
        for rid, pos in zip(plan.decode_ids, plan.decode_positions):
            if rid in self._reqs:
                self._reqs[rid].num_computed = pos + 1
        for chunk in plan.prefill_chunks:
            if chunk.request_id in self._reqs:
                self._reqs[chunk.request_id].num_computed = chunk.end
        for rid in finished_ids:
            self.finish(rid)
        if self.config.self_feeding:
            touched = {*plan.decode_ids, *(c.request_id for c in plan.prefill_chunks)}
            for rid in touched:
                req = self._reqs.get(rid)
                if req is not None and req.pending == 0:
                    req.num_available += 1

    # --- helpers --------------------------------------------------------------------------------
    def _schedule_prefill(self, rid: Hashable, step: "_StepBuilder", preempted: list[Hashable],
                          running: bool) -> bool:
        """Add a prefill chunk of ``rid`` to ``step`` if possible; True when one was added."""
        req = self._reqs[rid]
        want = req.pending
        if want < 1 or not step.room_for(1):
            return False
        if self.config.chunked_prefill:
            want = min(want, step.tokens_left)
            # Shrink the chunk to the KV that is free rather than preempting someone for it.
            fit = self.blocks.capacity_of(rid) + self.blocks.num_free_blocks * \
                self.blocks.block_size_tokens - req.num_computed
            if running is False or fit >= 1:
                want = min(want, max(fit, 0))
            if want < 1 and not running:
                return False
        elif want > step.tokens_left and step.chunks:
            return False  # whole prompts only; an oversized prompt may run only as the first prefill
        want = max(want, 1)
        if running:
            if not self._grow(rid, req.num_computed + want, step, preempted):
                return False
        elif not self.blocks.can_allocate(rid, req.num_computed + want):
            return False
        else:
            self.blocks.allocate(rid, req.num_computed + want)
        end = req.num_computed + want
        step.prefill(PrefillChunk(rid, req.num_computed, want,
                                 is_last=end == req.num_available and end >= req.num_prompt_tokens))
        return True

    def _grow(self, rid: Hashable, num_tokens: int, step: "_StepBuilder",
              preempted: list[Hashable]) -> bool:
        """Make ``rid``'s table cover ``num_tokens``, preempting the newest running requests not in
        this step as needed. False if ``rid`` itself had to be preempted."""
        if self.blocks.capacity_of(rid) >= num_tokens:
            return True  # already covered (most decode steps): skip the allocator (simulator speed)
        while not self.blocks.can_allocate(rid, num_tokens):
            victims = [r for r in self._running if r not in step.scheduled]
            victim = victims[-1]  # rid itself is in victims, so the list is never empty
            self._preempt(victim)
            preempted.append(victim)
            if victim == rid:
                return False
        self.blocks.allocate(rid, num_tokens)
        return True

    def _preempt(self, rid: Hashable) -> None:
        req = self._reqs[rid]
        self.blocks.free(rid)
        self._running.remove(rid)
        self._waiting.insert(0, rid)
        # Recompute: everything whose input is known becomes prompt again.
        req.num_prompt_tokens = max(req.num_prompt_tokens, req.num_available)
        req.num_computed = 0
        req.num_preemptions += 1
        self.num_preemptions_total += 1

    # --- introspection (tests, metrics, the simulator) ------------------------------------------
    def has_work(self) -> bool:
        """True while any request is queued or running."""
        return bool(self._reqs)

    def num_computed(self, request_id: Hashable) -> int:
        return self._reqs[request_id].num_computed

    def num_available(self, request_id: Hashable) -> int:
        return self._reqs[request_id].num_available

    def num_preemptions(self, request_id: Hashable) -> int:
        return self._reqs[request_id].num_preemptions

    @property
    def waiting_ids(self) -> tuple[Hashable, ...]:
        return tuple(self._waiting)

    @property
    def num_waiting(self) -> int:
        """Requests queued for admission (without copying the queue, for per-step checks)."""
        return len(self._waiting)

    @property
    def running_ids(self) -> tuple[Hashable, ...]:
        return tuple(self._running)


class _StepBuilder:
    """Accumulates one step's work and tracks the room left in it."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self.decode_ids: list[Hashable] = []
        self.decode_positions: list[int] = []
        self.chunks: list[PrefillChunk] = []
        self.scheduled: set[Hashable] = set()
        self.tokens = 0

    @property
    def tokens_left(self) -> int:
        return self.config.max_num_batched_tokens - self.tokens

    def room_for(self, num_tokens: int) -> bool:
        seqs = len(self.decode_ids) + len(self.chunks)
        if seqs >= self.config.max_num_seqs:
            return False
        # Without chunking the first prefill may exceed the budget; the caller checks that case.
        return num_tokens <= self.tokens_left or (not self.config.chunked_prefill and not self.chunks
                                                   and self.tokens_left > 0)

    def decode(self, rid: Hashable, position: int) -> None:
        self.decode_ids.append(rid)
        self.decode_positions.append(position)
        self.scheduled.add(rid)
        self.tokens += 1

    def prefill(self, chunk: PrefillChunk) -> None:
        self.chunks.append(chunk)
        self.scheduled.add(chunk.request_id)
        self.tokens += chunk.num_tokens
