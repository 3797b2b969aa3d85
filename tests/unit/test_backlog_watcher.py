"""The driver's backlog watcher: after an outage idle time starts over, each outage is kept, a refusal is none."""

from __future__ import annotations

import logging
import threading
import time

from queueplane.kafka.refused import Refused
from queueplane.run.driver.backlog_watcher import BacklogWatcher
from queueplane.run.driver.health import Health


def _reads(answers):
    """A backlog read giving ``answers`` in turn: an exception is raised, anything else returned."""

    def read():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return read


def test_the_end_of_an_outage_restarts_the_time_kafka_has_answered_and_a_good_read_does_not():
    answers = iter([RuntimeError("no leaders"), RuntimeError("no leaders"), None, {0: 3}, {0: 0}])
    watcher = BacklogWatcher(_reads(answers), Health(stall_s=60))
    before = watcher.answering_since
    watcher.read_now()
    watcher.read_now()
    assert watcher.failing and watcher.latest is None
    assert watcher.answering_since == before, "a failing read does not move it"
    time.sleep(0.01)
    watcher.read_now()  # Kafka answers again, though it cannot tell the lag yet (None)
    recovered = watcher.answering_since
    assert not watcher.failing and recovered > before
    watcher.read_now()
    watcher.read_now()
    assert watcher.latest == {0: 0}
    assert watcher.answering_since == recovered, "reads without a break in between do not move it"


def test_each_outage_is_kept_with_its_length_and_first_error_and_an_open_one_counts_up_to_now():
    answers = iter([RuntimeError("no leaders\ndetail"), RuntimeError("other"), {0: 1}, RuntimeError("down")])
    watcher = BacklogWatcher(_reads(answers), Health(stall_s=60))
    watcher.read_now()
    time.sleep(0.2)
    watcher.read_now()
    assert watcher.outages == [], "not over yet"
    watcher.read_now()
    (ended,) = watcher.outages
    assert ended["error"] == "no leaders", "the first error's first line"
    assert 0.2 <= ended["seconds"] < 5
    watcher.read_now()
    assert len(watcher.all_outages()) == 2 and watcher.all_outages()[-1]["error"] == "down"
    assert watcher.outages == [ended]


def test_an_outage_counts_from_when_the_failing_read_began_not_from_when_it_timed_out():
    def slow_failure():
        time.sleep(0.3)  # a read against a stopped broker waits out its timeout
        raise RuntimeError("timed out")

    answers = iter([{0: 1}])
    reads = iter([slow_failure, lambda: next(answers)])
    watcher = BacklogWatcher(lambda: next(reads)(), Health(stall_s=60))
    watcher.read_now()
    watcher.read_now()
    (ended,) = watcher.outages
    assert ended["seconds"] >= 0.3, ended


def test_a_refused_read_is_no_outage_and_leaves_the_worker_not_ready_with_the_refusal(caplog):
    answers = iter([Refused("TOPIC_AUTHORIZATION_FAILED"), {0: 1}])
    health = Health(stall_s=60)
    watcher = BacklogWatcher(_reads(answers), health)
    with caplog.at_level(logging.WARNING, logger="queueplane.worker"):
        watcher.read_now()
    assert watcher.refused is not None and "lacks an ACL" in str(watcher.refused)
    assert not watcher.failing and watcher.all_outages() == [], "Kafka answered: with a refusal"
    assert [r.getMessage() for r in caplog.records] == [str(watcher.refused)], "one line, the refusal"
    watcher.read_now()  # Kafka answers the next read: the principal was still refused
    verdict = health.ready(time.monotonic())
    assert not verdict.ok and "lacks an ACL" in verdict.reason


def test_a_lag_read_is_fresh_only_for_records_that_came_out_before_it_began():
    answers = iter([{0: 0}, {0: 0}])
    watcher = BacklogWatcher(_reads(answers), Health(stall_s=60))
    watcher.read_now()
    last_rows = time.monotonic()  # a micro-batch showed records after that read began
    assert not watcher.fresh(last_rows), "a read begun before the last records says nothing of them"
    watcher.read_now()
    assert watcher.fresh(last_rows)


def test_an_answer_left_standing_by_a_read_that_hangs_stops_telling_of_now():
    """A stalled connection: the next read hangs, no records come out, and records keep arriving.
    The last answer (no lag) must not let an idle worker stop while its queue fills."""
    hanging = threading.Event()
    answers = iter([{0: 0}])

    def read():
        answer = next(answers, None)
        if answer is None:
            hanging.wait(5)
            raise TimeoutError("the read hung")
        return answer

    watcher = BacklogWatcher(read, Health(stall_s=60))
    watcher.RECENT_S = 0.2
    watcher.read_now()
    last_rows = time.monotonic() - 10  # the last records came out long before
    assert watcher.current(last_rows, time.monotonic()), "an answer just read tells of now"
    reader = threading.Thread(target=watcher.read_now)
    reader.start()  # hangs, leaving the answer standing
    time.sleep(0.3)
    assert watcher.latest == {0: 0} and not watcher.failing, "the read still hangs"
    assert not watcher.current(last_rows, time.monotonic()), "an answer older than RECENT_S"
    hanging.set()
    reader.join()
