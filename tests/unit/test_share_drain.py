"""When a draining share consumer leaves the group (share/fetcher.py, drain_may_end).

A consumer whose last poll came back empty has a fetch open, and what that fetch acquires comes
back one delivery higher once it has left. So it leaves at once only when its last poll brought
records; otherwise it waits for the queue to look idle, to its whole process and on the topic's
end offsets, within a bound.
"""

from __future__ import annotations

from queueplane.run.share.executor.fetcher import drain_may_end
from queueplane.run.share.executor.queue_end import READ_EVERY_S, QueueEnd
from queueplane.run.share.settings import DRAIN_POLL_MAX_S, DRAIN_POLL_S

STARTED = 1000.0
NEVER = 0.0  # no poll of the process brought records / the topic did not grow


def test_a_consumer_whose_last_poll_brought_records_leaves_at_once():
    assert drain_may_end(False, STARTED, STARTED, STARTED, STARTED)


def test_with_a_fetch_out_it_waits_for_the_idle_bound_on_an_idle_queue():
    assert not drain_may_end(True, STARTED, NEVER, NEVER, STARTED + DRAIN_POLL_S - 0.1)
    assert drain_may_end(True, STARTED, NEVER, NEVER, STARTED + DRAIN_POLL_S)


def test_while_its_siblings_polls_bring_records_it_stays_on_a_trickling_queue():
    # A sibling consumer of the process got records 1.5 s into the drain: the queue is not idle.
    sibling_got = STARTED + 1.5
    assert not drain_may_end(True, STARTED, sibling_got, NEVER, STARTED + DRAIN_POLL_S + 0.5)
    assert drain_may_end(True, STARTED, sibling_got, NEVER, sibling_got + DRAIN_POLL_S)


def test_while_the_topic_grows_it_stays_though_other_processes_took_the_records():
    # No poll of this process brought records, but the topic grew 1.5 s into the drain: the
    # records went to other processes' fetches, and the next may go to this one's.
    grew = STARTED + 1.5
    assert not drain_may_end(True, STARTED, NEVER, grew, STARTED + DRAIN_POLL_S + 0.5)
    assert drain_may_end(True, STARTED, NEVER, grew, grew + DRAIN_POLL_S)


def test_it_leaves_after_the_longest_drain_even_while_records_keep_coming_to_others():
    now = STARTED + DRAIN_POLL_MAX_S
    assert not drain_may_end(True, STARTED, now - 0.1, now - 0.1, now - 0.01)
    assert drain_may_end(True, STARTED, now - 0.1, now - 0.1, now)


class _Clock:
    def __init__(self) -> None:
        self.now = STARTED

    def __call__(self) -> float:
        return self.now


def test_the_queue_end_is_read_at_most_every_half_second_and_moves_only_when_it_grew():
    clock, ends, reads = _Clock(), iter([100, 100, 103, None, 103]), []

    def read() -> int | None:
        reads.append(clock.now)
        return next(ends)

    end = QueueEnd(read, clock)
    assert end.moved_at() == NEVER, "the first read is the baseline"
    clock.now += READ_EVERY_S / 2
    assert end.moved_at() == NEVER and len(reads) == 1, "no second read within READ_EVERY_S"
    clock.now += READ_EVERY_S
    assert end.moved_at() == NEVER, "read again: the same end"
    clock.now += READ_EVERY_S
    grew_at = clock.now
    assert end.moved_at() == grew_at
    clock.now += READ_EVERY_S
    assert end.moved_at() == grew_at, "an unreadable end (the broker away) is no growth"
    clock.now += READ_EVERY_S
    assert end.moved_at() == grew_at, "the same end as the last read: no growth"
    assert len(reads) == 5
