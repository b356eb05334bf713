"""Decode grouping: a partition of the decodes, longest contexts first, bounded in count."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.step_batch import MAX_DECODE_GROUPS, MIN_DECODE_GROUP, decode_groups


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 2000), max_size=80), st.sampled_from([1, 4, 16]))
def test_groups_partition_the_decodes(lens, bs):
    groups = decode_groups(lens, bs)
    flat = [k for g in groups for k in g]
    assert sorted(flat) == list(range(len(lens)))
    assert len(groups) <= MAX_DECODE_GROUPS
    assert all(len(g) >= MIN_DECODE_GROUP for g in groups[:-1])
    blocks = [[-(-lens[k] // bs) for k in g] for g in groups]
    # Groups are ordered by length: every context of a group needs at least the blocks of the next.
    assert all(min(a) >= max(b) for a, b in zip(blocks, blocks[1:]))
    if len(groups) == 1:
        assert groups[0] == sorted(groups[0])


def test_mixed_lengths_split_and_uniform_lengths_do_not():
    assert len(decode_groups([600] * 8 + [30] * 8, 16)) == 2
    assert decode_groups([100] * 10, 16) == [list(range(10))]
    assert decode_groups([], 16) == []
