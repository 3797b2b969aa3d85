"""When a draining share consumer leaves the group (share/fetcher.py, drain_may_end).

A consumer whose last poll came back empty has a fetch open, and what that fetch acquires comes
back one delivery higher once it has left. So it leaves at once only when its last poll brought
records; otherwise it waits for the queue to look idle to its whole process, within a bound.
"""

from __future__ import annotations

from queueplane.run.share.fetcher import drain_may_end
from queueplane.run.share.settings import DRAIN_POLL_MAX_S, DRAIN_POLL_S

STARTED = 1000.0


def test_a_consumer_whose_last_poll_brought_records_leaves_at_once():
    assert drain_may_end(False, STARTED, STARTED, STARTED)


def test_with_a_fetch_out_it_waits_for_the_idle_bound_on_an_idle_queue():
    never = 0.0  # no poll of the process brought records
    assert not drain_may_end(True, STARTED, never, STARTED + DRAIN_POLL_S - 0.1)
    assert drain_may_end(True, STARTED, never, STARTED + DRAIN_POLL_S)


def test_while_its_siblings_polls_bring_records_it_stays_on_a_trickling_queue():
    # A sibling consumer of the process got records 1.5 s into the drain: the queue is not idle.
    sibling_got = STARTED + 1.5
    assert not drain_may_end(True, STARTED, sibling_got, STARTED + DRAIN_POLL_S + 0.5)
    assert drain_may_end(True, STARTED, sibling_got, sibling_got + DRAIN_POLL_S)


def test_it_leaves_after_the_longest_drain_even_while_records_keep_coming_to_others():
    now = STARTED + DRAIN_POLL_MAX_S
    assert not drain_may_end(True, STARTED, now - 0.1, now - 0.01)
    assert drain_may_end(True, STARTED, now - 0.1, now)
