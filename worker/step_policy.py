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

Host cost. Besides the FCFS waiting queue and the running requests (admission order), the policy keeps
the *ready* running requests in two queues ordered by admission, one of decodes and one of prefills, and
moves a request between them only when its counters change (``add``, ``feed``, ``complete``, ``finish``,
admission, preemption); ``complete`` and ``feed_many`` (a message's inputs at once, the simulator's
call) move all their requests in one cut and one merge per queue. A step therefore costs time in proportion to the requests it schedules, the
ready requests it copies and the requests a call touched, not to every request resident: a pipeline
stage holding thousands of requests of which a few are ready steps as fast as one holding a few.

Admission (``add``) raises :class:`helix.core.errors.HelixUserError` when ``num_prompt_tokens +
max_new_tokens`` exceeds the KV capacity of the whole pool: such a request could never finish.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from helix.core.errors import HelixUserError
from helix.core.serving import ENGINE_STEP_TOKENS, ServingSpec
from worker.kv_blocks import KVBlockManager


@dataclass(frozen=True)
class PolicyConfig:
    """Limits of one step."""

    max_num_seqs: int = ServingSpec().max_batch_seqs
    """Most requests in one step (decodes + prefill chunks): the plan's ``max_batch_seqs``."""
    max_num_batched_tokens: int = ENGINE_STEP_TOKENS
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


@dataclass(slots=True)
class _Req:
    request_id: Hashable
    num_prompt_tokens: int
    max_total_tokens: int
    num_available: int
    num_computed: int = 0
    num_preemptions: int = 0
    admission: int | None = None
    """Sequence number of its admission to the running set; None while it waits."""
    ready_in: _ReadyQueue | None = None
    """The ready queue that holds it, None when it is not a ready running request."""
    kv_tokens: int = 0
    """Positions its KV blocks cover (the policy makes every allocation and free): the decode pass
    reads it here rather than in the block manager's table (one object fewer per decode)."""

    @property
    def pending(self) -> int:
        return self.num_available - self.num_computed


class _ReadyQueue:
    """Running requests of one phase with inputs pending, oldest admission first.

    Entries are ``(admission, request record)`` (the record spares the step a lookup by id);
    admission numbers are unique, so ordering never compares the records. ``add_many`` / ``discard_many`` move a step's worth of
    requests at once: a merge of sorted runs and a prefix cut (the usual case: the requests a step
    just ran are the oldest ready ones) instead of one insertion or deletion each."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: list[tuple[int, _Req]] = []

    def add(self, admission: int, req: _Req) -> None:
        insort(self.entries, (admission, req))

    def discard(self, admission: int) -> None:
        del self.entries[bisect_left(self.entries, (admission,))]

    def add_many(self, new: list[tuple[int, _Req]]) -> None:
        entries = self.entries
        if len(new) == 1:
            insort(entries, new[0])
            return
        new.sort()
        if not entries or entries[-1] < new[0]:
            entries += new
        else:
            entries += new
            entries.sort()   # two sorted runs: timsort merges them in linear time

    def discard_many(self, admissions: set[int]) -> None:
        entries = self.entries
        k = 0
        n = len(admissions)
        for admission, _ in entries:
            if k == n or admission not in admissions:
                break
            k += 1
        if k == n:
            del entries[:k]
        else:
            entries[:] = [e for e in entries if e[0] not in admissions]


class StepPolicy:
    """Iteration-level scheduler over a :class:`KVBlockManager` (see the module docstring).

    Every request is either waiting or running. The ready queues hold exactly the running requests
    with ``num_available > num_computed``, decodes (``num_computed >= num_prompt_tokens``) in one and
    prefills in the other; ``check_invariants`` verifies it."""

    def __init__(self, config: PolicyConfig, blocks: KVBlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self._reqs: dict[Hashable, _Req] = {}
        self._waiting: deque[Hashable] = deque()   # FCFS; preempted requests go back to the front
        self._running: dict[Hashable, _Req] = {}  # admission order (oldest first)
        self._ready_decodes = _ReadyQueue()
        self._ready_prefills = _ReadyQueue()
        self._num_admissions = 0
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
        req = self._reqs[request_id]
        req.num_available += num_tokens
        self._refresh(req)

    def feed_many(self, fed: Iterable[tuple[Hashable, int]]) -> None:
        """``feed`` for each ``(request_id, num_tokens)`` of ``fed`` (a message's worth of inputs),
        the ready queues updated once for all of them."""
        reqs = self._reqs
        decodes, prefills = self._ready_decodes, self._ready_prefills
        new_decodes: list[tuple[int, _Req]] = []
        new_prefills: list[tuple[int, _Req]] = []
        for rid, n in fed:
            req = reqs[rid]
            req.num_available = available = req.num_available + n
            # Only a running request with nothing pending moves (into a queue): feeding a ready
            # one changes neither its phase nor its readiness.
            if req.ready_in is None and req.admission is not None:
                if available <= req.num_computed:
                    continue
                if req.num_computed >= req.num_prompt_tokens:
                    req.ready_in = decodes
                    new_decodes.append((req.admission, req))
                else:
                    req.ready_in = prefills
                    new_prefills.append((req.admission, req))
        if new_decodes:
            decodes.add_many(new_decodes)
        if new_prefills:
            prefills.add_many(new_prefills)

    def finish(self, request_id: Hashable) -> None:
        """Drop a request now (finished or aborted) and free its KV; unknown ids are ignored."""
        req = self._reqs.pop(request_id, None)
        if req is None:
            return
        if req.admission is not None:
            self._leave_running(req)
        else:
            self._waiting.remove(request_id)  # O(waiting): aborting a queued request is rare
        self.blocks.free(request_id)

    # --- the step ------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Pick the work of the next step (see the module docstring for the rules)."""
        step = _StepBuilder(self.config)
        preempted: list[Hashable] = []
        reqs = self._reqs
        # Iterate over copies of the ready queues: preemptions below take requests out of them, and
        # a request admitted in this step joins them but is not part of this step's decode/prefill
        # passes. Room in a step only shrinks, so once it is gone the rest of a pass is skipped.
        # Decode pass, inlined (it is most of a step): each decode takes one seq and one token of a
        # step that holds decodes only, so room is left while fewer than ``limit`` are taken, and
        # a request whose blocks already cover its next position needs no allocation.
        limit = min(self.config.max_num_seqs, self.config.max_num_batched_tokens)
        decode_ids, positions, scheduled = step.decode_ids, step.decode_positions, step.scheduled
        # ``scheduled`` (which _grow's preemption victims must avoid) gets the decodes before any
        # _grow and at the end, not one by one.
        for _, req in self._ready_decodes.entries.copy():
            rid = req.request_id
            if preempted and rid in preempted:
                continue
            if len(decode_ids) >= limit:
                break
            pos = req.num_computed
            if req.kv_tokens <= pos:
                scheduled.update(decode_ids)
                if not self._grow(rid, pos + 1, step, preempted):
                    continue
            decode_ids.append(rid)
            positions.append(pos)
        scheduled.update(decode_ids)
        step.tokens = len(decode_ids)
        if self._ready_prefills.entries:
            for _, req in self._ready_prefills.entries.copy():
                rid = req.request_id
                if rid in preempted:
                    continue
                if not step.room_for(1):
                    break
                self._schedule_prefill(rid, step, preempted, running=True)
        while self._waiting and step.room_for(1):
            rid = self._waiting[0]
            if rid in preempted:
                break  # just preempted: it must not take back the blocks it gave up in this step
            if not self._schedule_prefill(rid, step, preempted, running=False):
                break  # strict FCFS: nobody overtakes the head of the queue
            self._waiting.popleft()
            self._admit(reqs[rid])
        return StepPlan(tuple(decode_ids), tuple(positions), tuple(step.chunks), tuple(preempted))

    def complete(self, plan: StepPlan, finished_ids: Iterable[Hashable] = ()) -> None:
        """Record that ``plan`` ran; ``finished_ids`` leave at once and free their KV."""
        reqs = self._reqs
        # Finished requests leave first: what the step computed for them is never looked at again.
        for rid in finished_ids:
            self.finish(rid)
        self_feeding = self.config.self_feeding
        ready_decodes = self._ready_decodes
        moves: _Moves | None = None   # made when a request changes queue (rare on most steps)
        left_decodes: set[int] = set()
        # A request is in a plan once; were it there twice, the second visit would find it fed
        # already, as a visit to the set of touched ids would.
        for rid, pos in zip(plan.decode_ids, plan.decode_positions):
            req = reqs.get(rid)
            if req is None:
                continue
            req.num_computed = computed = pos + 1
            if self_feeding and req.num_available == computed:
                req.num_available += 1
            # A ready decode that stays ready (most steps of a self-feeding worker) stays put; one
            # with nothing left pending (most steps of a pipeline stage) leaves the decode queue.
            if req.ready_in is ready_decodes:
                if req.num_available <= computed:
                    left_decodes.add(req.admission)
                    req.ready_in = None
            else:
                moves = moves or _Moves()
                moves.note(self, req)
        for chunk in plan.prefill_chunks:
            req = reqs.get(chunk.request_id)
            if req is None:
                continue
            req.num_computed = chunk.end
            if self_feeding and req.num_available == req.num_computed:
                req.num_available += 1
            moves = moves or _Moves()
            moves.note(self, req)
        if left_decodes:
            ready_decodes.discard_many(left_decodes)
        if moves is not None:
            moves.apply()

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
            fit = req.kv_tokens + self.blocks.num_free_blocks * \
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
            req.kv_tokens = self.blocks.capacity_of(rid)
        end = req.num_computed + want
        step.prefill(PrefillChunk(rid, req.num_computed, want,
                                 is_last=end == req.num_available and end >= req.num_prompt_tokens))
        return True

    def _grow(self, rid: Hashable, num_tokens: int, step: "_StepBuilder",
              preempted: list[Hashable]) -> bool:
        """Make ``rid``'s table cover ``num_tokens``, preempting the newest running requests not in
        this step as needed. False if ``rid`` itself had to be preempted."""
        req = self._reqs[rid]
        if req.kv_tokens >= num_tokens:
            return True  # already covered (most decode steps): skip the allocator (simulator speed)
        while not self.blocks.can_allocate(rid, num_tokens):
            # The newest running request not in this step; rid itself qualifies, so there is one.
            victim = next(r for r in reversed(self._running) if r not in step.scheduled)
            self._preempt(victim)
            preempted.append(victim)
            if victim == rid:
                return False
        self.blocks.allocate(rid, num_tokens)
        req.kv_tokens = self.blocks.capacity_of(rid)
        return True

    def _preempt(self, rid: Hashable) -> None:
        req = self._reqs[rid]
        self.blocks.free(rid)
        req.kv_tokens = 0
        self._leave_running(req)
        self._waiting.appendleft(rid)
        # Recompute: everything whose input is known becomes prompt again.
        req.num_prompt_tokens = max(req.num_prompt_tokens, req.num_available)
        req.num_computed = 0
        req.num_preemptions += 1
        self.num_preemptions_total += 1

    # --- the ready queues: every change to a running request's counters goes through _refresh -----
    def _admit(self, req: _Req) -> None:
        req.admission = self._num_admissions
        self._num_admissions += 1
        self._running[req.request_id] = req
        self._refresh(req)

    def _leave_running(self, req: _Req) -> None:
        del self._running[req.request_id]
        if req.ready_in is not None:
            req.ready_in.discard(req.admission)
            req.ready_in = None
        req.admission = None

    def _queue_for(self, req: _Req) -> _ReadyQueue | None:
        """The ready queue ``req``'s counters call for (None: not ready, or waiting)."""
        if req.admission is None or req.num_available <= req.num_computed:
            return None
        return self._ready_decodes if req.num_computed >= req.num_prompt_tokens else \
            self._ready_prefills

    def _refresh(self, req: _Req) -> None:
        """Move ``req`` to the ready queue its counters call for (or out of both)."""
        if req.admission is None:
            return  # waiting: in no ready queue
        if req.num_available <= req.num_computed:
            queue = None
        elif req.num_computed >= req.num_prompt_tokens:
            queue = self._ready_decodes
        else:
            queue = self._ready_prefills
        if queue is not req.ready_in:
            if req.ready_in is not None:
                req.ready_in.discard(req.admission)
            if queue is not None:
                queue.add(req.admission, req)
            req.ready_in = queue

    def check_invariants(self) -> None:
        """The ready queues hold exactly the ready running requests, in admission order; every
        request waits or runs, not both (AssertionError otherwise). O(requests): for tests."""
        assert set(self._waiting) | set(self._running) == set(self._reqs)
        assert not set(self._waiting) & set(self._running)
        assert len(self._waiting) + len(self._running) == len(self._reqs)
        admissions = [q.admission for q in self._running.values()]
        assert None not in admissions and admissions == sorted(admissions)
        want_decodes, want_prefills = [], []
        for rid, q in self._running.items():
            if q.num_available > q.num_computed:
                ready = want_decodes if q.num_computed >= q.num_prompt_tokens else want_prefills
                ready.append((q.admission, rid))
        for queue, want in ((self._ready_decodes, want_decodes),
                            (self._ready_prefills, want_prefills)):
            have = [(a, q.request_id) for a, q in queue.entries]
            assert have == want and all(q is self._reqs[r] for (_, q), (_, r) in
                                        zip(queue.entries, want)), (have, want)
        for rid in self._waiting:
            assert self._reqs[rid].admission is None and self._reqs[rid].ready_in is None
        for rid, q in self._reqs.items():
            assert q.kv_tokens == self.blocks.capacity_of(rid), (rid, q.kv_tokens)

    # --- introspection (tests, metrics, the simulator) ------------------------------------------
    def has_ready(self) -> bool:
        """True when some request has inputs whose KV is not computed yet (a step would run it,
        KV allowing): the ready queues, and the waiting requests (few), are looked at, not every
        resident request."""
        if self._ready_decodes.entries or self._ready_prefills.entries:
            return True
        reqs = self._reqs
        return any(reqs[r].pending > 0 for r in self._waiting)

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


class _Moves:
    """Ready-queue moves of many requests, applied at once (``StepPolicy.complete`` / ``feed_many``):
    each request's ``ready_in`` changes at ``note``, the queues' entries at ``apply``."""

    __slots__ = ("out", "into")

    def __init__(self) -> None:
        self.out: dict[_ReadyQueue, set[int]] = {}
        self.into: dict[_ReadyQueue, list[tuple[int, _Req]]] = {}

    def note(self, policy: StepPolicy, req: _Req) -> None:
        queue = policy._queue_for(req)
        old = req.ready_in
        if queue is old:
            return
        if old is not None:
            self.out.setdefault(old, set()).add(req.admission)
        if queue is not None:
            self.into.setdefault(queue, []).append((req.admission, req))
        req.ready_in = queue

    def apply(self) -> None:
        for queue, admissions in self.out.items():
            queue.discard_many(admissions)
        for queue, new in self.into.items():
            queue.add_many(new)


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
