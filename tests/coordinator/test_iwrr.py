from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from coordinator.iwrr import IWRR


def test_split_matches_weights_within_2_percent_over_10k():
    weights = {"a": 731.5, "b": 212.25, "c": 55.0, "d": 1.25}
    iwrr = IWRR(weights)
    counts = Counter(iwrr.pick() for _ in range(10_000))
    total = sum(weights.values())
    for k, w in weights.items():
        assert abs(counts[k] / 10_000 - w / total) <= 0.02 * (w / total) + 1e-4, (k, counts)


def test_interleaved_not_bunched():
    iwrr = IWRR({"a": 2, "b": 1})
    assert [iwrr.pick() for _ in range(6)] == ["a", "b", "a", "a", "b", "a"]


def test_masked_choice_keeps_its_credit_and_survivors_share():
    iwrr = IWRR({"a": 1, "b": 1, "c": 2})
    picks = Counter(iwrr.pick({"a", "c"}) for _ in range(300))
    assert picks == {"a": 100, "c": 200}
    assert iwrr.pick(set()) is None


def test_zero_weights_dropped_and_empty_refused():
    assert IWRR({"a": 0.0, "b": 3.0}).choices == ("b",)
    with pytest.raises(ValueError):
        IWRR({"a": 0.0})


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=0.5, max_value=1000), min_size=1, max_size=8))
def test_every_window_is_within_one_pick_per_choice(ws):
    weights = {f"n{i}": w for i, w in enumerate(ws)}
    iwrr = IWRR(weights)
    n = 500
    counts = Counter(iwrr.pick() for _ in range(n))
    total = sum(ws)
    for k, w in weights.items():
        assert abs(counts[k] - n * w / total) <= len(ws), (k, counts[k], n * w / total)
