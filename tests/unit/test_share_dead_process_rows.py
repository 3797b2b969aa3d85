"""A dead share process's settled rows whose acknowledgements never reached the broker.

A fetcher writes the rows of a poll's last records as settled (``Outbox.add``) when it gives
their acknowledgements, which ride on its next poll. A process ended before that poll (its
memory limit, a handler's ``os._exit``) leaves settled rows of records the broker delivers
again: the next process hands the rows on, so the redelivery must be acknowledged without a
handler call and without a row, or the record is counted twice.

Real files in a tmp dir, as tests/unit/test_share_outbox.py does.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from confluent_kafka import AcknowledgeType, Message

from queueplane.run.dead_letters import Failure
from queueplane.run.executor.crash_journal import CrashJournal, tag_alive
from queueplane.run.executor.handler import MessageRecord
from queueplane.run.outcomes import DEAD_LETTERED, RECORDS_COLUMN, RELEASED, Outcome, accepted_columns, columns_of
from queueplane.run.share.executor.accepted import AcceptedLately
from queueplane.run.share.executor.fetcher import ShareFetcher
from queueplane.run.share.executor.outbox import COUNTED, Outbox
from queueplane.run.share.executor.pool import Poll
from queueplane.run.share.settings import ALREADY_COUNTED_RESULT, ALREADY_DEAD_RESULT

DEAD = "2147483646-1"  # above any pid_max: a process of this tag is dead
TASK = ("stream-a", 1, 0)  # the task whose attempt died, run again by the next process


def _messages(partition, offsets, delivery=1):
    return [
        Message(topic="t", partition=partition, offset=o, key=b"k", value=b"v", delivery_count=delivery)
        for o in offsets
    ]


def _block(partition, offsets, delivery=1):
    return accepted_columns(_messages(partition, offsets, delivery), 1.0, [1] * len(offsets))


def _records(blocks):
    return sum(sum(block[RECORDS_COLUMN]) for block in blocks)


def _began(tmp_path, task, tag=None):
    outbox = Outbox(tmp_path, tag=tag)
    outbox.begin(task)
    return outbox


def _fetcher(outbox, tmp_path):
    """A fetcher without a consumer, on a host with the real journal and outbox (``_calls`` needs no more)."""
    fetcher = ShareFetcher.__new__(ShareFetcher)
    fetcher.host = SimpleNamespace(
        settings=SimpleNamespace(delivery_limit=3),
        journal=CrashJournal(tmp_path, alone_s=5),
        outbox=outbox,
        accepted=AcceptedLately(60),  # the new process's: it never saw the dead one's acceptances
    )
    fetcher.index = 0
    return fetcher


def _die_before_the_next_poll(tmp_path):
    """A task's process: early acknowledgements of offsets 0-13 committed and confirmed (two
    blocks), taken by the task, then offset 32 accepted at the end of its poll (row settled, its
    acknowledgement given, not yet on the wire), and the process ended before its next poll."""
    assert not tag_alive(DEAD)
    dead = _began(tmp_path, TASK, tag=DEAD)
    for offsets in ([0, 1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13]):
        dead.settle(dead.add_provisional([_block(1, offsets, delivery=2)]), set())
    assert _records(dead.take()) == 14
    dead.add([_block(1, [32], delivery=1)])  # fetcher._acknowledge → leave_cycle → Outbox.add


def test_a_settled_row_of_a_dead_process_is_counted_once_when_its_record_comes_again(tmp_path):
    _die_before_the_next_poll(tmp_path)

    retry = _began(tmp_path, TASK)  # the task run again, in the next process
    handed = retry.take()
    assert _records(handed) == 15, "0-13 handed to the task run again, and 32 settled after the take"

    # The broker never had 32's acknowledgement: it comes again (delivery 2), beside 20-31 (delivery 3),
    # which the dead process handled but never acknowledged (no row anywhere).
    messages = [*_messages(1, list(range(20, 32)), delivery=3), *_messages(1, [32], delivery=2)]
    poll = Poll(messages, time.monotonic() + 60)
    calls, suspects = _fetcher(retry, tmp_path)._calls(messages, poll)
    assert poll.results[12] is ALREADY_COUNTED_RESULT, "32 was counted by the row handed on: no call, no row"
    assert (list(calls), suspects) == (list(range(12)), []), "20-31 have no row: handled and counted now"
    outcome, ack = _fetcher(retry, tmp_path)._decide(
        MessageRecord.many(messages)[12], poll.results[12], 0, time.monotonic(), 1.0
    )
    assert (outcome, ack) == (None, AcknowledgeType.ACCEPT)


def test_the_redelivery_may_come_before_the_take(tmp_path):
    _die_before_the_next_poll(tmp_path)
    retry = _began(tmp_path, TASK)
    messages = _messages(1, [32], delivery=2)
    poll = Poll(messages, time.monotonic() + 60)
    calls, _ = _fetcher(retry, tmp_path)._calls(messages, poll)  # adopts the dead file itself first
    assert list(calls) == [] and poll.results[0] is ALREADY_COUNTED_RESULT
    assert _records(retry.take()) == 15, "and the rows are handed on all the same, once"


def test_a_released_row_of_a_dead_process_is_not_registered(tmp_path):
    """A record the dead process released must be handled again at its next delivery."""
    dead = Outbox(tmp_path, tag=DEAD)
    record = MessageRecord.many(_messages(0, [7]))[0]
    dead.add([columns_of([Outcome.of(record, RELEASED, Failure("SystemExit", "3"), 1.0, 1)])])
    outbox = Outbox(tmp_path)
    outbox.take()
    registered = json.loads((tmp_path / COUNTED).read_text()) if (tmp_path / COUNTED).exists() else []
    assert registered == []
    assert outbox.redelivered_counted([(0, 7, 2)]) == set()


def test_a_dead_lettered_row_of_a_dead_process_is_rejected_again_without_a_call(tmp_path):
    """The dead process wrote the DLQ copy and the row; its REJECT was to go with the next poll.
    The redelivery ends the same way: no call, no row, no second copy in the DLQ."""
    dead = Outbox(tmp_path, tag=DEAD)
    record = MessageRecord.many(_messages(0, [7]))[0]
    dead.add([columns_of([Outcome.of(record, DEAD_LETTERED, Failure("InvalidOutput", "got int"), 1.0, 1)])])
    retry = Outbox(tmp_path)
    messages = [*_messages(0, [7], delivery=2), *_messages(0, [8], delivery=2)]
    poll = Poll(messages, time.monotonic() + 60)
    calls, _ = _fetcher(retry, tmp_path)._calls(messages, poll)
    assert list(calls) == [1], "8 was never counted: it is handled"
    assert poll.results[0] is ALREADY_DEAD_RESULT
    outcome, ack = _fetcher(retry, tmp_path)._decide(
        MessageRecord.many(messages)[0], poll.results[0], 0, time.monotonic(), 1.0
    )
    assert (outcome, ack) == (None, AcknowledgeType.REJECT)
    assert _records(retry.take()) == 1, "the dead process's row, handed on: the record counts once, in the DLQ"
