"""A kmq record's end marker goes only once its writes are durable, in rounds, without a callback per record."""

from __future__ import annotations

import queue
import threading
import time
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError
from helpers import AloneProducer, Reported

from queueplane.handler_api import Record
from queueplane.run.executor.failed_writes import AloneWrites, FailedWrites
from queueplane.run.kmq import markers as km
from queueplane.run.kmq.executor.tasks import KmqTask

LOCK_MS = 1000
MARKERS, OUTPUT, DLQ, QUEUE = "q.markers", "q.out", "q.dlq", "q"


class _Producer:
    """Keeps what was produced, in order, with each write's error callback."""

    def __init__(self):
        self.produced: list[tuple[str, bytes | None, bytes | None, object]] = []
        self._lock = threading.Lock()

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None, partition=None):
        with self._lock:
            self.produced.append((topic, key, value, on_delivery))

    def topics(self) -> list[str]:
        with self._lock:
            return [topic for topic, _, _, _ in self.produced]


class _Delivery:
    """``all_delivered`` as the test says: nothing in flight (True) or a producer never idle (False)."""

    def __init__(self, task_of):
        self.idle = False
        self.task_of = task_of
        self.held = []  # whether the task held its handler threads' writes during each blocking wait

    def all_delivered(self, within_s: float) -> bool:
        if within_s > 1:  # the task's blocking wait: its handler threads write nothing meanwhile
            self.held.append(not self.task_of()._may_produce.is_set())
            return True
        return self.idle


def _task(
    records: int = 2, failed_writes: FailedWrites | None = None, alone: AloneProducer | None = None
) -> tuple[KmqTask, _Producer, _Delivery, queue.SimpleQueue]:
    """``alone``: where the task writes its suspects again, each alone."""
    producer = _Producer()
    holder: list[KmqTask] = []
    delivery = _Delivery(lambda: holder[0])
    jobs: queue.SimpleQueue = queue.SimpleQueue()
    settings = SimpleNamespace(
        lock_ms=LOCK_MS, markers_topic=MARKERS, dlq_topic=DLQ, backoff_ms=100, max_backoff_ms=100, delivery_limit=3
    )
    process = SimpleNamespace(
        settings=settings,
        producer=producer,
        delivery=delivery,
        threads=SimpleNamespace(jobs=jobs),
        failed_writes=failed_writes or FailedWrites(),
        alone=AloneWrites(lambda: alone or AloneProducer()),
    )
    rows = [SimpleNamespace(partition=0, offset=offset, delivery_count=1) for offset in range(records)]
    task = KmqTask(process, rows)
    holder.append(task)
    return task, producer, delivery, jobs


def _marker_records(producer: _Producer) -> list[tuple[bytes, bytes]]:
    return [(key, value) for topic, key, value, _ in producer.produced if topic == MARKERS]


def _markers(producer: _Producer) -> list[int]:
    """The offsets of the records whose markers were produced."""
    produced = [(key, value) for topic, key, value, _ in producer.produced if topic == MARKERS]
    return [marker.offset for key, value in produced for marker in km.decode(key, value)]


def test_an_end_marker_waits_for_a_moment_with_every_write_acknowledged():
    task, producer, delivery, _ = _task()
    task._write_then_end(0, [(OUTPUT, b"k", b"v", [])], km.END)
    task._end_round(0.0)
    assert producer.topics() == [OUTPUT], "the output is in flight: no end marker yet"
    delivery.idle = True
    task._end_round(0.0)
    assert producer.topics() == [OUTPUT, MARKERS]
    assert _markers(producer) == [0]
    assert task._unsettled == 1, "one record settled, one to go"


def test_under_writes_that_never_pause_the_task_holds_them_once_a_marker_is_due():
    task, producer, delivery, _ = _task()
    task._write_then_end(0, [(OUTPUT, b"k", b"v", [])], km.END)
    task._end_round(0.0)
    assert not delivery.held, "not due yet: the round waits for the producer to be idle by itself"
    time.sleep(LOCK_MS / 1000 * 0.25)  # older than the share of the lock a marker may wait
    task._end_round(0.0)
    assert delivery.held == [True], "the handler threads' writes were held while the task waited"
    assert task._may_produce.is_set(), "and let go after"
    assert _markers(producer) == [0]


def test_records_not_started_by_the_deadline_are_released_and_one_still_running_gets_no_marker():
    task, producer, delivery, _ = _task(records=3)
    _records(task)
    delivery.idle = True
    task.deadline = time.monotonic() + 0.3
    task._running[0] = time.monotonic()  # its call is running; 1 and 2 never got a thread
    added: list[int] = []
    task.process.threads.add = added.append
    task.wait()
    assert added == [1], "a new thread stands in for the one stuck in the call"
    produced = [m for key, value in _marker_records(producer) for m in km.decode(key, value)]
    assert [(m.offset, m.kind, m.delivery_count) for m in produced] == [(1, km.RELEASE, 1), (2, km.RELEASE, 1)]
    rows = {row.offset: (row.outcome, row.error) for row in task.drain()}
    assert {offset: outcome for offset, (outcome, _) in rows.items()} == {0: "released", 1: "released", 2: "released"}
    assert "ran past lockDuration" in rows[0][1] and "not started" in rows[1][1] and "not started" in rows[2][1]
    task.process.journal = SimpleNamespace(crashes={})
    task.run(1, [])  # a handler thread that reaches it now finds it ended
    assert len(_marker_records(producer)) == 1, "no second marker"


def test_a_record_a_thread_takes_after_the_deadline_is_released_without_a_call():
    called = []
    task, producer, delivery, _ = _task(records=1)
    _records(task)
    task.process.handler = called.append
    task.process.journal = SimpleNamespace(crashes={}, call=lambda *a, **k: called.append(a))
    delivery.idle = True
    task.deadline = time.monotonic() - 1
    task.run(0, [])
    task._end_round(0.0)
    assert called == []
    assert [m.kind for key, value in _marker_records(producer) for m in km.decode(key, value)] == [km.RELEASE]


def _calls(task: KmqTask, handler) -> None:
    """The handler as the process's journal calls it: ``handler(record)``."""
    task.process.handler = handler
    task.process.journal = SimpleNamespace(crashes={}, call=lambda _p, _o, h, record, delivery: h(record))


def test_quick_calls_settle_in_runs_each_record_with_its_row_and_end_marker():
    task, producer, delivery, _ = _task(records=3)
    _records(task)
    _calls(task, lambda record: None)
    delivery.idle = True
    task.deadline = time.monotonic() + 10
    task._unsettled = 3
    task._queued.extend(range(3))
    task.run_queued()
    assert task._claimed == [True, True, True] and task._runs == []
    task._end_round(0.0)
    assert _markers(producer) == [0, 1, 2]
    assert [(row.offset, row.outcome) for row in task.drain()] == [(0, "accepted"), (1, "accepted"), (2, "accepted")]


def test_at_the_deadline_a_stuck_thread_s_accepted_run_ends_and_only_its_running_call_is_given_up():
    """Records 0 and 1 were accepted and wait in their thread's run; the thread is stuck in 2."""
    task, producer, delivery, _ = _task(records=3)
    _records(task)
    delivery.idle = True
    task._unsettled = 3
    _calls(task, lambda record: None)
    task.deadline = time.monotonic() + 10
    run = [task.run(0, []), task.run(1, [])]
    assert all(item is not None for item in run), "quick calls come back for their thread's run"
    task._runs.append(run)
    task._running[2] = time.monotonic()
    task.deadline = time.monotonic()
    task.process.threads.add = lambda count: None
    task.wait()
    assert _markers(producer) == [0, 1], "the accepted records end; the stuck call gets no marker"
    rows = {row.offset: (row.outcome, row.error) for row in task.drain()}
    assert rows[0] == ("accepted", None) and rows[1] == ("accepted", None)
    assert rows[2][0] == "released" and "ran past lockDuration" in rows[2][1]


def test_a_call_given_up_while_it_ran_is_dropped_when_its_thread_settles_its_run():
    """The task's thread reaches the deadline during the call: no end marker, the one released row."""
    task, producer, delivery, _ = _task(records=1)
    _records(task)
    delivery.idle = True
    task.deadline = time.monotonic() + 10
    task._unsettled = 1
    task.process.threads.add = lambda count: None

    def deadline_passes(record):
        task.deadline = time.monotonic()
        waiter = threading.Thread(target=task.wait)
        waiter.start()
        waiter.join(10)

    _calls(task, deadline_passes)
    task._queued.append(0)
    task.run_queued()
    task._end_round(0.0)
    assert _markers(producer) == []
    assert [(row.offset, row.outcome) for row in task.drain()] == [(0, "released")]


def test_a_handler_thread_waits_with_its_writes_while_they_are_held():
    task, producer, _, _ = _task()
    task._may_produce.clear()
    writer = threading.Thread(target=task._write_then_end, args=(1, [(OUTPUT, b"k", b"v", [])], km.END))
    writer.start()
    writer.join(0.2)
    assert writer.is_alive() and producer.topics() == []
    task._may_produce.set()
    writer.join(2)
    assert producer.topics() == [OUTPUT]


def _records(task: KmqTask) -> None:
    for offset in range(len(task.records)):
        task.records[offset] = Record(b"k", b"in", (), QUEUE, 0, offset, 1, 0)
    task.first_ms = 0


def _confirmed(task: KmqTask) -> None:
    """The records whose writes were refused, written again alone on threads of their own."""
    assert task.confirming, "a refused write is written again alone"
    for thread in task.confirming:
        thread.join(10)


def test_a_refused_output_gets_no_end_marker_and_turns_into_a_dead_letter_once_refused_alone():
    alone = AloneProducer({(OUTPUT, b"big")})
    task, producer, delivery, _ = _task(alone=alone)
    _records(task)
    task._write_then_end(0, [(OUTPUT, b"k", b"big", [])], km.END)
    task._write_then_end(1, [(OUTPUT, b"k", b"v", [])], km.END)
    refused_callback = producer.produced[0][3]
    refused_callback(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), Reported(OUTPUT, b"k", b"big"))
    delivery.idle = True
    task._end_round(0.0)
    assert _markers(producer) == [1], "record 0's outputs were refused: it ends later"
    assert task._unsettled == 1
    _confirmed(task)
    assert alone.written == [(OUTPUT, b"k", b"big")], "written again alone first"
    assert producer.topics()[-1] == DLQ, "refused alone: a dead letter"


def test_an_output_refused_with_its_batch_but_taken_alone_ends_its_record_accepted():
    """The broker refuses a batch whole: record 0's small output shared a batch with a big one."""
    alone = AloneProducer()
    task, producer, delivery, _ = _task(records=1, alone=alone)
    _records(task)
    task._report(task.records[0], "accepted", None, 1.0)
    task._write_then_end(0, [(OUTPUT, b"k", b"v", [])], km.END)
    producer.produced[0][3](KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), Reported(OUTPUT, b"k", b"v"))
    delivery.idle = True
    task._end_round(0.0)
    assert _markers(producer) == []
    _confirmed(task)
    assert alone.written == [(OUTPUT, b"k", b"v")]
    task._end_round(0.0)
    assert _markers(producer) == [0] and DLQ not in producer.topics() and task._error is None
    assert [row.outcome for row in task.drain()] == ["accepted"]


def test_a_failed_dead_letter_write_fails_the_task_and_writes_no_marker():
    task, producer, delivery, _ = _task(records=1)
    task._write_then_end(0, [(DLQ, b"k", b"v", [])], km.END)
    producer.produced[0][3](KafkaError(KafkaError._MSG_TIMED_OUT), Reported(DLQ, b"k", b"v"))
    delivery.idle = True
    task._end_round(0.0)
    assert _markers(producer) == []
    assert task._error is not None and "0:0" in task._error


def test_a_dead_letter_the_dlq_refuses_is_parked_in_the_queue_topic_and_then_ends():
    """Refused on every try alike, it would fail every retry of the task: the partition would stall."""
    alone = AloneProducer({(DLQ, b"v")})
    task, producer, delivery, _ = _task(records=1, alone=alone)
    task.records[0] = SimpleNamespace(topic=QUEUE, partition=0, offset=0, delivery_count=3, key=b"k", headers=None)
    task._write_then_end(0, [(DLQ, b"k", b"v", [])], km.END)
    producer.produced[0][3](KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), Reported(DLQ, b"k", b"v"))
    delivery.idle = True
    task._end_round(0.0)
    assert _markers(producer) == [] and task._error is None, "no end marker before the parked copy is durable"
    _confirmed(task)
    assert alone.written == [(DLQ, b"k", b"v"), (QUEUE, b"k", b"v")], "refused alone, then parked alone"
    task._end_round(0.0)
    assert _markers(producer) == [0] and task._error is None
    (row,) = task.drain()
    assert row.outcome == "released" and row.error.startswith("DeadLetterWriteFailed: parked:")


@pytest.mark.parametrize("code", [KafkaError._MSG_TIMED_OUT, KafkaError.MSG_SIZE_TOO_LARGE], ids=["lost", "refused"])
def test_a_marker_that_failed_after_the_task_began_fails_it_and_one_before_does_not(code):
    failed = FailedWrites()
    failed(KafkaError(KafkaError._MSG_TIMED_OUT), Reported(MARKERS, b"0:99", b""))  # an earlier task's
    task, producer, delivery, _ = _task(records=1, failed_writes=failed)
    delivery.idle = True
    task._write_durably({(0, km.START, 1, 0, 0): [0]})  # no failure since it began: it goes on
    assert [topic for topic, _, _, _callback in producer.produced] == [MARKERS]
    assert producer.produced[0][3] is None, "a marker carries no callback of its own"

    failed(KafkaError(code), Reported(MARKERS, b"0:0", b""))
    with pytest.raises(RuntimeError, match=f"a write to {MARKERS} failed"):
        task._write_durably({})
