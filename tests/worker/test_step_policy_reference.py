"""The incremental step policy decides exactly what the plain full-scan policy decides.

:class:`ReferenceStepPolicy` is a frozen copy of the straightforward algorithm: every ``schedule()``
scans all running requests to split them into ready decodes and prefills, and the preemption victim is
found by filtering the whole running list. :class:`worker.step_policy.StepPolicy` keeps those sets up to
date as requests change instead. Hypothesis drives both through the same random call sequences (add,
feed, schedule, complete with random finished ids, finish at any time, request ids reused, KV pools
small enough to preempt) and every plan, block table and counter must match.

The step-room accounting (:class:`worker.step_policy._StepBuilder`) and the data objects are shared:
the oracle freezes how requests are chosen, not what a step may hold.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helix.core.errors import HelixUserError
from worker.kv_blocks import KVBlockManager
from worker.step_policy import PolicyConfig, PrefillChunk, StepPlan, StepPolicy, _StepBuilder


@dataclass
class _RefReq:
    request_id: Hashable
    num_prompt_tokens: int
    max_total_tokens: int
    num_available: int
    num_computed: int = 0
    num_preemptions: int = 0

    @property
    def pending(self) -> int:
        return self.num_available - self.num_computed


class ReferenceStepPolicy:
    """The full-scan policy, kept verbatim as the oracle (and as the baseline of
    ``scripts/bench_step_policy.py``): O(running requests) host work per step."""

    def __init__(self, config: PolicyConfig, blocks: KVBlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self._reqs: dict[Hashable, _RefReq] = {}
        self._waiting: list[Hashable] = []
        self._running: list[Hashable] = []
        self.num_preemptions_total = 0

    def add(self, request_id: Hashable, num_prompt_tokens: int, max_new_tokens: int = 0,
            num_available_tokens: int | None = None) -> None:
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
        self._reqs[request_id] = _RefReq(request_id, num_prompt_tokens, total, avail)
        self._waiting.append(request_id)

    def feed(self, request_id: Hashable, num_tokens: int = 1) -> None:
        self._reqs[request_id].num_available += num_tokens

    def finish(self, request_id: Hashable) -> None:
        if request_id not in self._reqs:
            return
        del self._reqs[request_id]
        if request_id in self._running:
            self._running.remove(request_id)
        if request_id in self._waiting:
            self._waiting.remove(request_id)
        self.blocks.free(request_id)

    def schedule(self) -> StepPlan:
        step = _StepBuilder(self.config)
        preempted: list[Hashable] = []
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
                break
            if not self._schedule_prefill(rid, step, preempted, running=False):
                break
            self._waiting.pop(0)
            self._running.append(rid)
        return StepPlan(tuple(step.decode_ids), tuple(step.decode_positions), tuple(step.chunks),
                        tuple(preempted))

    def complete(self, plan: StepPlan, finished_ids: Iterable[Hashable] = ()) -> None:
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

    def _schedule_prefill(self, rid: Hashable, step: _StepBuilder, preempted: list[Hashable],
                          running: bool) -> bool:
        req = self._reqs[rid]
        want = req.pending
        if want < 1 or not step.room_for(1):
            return False
        if self.config.chunked_prefill:
            want = min(want, step.tokens_left)
            fit = self.blocks.capacity_of(rid) + self.blocks.num_free_blocks * \
                self.blocks.block_size_tokens - req.num_computed
            if running is False or fit >= 1:
                want = min(want, max(fit, 0))
            if want < 1 and not running:
                return False
        elif want > step.tokens_left and step.chunks:
            return False
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

    def _grow(self, rid: Hashable, num_tokens: int, step: _StepBuilder,
              preempted: list[Hashable]) -> bool:
        if self.blocks.capacity_of(rid) >= num_tokens:
            return True
        while not self.blocks.can_allocate(rid, num_tokens):
            victims = [r for r in self._running if r not in step.scheduled]
            victim = victims[-1]
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
        req.num_prompt_tokens = max(req.num_prompt_tokens, req.num_available)
        req.num_computed = 0
        req.num_preemptions += 1
        self.num_preemptions_total += 1

    def has_work(self) -> bool:
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
    def running_ids(self) -> tuple[Hashable, ...]:
        return tuple(self._running)


# --- the equivalence property ---------------------------------------------------------------------
NUM_IDS = 10   # a small id pool, so that ids are finished and added again

_add = st.tuples(st.just("add"), st.integers(0, NUM_IDS - 1), st.integers(1, 12), st.integers(0, 8),
                 st.one_of(st.none(), st.integers(0, 12)))   # rid, prompt, max_new, available
_feed = st.tuples(st.just("feed"), st.integers(0, NUM_IDS - 1), st.integers(0, 4))
# Schedule when no plan is in flight, else complete the one in flight with these ids finished.
_step = st.tuples(st.just("step"), st.one_of(st.just(frozenset()),
                                             st.sets(st.integers(0, NUM_IDS - 1), max_size=2)))
_finish = st.tuples(st.just("finish"), st.integers(0, NUM_IDS - 1))
_op = st.sampled_from([_add, _add, _feed, _feed, _step, _step, _step, _finish]).flatmap(lambda op: op)


def _call(policy, name, *args):
    """(result, exception type and text): both policies must also fail alike."""
    try:
        return getattr(policy, name)(*args), None
    except (ValueError, KeyError, HelixUserError) as e:
        return None, (type(e), str(e))


def _assert_same_state(new: StepPolicy, ref: ReferenceStepPolicy) -> None:
    assert new.waiting_ids == ref.waiting_ids
    assert new.running_ids == ref.running_ids
    assert new.num_preemptions_total == ref.num_preemptions_total
    assert new.has_work() == ref.has_work()
    tables = {r: ref.blocks.block_table(r) for r in ref.blocks.request_ids()}
    assert {r: new.blocks.block_table(r) for r in new.blocks.request_ids()} == tables
    assert new.blocks.num_free_blocks == ref.blocks.num_free_blocks
    for r in ref._reqs:
        assert (new.num_computed(r), new.num_available(r), new.num_preemptions(r)) == \
            (ref.num_computed(r), ref.num_available(r), ref.num_preemptions(r)), r
    # has_ready looks at the queues only; the full scan it stands for:
    assert new.has_ready() == any(ref.num_available(r) > ref.num_computed(r) for r in ref._reqs)
    new.check_invariants()


@pytest.mark.parametrize("self_feeding", [True, False])
@pytest.mark.parametrize("chunked", [True, False])
@settings(max_examples=150, deadline=None)
@given(ops=st.lists(_op, min_size=20, max_size=100), num_blocks=st.integers(3, 12),
       block=st.integers(1, 4), seqs=st.integers(1, 6), budget=st.integers(1, 24))
def test_same_plans_as_the_full_scan_policy(ops, num_blocks, block, seqs, budget, chunked,
                                           self_feeding):
    config = PolicyConfig(max_num_seqs=seqs, max_num_batched_tokens=budget,
                          chunked_prefill=chunked, self_feeding=self_feeding)
    new = StepPolicy(config, KVBlockManager(num_blocks, block))
    ref = ReferenceStepPolicy(config, KVBlockManager(num_blocks, block))
    in_flight: StepPlan | None = None
    for op, *args in ops:
        if op == "add":
            rid, prompt, max_new, avail = args
            call = ("add", rid, prompt, max_new, None if avail is None else min(avail, prompt))
        elif op == "feed":
            call = ("feed", *args)
        elif op == "finish":
            call = ("finish", *args)
        elif in_flight is None:
            call = ("schedule",)
        else:
            call = ("complete", in_flight, sorted(args[0]))
        got, want = _call(new, *call), _call(ref, *call)
        assert got == want, call
        if call[0] == "schedule":
            in_flight = got[0]
        elif call[0] == "complete":
            in_flight = None
        _assert_same_state(new, ref)
    # Drain: inputs keep coming and requests leave at their token limit, a few dozen steps more.
    for _ in range(60):
        if in_flight is not None:
            new.complete(in_flight, ())
            ref.complete(in_flight, ())
        if not ref.has_work():
            break
        fed = []   # one message's worth: the new policy takes them at once (feed_many)
        for r in [*ref.running_ids, *ref.waiting_ids]:
            if ref.num_computed(r) >= ref._reqs[r].max_total_tokens:
                new.finish(r)
                ref.finish(r)
            elif ref.num_available(r) <= ref.num_computed(r):   # the rest of the prompt, or a token
                n = max(1, ref._reqs[r].num_prompt_tokens - ref.num_available(r))
                fed.append((r, n))
                ref.feed(r, n)
        new.feed_many(fed)
        in_flight = new.schedule()
        assert in_flight == ref.schedule()
        _assert_same_state(new, ref)
