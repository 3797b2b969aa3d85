"""The process's shared producer learns its writes are acknowledged while writers keep it busy.

An at-least-once commit may pass a record only once its outputs are acknowledged, and the
producer only says so when it holds nothing unacknowledged. Handlers that write all the time
never leave it empty, so the commit holds the writers at a gate (``writes_held``) and flushes.
Against the real broker: the flush sends what lingers at once, writers wait at the gate only
while it is shut, and inside it the producer is empty under a writer that never stops.
"""

from __future__ import annotations

import threading
import time

import pytest
from worker_support import make_queue

from queueplane.run.executor.processes import ServedProducer

pytestmark = pytest.mark.kafka

LONG_LINGER_MS = 30_000  # far longer than the test waits: only a flush sends before it ends


def _write_through_gate(delivery: ServedProducer, topic: str, stop: threading.Event, written: list[float]) -> None:
    """A slot's writes: each waits at the gate while it is shut, as PartitionTask's quick path does."""
    while not stop.is_set():
        if not delivery.writes_open:
            delivery.wait_to_write()
        delivery.producer.produce(topic, b"v")
        written.append(time.monotonic())
        time.sleep(0.0005)


def test_a_busy_producer_is_acknowledged_inside_the_gate_and_its_writers_wait_only_there(kafka, tmp_path):
    queue = make_queue(tmp_path, kafka)
    delivery = ServedProducer(dict(kafka.settings), linger_ms=LONG_LINGER_MS, errors_only=True)
    try:
        delivery.producer.produce(queue.topic, b"lingering")
        assert not delivery.all_delivered(0.5), "the linger holds the record back"
        with delivery.writes_held(10):
            assert len(delivery.producer) == 0, "the flush sent the lingering record and it was acknowledged"

        stop, written = threading.Event(), []
        writer = threading.Thread(target=_write_through_gate, args=(delivery, queue.topic, stop, written))
        writer.start()
        try:
            while len(written) < 50:
                time.sleep(0.01)
            assert not delivery.all_delivered(0.2), "a writer that never stops keeps the producer busy"
            for _ in range(3):
                with delivery.writes_held(10):
                    shut_at, before = time.monotonic(), len(written)
                    assert delivery.all_delivered(0.05), "inside the gate everything written is acknowledged"
                    time.sleep(0.2)
                    # At most the one write that passed the gate as it shut, none while it is shut.
                    assert len([t for t in written[before:] if t > shut_at]) <= 1, "writes passed the shut gate"
                count = len(written)
                deadline = time.monotonic() + 5
                while len(written) == count and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert len(written) > count, "the writer goes on once the gate opens"
        finally:
            stop.set()
            writer.join(10)
    finally:
        delivery.close()
