"""Step policy and KV block accounting: rules by example, invariants by hypothesis."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helix.core.errors import HelixUserError
from worker.kv_blocks import KVBlockManager, KVCacheFullError
from worker.step_policy import PolicyConfig, PrefillChunk, StepPolicy


def _policy(num_blocks=64, block=4, seqs=8, budget=16, chunked=True, self_feeding=True):
    cfg = PolicyConfig(max_num_seqs=seqs, max_num_batched_tokens=budget, chunked_prefill=chunked,
                       self_feeding=self_feeding)
    return StepPolicy(cfg, KVBlockManager(num_blocks, block))


def test_block_manager_allocates_grows_and_frees():
    bm = KVBlockManager(num_blocks=4, block_size_tokens=4)
    assert bm.allocate("a", 5) == (0, 1)
    assert bm.allocate("a", 8) == ()          # already covered
    assert bm.can_allocate("b", 8) and not bm.can_allocate("b", 9)
    with pytest.raises(KVCacheFullError):
        bm.allocate("b", 9)
    assert bm.free("a") == 2 and bm.num_free_blocks == 4
    bm.check_invariants()


def test_chunked_prefill_fills_budget_and_decodes_go_first():
    p = _policy(budget=16)
    p.add("a", 10, 5)
    plan = p.schedule()
    assert plan.prefill_chunks == (PrefillChunk("a", 0, 10, True),)
    p.complete(plan)
    p.add("b", 40, 5)
    plan = p.schedule()
    assert plan.decode_ids == ("a",) and plan.decode_positions == (10,)
    assert plan.prefill_chunks == (PrefillChunk("b", 0, 15, False),)    # 16 - 1 decode token
    p.complete(plan)
    plan = p.schedule()
    assert plan.prefill_chunks == (PrefillChunk("b", 15, 15, False),)
    assert plan.num_tokens == 16


def test_without_chunking_prompts_run_whole_and_fcfs_is_strict():
    p = _policy(budget=16, chunked=False)
    p.add("a", 30, 1)          # larger than the budget: allowed as the first prefill of a step
    p.add("b", 4, 1)
    plan = p.schedule()
    assert [(c.request_id, c.num_tokens) for c in plan.prefill_chunks] == [("a", 30)]
    p.complete(plan)
    plan = p.schedule()
    assert plan.decode_ids == ("a",)
    assert [(c.request_id, c.num_tokens) for c in plan.prefill_chunks] == [("b", 4)]


def test_finished_requests_leave_at_once_and_new_ones_join_next_step():
    p = _policy()
    p.add("a", 4, 2)
    plan = p.schedule()
    p.add("b", 4, 2)            # not part of the plan already made
    assert [c.request_id for c in plan.prefill_chunks] == ["a"]
    p.complete(plan, finished_ids=["a"])
    assert p.blocks.num_used_blocks == 0
    assert [c.request_id for c in p.schedule().prefill_chunks] == ["b"]


def test_preempts_newest_when_kv_runs_out_and_recomputes_later():
    p = _policy(num_blocks=4, block=4, budget=64)
    p.add("old", 8, 8)
    p.add("new", 8, 8)
    plan = p.schedule()
    assert p.blocks.num_free_blocks == 0
    p.complete(plan)
    plan = p.schedule()             # "old" needs a third block for position 8 -> "new" goes
    assert plan.preempted_ids == ("new",) and plan.decode_ids == ("old",)
    assert p.waiting_ids == ("new",) and p.num_computed("new") == 0
    p.complete(plan, finished_ids=["old"])
    plan = p.schedule()             # recompute: the prompt plus the token sampled before preemption
    assert plan.prefill_chunks == (PrefillChunk("new", 0, 9, True),)


def test_max_num_seqs_limits_a_step():
    p = _policy(seqs=2, budget=100)
    for i in range(3):
        p.add(i, 3, 1)
    assert [c.request_id for c in p.schedule().prefill_chunks] == [0, 1]


def test_request_longer_than_kv_capacity_is_rejected_at_admission():
    p = _policy(num_blocks=2, block=4)
    with pytest.raises(HelixUserError, match="at most 8 tokens"):
        p.add("big", 6, 3)


def test_pipeline_stage_waits_for_inputs():
    p = _policy(self_feeding=False)
    p.add("a", 10, 2, num_available_tokens=4)
    plan = p.schedule()
    assert plan.prefill_chunks == (PrefillChunk("a", 0, 4, False),)
    p.complete(plan)
    assert p.schedule().is_empty        # nothing arrived yet
    p.feed("a", 6)
    plan = p.schedule()
    assert plan.prefill_chunks == (PrefillChunk("a", 4, 6, True),)
    p.complete(plan)
    assert p.schedule().is_empty        # the next token comes from the last stage
    p.feed("a")
    assert p.schedule().decode_ids == ("a",)


# Each op: requests (prompt, max_new) arriving before a step, then random bits that finish some
# of the requests that produced a token in that step early (an EOS or an abort).
_ops = st.lists(st.tuples(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 20)), max_size=3),
                          st.integers(0, 2**16)),
                min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(ops=_ops, num_blocks=st.integers(4, 24), block=st.integers(1, 8), budget=st.integers(1, 48),
       seqs=st.integers(1, 6), chunked=st.booleans())
def test_kv_blocks_never_leak_or_overcommit(ops, num_blocks, block, budget, seqs, chunked):
    p = _policy(num_blocks, block, seqs, budget, chunked)
    produced: dict[int, int] = {}
    limits: dict[int, int] = {}
    for arrivals, bits in ops:
        for prompt, new in arrivals:
            if prompt + new <= num_blocks * block:
                rid = len(limits)
                p.add(rid, prompt, new)
                produced[rid], limits[rid] = 0, new
        _step(p, produced, limits, bits, budget, seqs, chunked)
    for _ in range(10_000):            # drain: everything must finish, nothing may stay held
        if not p.has_work():
            break
        _step(p, produced, limits, 0, budget, seqs, chunked)
    assert not p.has_work()
    assert p.blocks.num_free_blocks == num_blocks


def _step(p, produced, limits, bits, budget, seqs, chunked):
    plan = p.schedule()
    assert not (p.has_work() and plan.is_empty), "deadlock: work queued but nothing scheduled"
    _check_plan(p, plan, budget, seqs, chunked)
    finished = []
    for k, rid in enumerate(_sampling_ids(plan)):
        produced[rid] += 1
        if produced[rid] >= max(limits[rid], 1) or (bits >> (k % 16)) & 1:
            finished.append(rid)
    p.complete(plan, finished)
    p.blocks.check_invariants()


def _sampling_ids(plan):
    return [*plan.decode_ids, *(c.request_id for c in plan.prefill_chunks if c.is_last)]


def _check_plan(p, plan, budget, seqs, chunked):
    assert plan.num_seqs <= seqs
    if chunked:
        assert plan.num_tokens <= budget
    ids = [*plan.decode_ids, *(c.request_id for c in plan.prefill_chunks)]
    assert len(ids) == len(set(ids)), "a request appears twice in one step"
    assert not set(ids) & set(plan.preempted_ids)
    for rid, pos in zip(plan.decode_ids, plan.decode_positions):
        assert p.blocks.capacity_of(rid) >= pos + 1
    for c in plan.prefill_chunks:
        assert c.num_tokens >= 1 and p.blocks.capacity_of(c.request_id) >= c.end
    for rid in plan.preempted_ids:
        assert p.blocks.capacity_of(rid) == 0


@settings(max_examples=100, deadline=None)
@given(feeds=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12)), min_size=1, max_size=60),
       num_blocks=st.integers(7, 16), budget=st.integers(1, 24), chunked=st.booleans())
def test_pipeline_stage_never_computes_ahead_of_its_inputs(feeds, num_blocks, budget, chunked):
    """A stage (self_feeding=False) only computes tokens whose inputs arrived; blocks never leak."""
    block = 4
    p = _policy(num_blocks, block, 4, budget, chunked, self_feeding=False)
    prompt = {rid: 10 + 3 * rid for rid in range(4)}
    arrived = {rid: 0 for rid in prompt}
    for rid in prompt:
        p.add(rid, prompt[rid], 6, num_available_tokens=0)
    for rid, n in feeds:
        if rid in arrived and arrived[rid] < prompt[rid] + 6:
            n = min(n, prompt[rid] + 6 - arrived[rid])
            p.feed(rid, n)
            arrived[rid] += n
        plan = p.schedule()
        _check_plan(p, plan, budget, 4, chunked)
        for c in plan.prefill_chunks:
            assert c.end <= arrived[c.request_id]
        for r, pos in zip(plan.decode_ids, plan.decode_positions):
            assert pos < arrived[r]
        p.complete(plan)
        for r in [r for r in arrived if p.num_computed(r) == prompt[r] + 6]:
            p.finish(r)          # all inputs arrived and computed: the request is done here
            del arrived[r]
        p.blocks.check_invariants()
    for r in list(arrived):
        p.finish(r)
    assert p.blocks.num_free_blocks == num_blocks
