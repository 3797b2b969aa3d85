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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import AcknowledgeType, KafkaException, Message, Producer, ShareConsumer

from queueplane.dlq import Failure, dlq_headers
from queueplane.handler import Handler, Output, Record, Reject, Retry, load_handler, outputs_of

log = logging.getLogger("queueplane.worker")

# Columns of one outcome row: the streaming query's output.
OUTCOME_SCHEMA = (
    "topic string, partition int, offset long, key string, delivery_count int, outcome string, "
    "error string, latency_ms double, inflight int"
)
ACCEPTED, RELEASED, DEAD_LETTERED = "accepted", "released", "dlq"
FINAL_OUTCOMES = (ACCEPTED, DEAD_LETTERED)

HANDLER_SHARE_OF_LOCK = 0.7  # a handler gets 70% of the lock; the rest is for outputs and the ack
DELIVERY_TIMEOUT_S = 30.0


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


@dataclass
class Outcome:
    topic: str
    partition: int
    offset: int
    key: str | None
    delivery_count: int
    outcome: str
    error: str | None
    latency_ms: float
    inflight: int

    def row(self) -> tuple:
        return (
            self.topic,
            self.partition,
            self.offset,
            self.key,
            self.delivery_count,
            self.outcome,
            self.error,
            self.latency_ms,
            self.inflight,
        )


class _HandlerTimeout(Exception):
    pass


class _HandlerThread:
    """Runs handler calls on a daemon thread, so a call that overruns its deadline can be abandoned.

    A Python thread cannot be killed; an overrunning call keeps its thread, which is left
    behind (daemon, so it never blocks process exit) while the slot gets a fresh one.
    """

    def __init__(self, name: str):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            fn, arg, box, done = item
            try:
                box.append((True, fn(arg)))
            except BaseException as exc:
                box.append((False, exc))
            done.set()

    def call(self, fn: Callable[[Record], Any], arg: Record, timeout: float) -> Any:
        box: list = []
        done = threading.Event()
        self._calls.put((fn, arg, box, done))
        if not done.wait(timeout):
            self._calls.put(None)  # lets the thread end if the call ever returns
            raise _HandlerTimeout(f"handler ran past its deadline of {timeout:.1f}s")
        ok, value = box[0]
        if ok:
            return value
        raise value


class _InFlight:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def __enter__(self) -> int:
        with self._lock:
            self.count += 1
            return self.count

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.count -= 1


class ProcessRuntime:
    """One per Python worker process and queue: the producer, the handler and the slots."""

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
        self.slots: list[ShareSlot] = []
        self.inflight = _InFlight()
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

    def produce_and_wait(self, records: list[tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]]) -> None:
        """Produce and block until every record is acknowledged by the brokers (durable), or raise."""
        if not records:
            return
        pending = threading.Semaphore(0)
        errors: list[str] = []

        def delivered(err: Any, _msg: Message) -> None:
            if err is not None:
                errors.append(str(err))
            pending.release()

        for topic, key, value, headers in records:
            while True:
                try:
                    self.producer.produce(topic, value=value, key=key, headers=headers, on_delivery=delivered)
                    break
                except BufferError:
                    time.sleep(0.01)  # local queue full: the delivery thread drains it
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        for _ in records:
            if not pending.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"outputs not delivered within {DELIVERY_TIMEOUT_S:.0f}s")
        if errors:
            raise RuntimeError(f"output delivery failed: {errors[0]}")

    def run_batch(self) -> list[Outcome]:
        """Lend every slot the batch's time budget, in parallel; return what they did."""
        with self._batch_lock:  # two tasks in one process never share slots
            while len(self.slots) < self.settings.slots:
                self.slots.append(ShareSlot(self, len(self.slots)))
            deadline = time.monotonic() + self.settings.batch_ms / 1000
            results: list[list[Outcome]] = [[] for _ in self.slots]
            threads = [
                threading.Thread(target=lambda i=i, s=s: results[i].extend(s.run(deadline)), name=f"qp-slot-{i}")
                for i, s in enumerate(self.slots)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return [o for r in results for o in r]

    def close(self) -> None:
        for slot in self.slots:
            slot.close()
        self._stop.set()
        with contextlib.suppress(Exception):
            self.producer.flush(10)


class ShareSlot:
    """One slot: a ShareConsumer in explicit acknowledgement mode and its handler thread."""

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
        self.handler_thread = _HandlerThread(f"qp-handler-{index}")
        self._closed = False

    def run(self, deadline: float) -> list[Outcome]:
        outcomes: list[Outcome] = []
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
            for message in messages:
                if message.error():
                    log.warning("share consumer error: %s", message.error())
                    continue
                outcome, ack = self.handle(message, polled_at)
                self.consumer.acknowledge(message, ack)
                outcomes.append(outcome)
            try:
                self.consumer.commit_sync()
            except KafkaException as exc:
                # The broker redelivers what it did not record; outcomes stay as the handler decided.
                log.warning("acknowledgement commit failed: %s", exc)
        return outcomes

    def handle(self, message: Message, polled_at: float) -> tuple[Outcome, int]:
        s = self.runtime.settings
        record = Record(
            key=message.key(),
            value=message.value(),
            headers=tuple(message.headers() or ()),
            topic=message.topic(),
            partition=message.partition(),
            offset=message.offset(),
            delivery_count=message.delivery_count() or 1,
            timestamp=message.timestamp()[1],
        )
        now_ms = int(time.time() * 1000)
        first_ms = self.runtime.first_attempt(record, now_ms)
        started = time.monotonic()
        lock_s = s.lock_ms / 1000
        # Both the handler's share of the lock and what remains of the lock acquired at poll time.
        budget = min(lock_s * HANDLER_SHARE_OF_LOCK, polled_at + lock_s * 0.9 - started)
        inflight = 0
        try:
            if budget <= 0:
                raise _HandlerTimeout("the acquisition lock ran out before the handler could start")
            with self.runtime.inflight as inflight:
                result = self.handler_thread.call(self.runtime.handler, record, budget)
            self.runtime.produce_and_wait([self._output(o, record) for o in outputs_of(result)])
            return self._outcome(record, ACCEPTED, None, started, inflight), AcknowledgeType.ACCEPT
        except _HandlerTimeout as exc:
            self.handler_thread = _HandlerThread(f"qp-handler-{self.index}")
            failure = Failure("Timeout", str(exc))
        except Reject as exc:
            return self._dead_letter(record, Failure.of(exc), first_ms, started, inflight)
        except Retry as exc:
            failure = Failure.of(exc)
        except Exception as exc:
            failure = Failure.of(exc)
        if record.delivery_count >= s.delivery_limit:
            return self._dead_letter(record, failure, first_ms, started, inflight)
        return self._outcome(record, RELEASED, failure, started, inflight), AcknowledgeType.RELEASE

    def _output(self, output: Output, record: Record) -> tuple[str, bytes | None, bytes | None, list]:
        topic = output.topic or self.runtime.settings.output_topic
        if topic is None:
            raise RuntimeError("the handler returned outputs but the spec names no processing.output.topic")
        key, value, headers = output.encoded()
        return (topic, key if output.key is not None else record.key, value, headers)

    def _dead_letter(
        self, record: Record, failure: Failure, first_ms: int, started: float, inflight: int
    ) -> tuple[Outcome, int]:
        headers = dlq_headers(
            record.headers,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            delivery_count=record.delivery_count,
            failure=failure,
            first_attempt_ms=first_ms,
            last_attempt_ms=int(time.time() * 1000),
        )
        try:
            self.runtime.produce_and_wait([(self.runtime.settings.dlq_topic, record.key, record.value, headers)])
        except Exception as exc:
            # Never REJECT what the DLQ did not take: release it, the broker delivers it again.
            return (
                self._outcome(record, RELEASED, Failure("DeadLetterWriteFailed", str(exc)), started, inflight),
                AcknowledgeType.RELEASE,
            )
        return self._outcome(record, DEAD_LETTERED, failure, started, inflight), AcknowledgeType.REJECT

    @staticmethod
    def _outcome(record: Record, outcome: str, failure: Failure | None, started: float, inflight: int) -> Outcome:
        return Outcome(
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=record.key.decode("utf-8", "replace") if record.key is not None else None,
            delivery_count=record.delivery_count,
            outcome=outcome,
            error=f"{failure.error_class}: {failure.message}" if failure else None,
            latency_ms=(time.monotonic() - started) * 1000,
            inflight=inflight,
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(Exception):
                self.consumer.close()


_RUNTIMES: dict[str, ProcessRuntime] = {}
_RUNTIMES_LOCK = threading.Lock()


def runtime_for(settings: ShareSettings) -> ProcessRuntime:
    """This process's runtime for a queue, created on first use and kept for later batches."""
    key = settings.to_json()
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
