"""A consumer task's writes without a callback each: what the process's producer reports decides
what the task commits. No broker: the producer is a stand-in that keeps what it was given, and
the failure reports are made as the real producer's callback makes them."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError
from helpers import AloneProducer

from queueplane.handler_api import InvalidOutput, Record
from queueplane.run.consumer.executor.partition import PartitionTask, TxnWrites
from queueplane.run.consumer.executor.process import ConsumerSettings
from queueplane.run.dead_letters import HEADER_PARKED
from queueplane.run.executor.crash_journal import CrashJournal
from queueplane.run.executor.failed_writes import AloneWrites, FailedWrites
from queueplane.run.outcomes import ACCEPTED, DEAD_LETTERED, RELEASED, Outcome, each_record


class Producer:
    """Takes every record; the test says which failed."""

    def __init__(self) -> None:
        self.written: list[tuple[str, bytes | None, bytes | None]] = []
        self.lock = threading.Lock()

    def produce(self, topic, value=None, key=None, **extra) -> None:
        with self.lock:
            self.written.append((topic, key, value))


class Reported:
    def __init__(self, topic: str, key: bytes | None, value: bytes | None):
        self._fields = (topic, key, value)

    def topic(self):
        return self._fields[0]

    def key(self):
        return self._fields[1]

    def value(self):
        return self._fields[2]


def _process(tmp_path) -> SimpleNamespace:
    settings = ConsumerSettings(
        kafka={},
        queue="q",
        group_id="g",
        dlq_topic="q.dlq",
        output_topic="q.out",
        lock_ms=5000,
        delivery_limit=3,
        handler="unused:unused",
        ordering="partition",
        slots=1,
        slot_queue=100,
        backoff_ms=1,
        max_backoff_ms=1,
        exactly_once=False,
    )
    producer = Producer()
    commits: list[int] = []
    return SimpleNamespace(
        settings=settings,
        handler=lambda record: record.value,  # echo
        journal=CrashJournal(tmp_path, alone_s=5),
        producer=producer,
        delivery=SimpleNamespace(all_delivered=lambda within_s: True, writes_open=True),
        failed_writes=FailedWrites(),
        committed=lambda topic, partition: None,
        commit=lambda topic, partition, offset: commits.append(offset),
        commits=commits,
    )


def _task(process: SimpleNamespace, count: int) -> PartitionTask:
    """A task of the process that has handled ``count`` records (echoed), none committed yet."""
    task = PartitionTask(process, "q", 0)
    task.feed([Record(b"k", b"value-%d" % i, (), "q", 0, i, 1, 0) for i in range(count)])
    for slot in task.slots:
        task._put(slot, None)
        assert slot.finished.wait(10)
    return task


def _outcomes(task: PartitionTask) -> dict[int, str]:
    """Each record's outcome, by offset, as the rows the task shows say (the accepted in runs)."""
    return {offset: outcome for block in task.drain() for _, offset, _, outcome in each_record(block)}


def _alone(task: PartitionTask, refused: set[tuple[str, bytes]]) -> AloneProducer:
    """The task writes its suspects again alone to a stand-in that refuses ``refused``."""
    producer = AloneProducer(refused)
    task.alone = AloneWrites(lambda: producer)
    return producer


def test_a_refused_output_turns_its_own_record_into_a_dead_letter_at_the_commit(tmp_path):
    process = _process(tmp_path)
    task = _task(process, 5)
    alone = _alone(task, {("q.out", b"value-3")})
    # The broker refused the output of offset 3, after it was sent, and again alone.
    process.failed_writes(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), Reported("q.out", b"k", b"value-3"))
    assert task.commit(5)
    assert alone.written == [("q.out", b"k", b"value-3")], "written again alone before it was turned"
    rows = _outcomes(task)
    assert rows == {0: ACCEPTED, 1: ACCEPTED, 2: ACCEPTED, 3: DEAD_LETTERED, 4: ACCEPTED}
    dead = [w for w in process.producer.written if w[0] == "q.dlq"]
    assert [value for _, _, value in dead] == [b"value-3"], "the dead letter carries the record"
    assert process.commits == [5]
    assert process.failed_writes.refusals == 0, "claimed once"


def test_an_output_refused_with_its_batch_but_taken_alone_leaves_its_record_accepted(tmp_path):
    """The broker refuses a batch whole: offset 1's output shared a batch with offset 3's."""
    process = _process(tmp_path)
    task = _task(process, 5)
    alone = _alone(task, {("q.out", b"value-3")})
    for offset in (1, 3):
        process.failed_writes(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), Reported("q.out", b"k", b"value-%d" % offset))
    assert task.commit(5)
    rows = _outcomes(task)
    assert rows == {0: ACCEPTED, 1: ACCEPTED, 2: ACCEPTED, 3: DEAD_LETTERED, 4: ACCEPTED}
    assert alone.written == [("q.out", b"k", b"value-1"), ("q.out", b"k", b"value-3")]
    dead = [w for w in process.producer.written if w[0] == "q.dlq"]
    assert [value for _, _, value in dead] == [b"value-3"], "only the output refused alone"
    assert process.commits == [5]


@pytest.mark.parametrize("alone_too", [False, True], ids=["taken-alone", "refused-alone"])
def test_a_dead_letter_refused_with_its_batch_is_parked_only_when_refused_alone(tmp_path, alone_too):
    task = _task(_process(tmp_path), 0)
    alone = _alone(task, {("q.dlq", b"value-0")} if alone_too else set())
    record = Record(b"k", b"value-0", (), "q", 0, 0, 1, 0)
    task._unparked.append((record, ("q.dlq", b"k", b"value-0", []), "refused with its batch"))
    task._park_refused()
    if not alone_too:
        assert alone.written == [("q.dlq", b"k", b"value-0")], "written again alone: in the DLQ, not parked"
        assert task._parked == {}
    else:
        assert alone.written == [("q.dlq", b"k", b"value-0"), ("q", b"k", b"value-0")], "then parked, alone"
        assert list(task._parked) == [0]


def test_another_tasks_refusal_is_left_for_it_and_costs_this_one_nothing(tmp_path):
    process = _process(tmp_path)
    task = _task(process, 3)
    process.failed_writes(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), Reported("q.out", b"k", b"not-ours"))
    assert task.commit(3)
    assert set(_outcomes(task).values()) == {ACCEPTED}
    assert process.failed_writes.refusals == 1 and process.commits == [3]


def test_records_settled_one_by_one_are_shown_with_the_quick_ones_and_not_kept_past_their_commit(tmp_path):
    """A record accepted after a retry settles on its own, with its outputs kept until its commit:
    shown beside the quick path's runs, and let go once committed."""
    process = _process(tmp_path)
    task = _task(process, 3)
    again = Record(b"k", b"value-3", (), "q", 0, 3, 2, 0)  # its second delivery, accepted
    task.tracker.add([3])
    task.settle(again, ACCEPTED, None, [("q.out", b"k", b"value-3", [])], 1.0, 1)
    assert list(task._written) == [3], "kept: the broker may still refuse its output"
    assert task.commit(4)
    assert _outcomes(task) == {0: ACCEPTED, 1: ACCEPTED, 2: ACCEPTED, 3: ACCEPTED}
    assert task._written == {}, "committed: nothing of it is kept"


def test_a_write_that_failed_otherwise_fails_the_task_before_it_commits(tmp_path):
    process = _process(tmp_path)
    task = _task(process, 3)
    process.failed_writes(KafkaError(KafkaError._MSG_TIMED_OUT), Reported("q.out", b"k", b"value-1"))
    with pytest.raises(RuntimeError, match=r"a write to q\.out failed"):
        task.commit(3)
    assert process.commits == [] and task.drain() == [], "nothing committed, no row shown"


def test_a_failure_reported_before_the_task_began_is_not_its_own(tmp_path):
    process = _process(tmp_path)
    process.failed_writes(KafkaError(KafkaError._MSG_TIMED_OUT), Reported("q.out", b"k", b"earlier"))
    task = _task(process, 2)
    assert task.commit(2) and process.commits == [2]


def test_a_record_refused_in_its_transaction_turns_into_a_dead_letter_then_a_parked_copy_never_both(tmp_path):
    """What the transaction written again holds in the refused record's place, and its row."""
    task = _task(_process(tmp_path), 0)
    record = Record(b"k", b"value-7", (("h", b"1"),), "q", 0, 7, 1, 0)
    entry = TxnWrites(record, Outcome.of(record, ACCEPTED, None, 5.0, 1), [("q.out", b"k", b"big", [])])

    task._turn_refused(entry, InvalidOutput("the record was refused: too large"))  # its output
    (dead,) = entry.produced
    assert dead[:3] == ("q.dlq", b"k", b"value-7") and entry.partition is None
    assert entry.row.outcome == DEAD_LETTERED and entry.row.error.startswith("InvalidOutput:")

    task._turn_refused(entry, InvalidOutput("the record was refused: too large"))  # its dead letter
    (parked,) = entry.produced
    assert parked == ("q", b"k", b"value-7", [*dead[3], (HEADER_PARKED, b"1")]), "the parked copy only"
    assert entry.partition == 0, "pinned to its record's own partition"
    assert entry.row.outcome == RELEASED and entry.row.error.startswith("DeadLetterWriteFailed: parked:")

    with pytest.raises(RuntimeError, match="parking it failed"):  # its parked copy: the task fails
        task._turn_refused(entry, InvalidOutput("the record was refused: too large"))
