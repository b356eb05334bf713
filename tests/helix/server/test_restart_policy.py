"""The restart policy of Ray workers (helix.server.restarts.NodeRestarts), over a clock passed in:
restarts are paced by a back-off and never capped by a count; a node whose worker cannot come up is
lost, and comes back when its worker does."""

from __future__ import annotations

import pytest

from helix.server.restarts import NodeRestarts, RestartPolicy

POLICY = RestartPolicy(backoff_initial_s=1, backoff_max_s=8, stable_after_s=30, lost_after_s=20,
                       lost_after_failures=3)


def test_a_worker_that_served_a_while_restarts_at_once_quick_deaths_back_off():
    book = NodeRestarts(POLICY, now_s=0.0)
    assert book.died(100.0) == 0.0 and book.due(100.0)   # served 100 s: at once
    book.started(100.0)
    book.came_up(107.0)
    delays = []
    for k in range(6):   # killed 5 s after every start: back-off 1, 2, 4, 8, 8, 8
        t = 112.0 + 20 * k
        delays.append(book.died(t))
        assert not book.due(t + delays[-1] - 0.1) and book.due(t + delays[-1])
        book.started(t + delays[-1])
        book.came_up(t + delays[-1] + 3)
    assert delays == [1, 2, 4, 8, 8, 8] and book.restarts == 7   # never capped
    assert book.check_lost(500.0, offered=True) is None            # it came up every time


def test_starts_that_die_before_coming_up_make_the_node_lost_until_one_comes_up():
    book = NodeRestarts(POLICY, now_s=0.0)
    t = 100.0
    for k in range(3):
        book.died(t, "ImportError: no module named torch")
        t = book.due_s
        book.started(t)
        assert book.check_lost(t, offered=True) is None
        t += 2.0
    book.died(t, "ImportError: no module named torch")   # the third start died before it came up
    reason = book.check_lost(t, offered=True)
    assert reason == "its worker failed to start 3 times in a row (ImportError: no module named torch)"
    assert book.check_lost(t + 1, offered=True) is None   # said once
    t = book.due_s
    book.started(t)
    assert book.came_up(t + 5) is True and book.lost is None and book.failures == 0


def test_a_start_that_never_comes_up_is_lost_and_says_whether_its_machine_is_gone():
    book = NodeRestarts(POLICY, now_s=0.0)
    book.died(100.0)
    book.started(100.0)
    assert book.check_lost(119.0, offered=False) is None
    assert book.check_lost(120.0, offered=False) == \
        "no live Ray node offers its resource (its machine is gone)"
    other = NodeRestarts(POLICY, now_s=0.0, up=False)
    assert other.check_lost(25.0, offered=True) == "its worker has not come up within 20 s"


def test_a_policy_that_makes_no_sense_is_refused():
    with pytest.raises(ValueError, match="backoff_initial_s"):
        RestartPolicy(backoff_initial_s=10, backoff_max_s=1)
    with pytest.raises(ValueError, match="lost_after_failures"):
        RestartPolicy(lost_after_failures=0)
