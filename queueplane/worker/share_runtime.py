"""The share-group runtime that runs inside Spark's Python workers (KIP-932).

Each worker process keeps its ShareConsumers for its whole life, one per slot thread, so
consumers stay group members across micro-batches instead of joining and leaving every
batch; they leave the group when the process exits. A micro-batch task lends the slots a
time budget: each slot polls a few records, runs the handler under a deadline shorter
than the acquisition lock, makes outputs and dead-letter records durable, and only then
acknowledges (ACCEPT, RELEASE or REJECT) and commits the acknowledgements.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field

from confluent_kafka import AcknowledgeType, KafkaException, Message, Producer, ShareConsumer

from queueplane.dlq import Failure
from queueplane.handler import Handler, Output, Record, Reject, load_handler, outputs_of
from queueplane.worker.outcomes import (
    ACCEPTED,
    DEAD_LETTERED,
    DELIVERY_TIMEOUT_S,
    RELEASED,
    Outcome,
    ProducedRecord,
    dead_letter_record,
    output_record,
    produce_and_wait,
)

log = logging.getLogger("queueplane.worker")

HANDLER_SHARE_OF_LOCK = 0.7  # a handler gets 70% of the lock; the rest is for outputs and the ack
FETCHER_SHARE = 4  # one ShareConsumer per this many handler threads (at least two a process)


@dataclass(frozen=True)
class ShareSettings:
    """Everything an executor needs, sent from the driver as JSON (no spec parsing on executors)."""

    kafka: dict[str, str]
    queue: str
    topic: str
    group_id: str
    dlq_topic: str
    output_topic: str | None
    lock_ms: int
    delivery_limit: int
    handler: str
    search_paths: list[str] = field(default_factory=list)
    slots: int = 8
    max_poll_records: int = 5
    batch_ms: int = 1000

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ShareSettings:
        return cls(**json.loads(text))


class _Call:
    """One handler call handed to the pool; the fetcher that owns the record waits on it.

    A call the fetcher gave up on (deadline passed) is abandoned: if the handler returns
    later, its outputs are dropped, so a released record never also produces output.
    """

    RUNNING, PRODUCING, DONE, ABANDONED = range(4)

    def __init__(self, record: Record, budget_s: float):
        self.record = record
        self.budget_s = budget_s
        self.state = _Call.RUNNING
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.result: tuple[str, Failure | None] | None = None
        self.inflight = 0
        self.started = time.monotonic()


class HandlerPool:
    """``size`` daemon threads running handler calls for every fetcher of the process.

    A call stuck past its deadline keeps its thread (a Python thread cannot be stopped);
    the pool starts a replacement so the number of usable threads stays ``size``.
    """

    def __init__(self, runtime: ProcessRuntime, size: int):
        self.runtime = runtime
        self.size = size
        self.calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.live = 0
        self.inflight = 0
        for _ in range(size):
            self._spawn()

    def _spawn(self) -> None:
        with self.lock:
            self.live += 1
        threading.Thread(target=self._loop, name="qp-handler", daemon=True).start()

    def replace_stuck(self) -> None:
        self._spawn()

    def _loop(self) -> None:
        while True:
            call = self.calls.get()
            self._run(call)
            with self.lock:
                if self.live > self.size:  # a replacement took this thread's place while it was stuck
                    self.live -= 1
                    return

    def _run(self, call: _Call) -> None:
        s = self.runtime.settings
        remaining = call.budget_s - (time.monotonic() - call.started)
        if remaining <= 0:
            return self._finish(call, (RELEASED, Failure("Timeout", "the lock ran out before the handler started")))
        with self.lock:
            self.inflight += 1
            call.inflight = self.inflight
        try:
            outputs = outputs_of(self.runtime.handler(call.record))
            with call.lock:
                if call.state == _Call.ABANDONED:
                    return None
                call.state = _Call.PRODUCING
            self.runtime.produce_and_wait([self.runtime.output_record(o, call.record) for o in outputs])
            result: tuple[str, Failure | None] = (ACCEPTED, None)
        except Reject as exc:
            result = (DEAD_LETTERED, Failure.of(exc))
        except Exception as exc:  # Retry and any other exception: another delivery, unless this was the last
            result = (RELEASED, Failure.of(exc))
        finally:
            with self.lock:
                self.inflight -= 1
        if result[0] == RELEASED and call.record.delivery_count >= s.delivery_limit:
            result = (DEAD_LETTERED, result[1])
        return self._finish(call, result)

    @staticmethod
    def _finish(call: _Call, result: tuple[str, Failure | None]) -> None:
        with call.lock:
            if call.state == _Call.ABANDONED:
                return
            call.state = _Call.DONE
            call.result = result
        call.done.set()


class ProcessRuntime:
    """One per Python worker process and queue: producer, handler, handler pool and fetchers."""

    def __init__(self, settings: ShareSettings):
        from queueplane.cluster import quiet_logger

        self.settings = settings
        self.handler: Handler = load_handler(settings.handler, settings.search_paths)
        self.producer = Producer(
            {
                **settings.kafka,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 1,
                "logger": quiet_logger(),
            }
        )
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._serve_deliveries, name="qp-delivery", daemon=True)
        self._poller.start()
        self.pool = HandlerPool(self, settings.slots)
        self.fetchers: list[ShareFetcher] = []
        # First attempt times this process saw, for the DLQ headers (bounded).
        self.first_attempts: OrderedDict[tuple[str, int, int], int] = OrderedDict()
        self._first_lock = threading.Lock()
        self._batch_lock = threading.Lock()

    def _serve_deliveries(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.05)

    def first_attempt(self, record: Record, now_ms: int) -> int:
        key = (record.topic, record.partition, record.offset)
        with self._first_lock:
            first = self.first_attempts.setdefault(key, now_ms)
            self.first_attempts.move_to_end(key)
            while len(self.first_attempts) > 100_000:
                self.first_attempts.popitem(last=False)
            return first

    def output_record(self, output: Output, record: Record) -> ProducedRecord:
        return output_record(output, record, self.settings.output_topic)

    def produce_and_wait(self, records: list[ProducedRecord]) -> None:
        produce_and_wait(self.producer, records)

    def run_batch(self) -> list[Outcome]:
        """Lend every fetcher the batch's time budget, in parallel; return what they did."""
        with self._batch_lock:  # two tasks in one process never share fetchers
            # At least two: one polls while the other waits for the tail of its poll.
            wanted = max(2, -(-self.settings.slots // FETCHER_SHARE))
            while len(self.fetchers) < wanted:
                self.fetchers.append(ShareFetcher(self, len(self.fetchers)))
            deadline = time.monotonic() + self.settings.batch_ms / 1000
            results: list[list[Outcome]] = [[] for _ in self.fetchers]
            threads = [
                threading.Thread(target=lambda i=i, f=f: results[i].extend(f.run(deadline)), name=f"qp-fetch-{i}")
                for i, f in enumerate(self.fetchers)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return [o for r in results for o in r]

    def close(self) -> None:
        for fetcher in self.fetchers:
            fetcher.close()
        self._stop.set()
        with contextlib.suppress(Exception):
            self.producer.flush(10)


class ShareFetcher:
    """A ShareConsumer in explicit acknowledgement mode feeding the process's handler pool.

    It hands every record of a poll to the pool at once, so one slow record does not hold
    up the others locked by the same poll, and acknowledges each as soon as its outcome is
    durable; acknowledgements ride on the next poll or are committed when time runs short.
    """

    def __init__(self, runtime: ProcessRuntime, index: int):
        from queueplane.cluster import quiet_logger

        self.runtime = runtime
        self.index = index
        s = runtime.settings
        self.consumer = ShareConsumer(
            {
                **s.kafka,
                "group.id": s.group_id,
                "share.acknowledgement.mode": "explicit",
                "max.poll.records": s.max_poll_records,
                "client.id": f"queueplane-{s.queue}-{os.getpid()}-{index}",
                "logger": quiet_logger(),
            }
        )
        self.consumer.subscribe([s.topic])
        self._closed = False

    def run(self, deadline: float) -> list[Outcome]:
        outcomes: list[Outcome] = []
        pending = False
        while time.monotonic() < deadline and not self._closed:
            try:
                messages = self.consumer.poll(min(0.2, max(0.01, deadline - time.monotonic())))
            except KafkaException as exc:
                log.warning("share poll failed: %s", exc)
                time.sleep(0.2)
                continue
            if not messages:
                continue
            polled_at = time.monotonic()
            calls = []
            for message in messages:
                if message.error():
                    log.warning("share consumer error: %s", message.error())
                    continue
                record = _record(message)
                self.runtime.first_attempt(record, int(time.time() * 1000))
                call = _Call(record, self._budget(polled_at))
                self.runtime.pool.calls.put(call)
                calls.append((message, call))
            for message, call in calls:
                outcome, ack = self._settle(call)
                self.consumer.acknowledge(message, ack)
                outcomes.append(outcome)
                pending = True
            if time.monotonic() - polled_at > self.runtime.settings.lock_ms / 2000:
                pending = not self._commit()
        if pending:
            self._commit()
        return outcomes

    def _budget(self, polled_at: float) -> float:
        lock_s = self.runtime.settings.lock_ms / 1000
        return max(0.0, min(lock_s * HANDLER_SHARE_OF_LOCK, polled_at + lock_s * 0.9 - time.monotonic()))

    def _settle(self, call: _Call) -> tuple[Outcome, int]:
        """Wait for the call within its budget; give up on it (RELEASE or DLQ) when the budget is spent."""
        if not call.done.wait(max(0.0, call.budget_s - (time.monotonic() - call.started))):
            with call.lock:
                producing = call.state == _Call.PRODUCING
                if not producing and call.state != _Call.DONE:
                    call.state = _Call.ABANDONED
            if producing or call.state == _Call.DONE:
                call.done.wait(DELIVERY_TIMEOUT_S)  # outputs are on their way: let them land
            else:
                self.runtime.pool.replace_stuck()
                failure = Failure("Timeout", f"handler ran past its deadline of {call.budget_s:.1f}s")
                final = call.record.delivery_count >= self.runtime.settings.delivery_limit
                return self._decide(call, DEAD_LETTERED if final else RELEASED, failure)
        if call.result is None:  # outputs still not delivered: another delivery may duplicate them, never lose
            return self._decide(call, RELEASED, Failure("OutputTimeout", "outputs not delivered in time"))
        return self._decide(call, *call.result)

    def _decide(self, call: _Call, outcome: str, failure: Failure | None) -> tuple[Outcome, int]:
        record = call.record
        if outcome == DEAD_LETTERED:
            now_ms = int(time.time() * 1000)
            dead = dead_letter_record(
                record,
                self.runtime.settings.dlq_topic,
                record.delivery_count,
                failure or Failure("Unknown", ""),
                self.runtime.first_attempt(record, now_ms),
                now_ms,
            )
            try:
                self.runtime.produce_and_wait([dead])
            except Exception as exc:
                # Never REJECT what the DLQ did not take: release it, the broker delivers it again.
                return _outcome(call, RELEASED, Failure("DeadLetterWriteFailed", str(exc))), AcknowledgeType.RELEASE
            return _outcome(call, DEAD_LETTERED, failure), AcknowledgeType.REJECT
        ack = AcknowledgeType.ACCEPT if outcome == ACCEPTED else AcknowledgeType.RELEASE
        return _outcome(call, outcome, failure), ack

    def _commit(self) -> bool:
        try:
            results = self.consumer.commit_sync()
            failed = {tp: err for tp, err in (results or {}).items() if err is not None}
            if failed:
                log.warning("acknowledgements not recorded for %s", failed)
            return not failed
        except KafkaException as exc:
            # The broker redelivers what it did not record; outcomes stay as the handler decided.
            log.warning("acknowledgement commit failed: %s", exc)
            return False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(Exception):
                self.consumer.close()


def _record(message: Message) -> Record:
    return Record(
        key=message.key(),
        value=message.value(),
        headers=tuple(message.headers() or ()),
        topic=message.topic(),
        partition=message.partition(),
        offset=message.offset(),
        delivery_count=message.delivery_count() or 1,
        timestamp=message.timestamp()[1],
    )


def _outcome(call: _Call, outcome: str, failure: Failure | None) -> Outcome:
    return Outcome.of(call.record, outcome, failure, (time.monotonic() - call.started) * 1000, call.inflight)


_RUNTIMES: dict[str, ProcessRuntime] = {}
_RUNTIMES_LOCK = threading.Lock()


def runtime_for(settings: ShareSettings) -> ProcessRuntime:
    """This process's runtime for a queue, created on first use and kept for later batches."""
    key = settings.to_json()
    if not logging.getLogger().handlers:  # Spark's Python workers: log to stderr, which Spark keeps
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s [pid %(process)d]: %(message)s"
        )
    with _RUNTIMES_LOCK:
        runtime = _RUNTIMES.get(key)
        if runtime is None:
            runtime = _RUNTIMES[key] = ProcessRuntime(settings)
        return runtime


@atexit.register
def _close_all() -> None:
    """Leave the share group cleanly when Spark stops the worker process."""
    for runtime in list(_RUNTIMES.values()):
        runtime.close()
