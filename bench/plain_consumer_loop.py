"""The consumer-group baseline a team would write instead of a worker: confluent-kafka, one process per core.

At-least-once the usual way: consume a batch, produce each record's output, wait until the
producer has delivered them all, then commit the batch's offsets. Set up as its users would
set it up for speed, and as durable as the worker:
- batches of up to ``BATCH`` records per ``consume()`` (librdkafka prefetches behind them);
- the producer idempotent with ``acks=all`` (as the worker's), lingering 5 ms to fill its batches;
- the commit asynchronous: the outputs are delivered before it, so a lost commit only redelivers;
- as many processes as cores, in one consumer group, so the partitions are split between them as
  between a worker's Python workers.

A record counts as finished when its output becomes visible to a read_committed reader of the
output topic, as the worker's do (bench/consumer.py times both sides with the same reader).

With ``duties`` the loop also does, per record, what any worker must beside the loop's own work,
in whatever design: build the handler's record, call the handler under a clock, turn what it
returned into records to produce, and count the outcome and its latency (in aggregate, not a row
per record). Its rate against the plain loop's, in the same run, bounds what any worker can
reach against the plain loop on the same machine.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer

from queueplane.handler_api import outputs_of
from queueplane.run.executor.handler import MessageRecord, load_handler
from queueplane.run.executor.outputs import output_record
from queueplane.run.outcomes import produce

BATCH = 2000
# How long one consume() waits for a batch to fill; a stop request is seen within it.
WAIT_S = 0.2


def with_duties(handler: Callable[[Any], Any], messages: list[Any], output: str, producer: Producer) -> tuple[int, int]:
    """A worker's duties for each message, beside the loop's own work: the handler's record, the call
    under a clock, its outputs through the runtimes' own ``produce``. Returns (accepted, failed), as a
    worker counts them; the latency is summed as a worker's metrics would sum it, and not reported."""
    accepted, failed, latency_s = 0, 0, 0.0
    for record in MessageRecord.many(messages):
        started = time.monotonic()
        try:
            writes = [output_record(o, record, output) for o in outputs_of(handler(record))]
            accepted += 1
        except Exception:
            writes = []
            failed += 1
        latency_s += time.monotonic() - started
        for item in writes:
            produce(producer, item, serve=True)  # the runtimes' own call
    return accepted, failed


def echo_loop(
    stop: Event,
    settings: dict[str, Any],
    group: str,
    topic: str,
    output: str,
    duties: tuple[str, list[str]] | None = None,
) -> None:
    """Consume ``topic``, echo each record to ``output``, commit after delivery, until ``stop``.

    ``duties``: the handler (``module:function``) and its search paths; see the module's docstring.
    """
    consumer = Consumer({**settings, "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({**settings, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    handler = load_handler(*duties) if duties else None
    consumer.subscribe([topic])
    try:
        while not stop.is_set():
            batch = [m for m in consumer.consume(BATCH, WAIT_S) if m.error() is None]
            if not batch:
                continue
            if handler is None:
                # Inline, not the runtimes' ``produce``: a call per record would slow the baseline itself.
                for message in batch:
                    while True:
                        try:
                            producer.produce(output, message.value(), message.key())
                            break
                        except BufferError:
                            producer.poll(0.01)
            else:
                with_duties(handler, batch, output, producer)
            if producer.flush(60) != 0:
                raise KafkaException("outputs not delivered within 60 s")
            consumer.commit(asynchronous=True)
    finally:
        consumer.close()


def run(
    settings: dict[str, Any],
    group: str,
    topic: str,
    output: str,
    processes: int,
    duties: tuple[str, list[str]] | None = None,
) -> Callable[[], None]:
    """Start ``processes`` loops in one group; returns the function that stops them and waits."""
    return spawned(echo_loop, [(settings, group, topic, output, duties)] * processes)


def spawned(target: Callable[..., None], each: list[tuple[Any, ...]]) -> Callable[[], None]:
    """Start a process per argument tuple in ``each``, running ``target(stop, *args)`` until the
    shared event ``stop`` is set; returns the function that sets it and waits (30 s, then kills)."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    processes = [context.Process(target=target, args=(stop, *args), daemon=True) for args in each]
    for process in processes:
        process.start()

    def finish() -> None:
        stop.set()
        deadline = time.monotonic() + 30
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()

    return finish
