"""A realistic test load for a queue: JSON orders with ids, some poison, some slow.

Used by the demo, the tests and the benchmarks. Every record carries its id in a header
too, so even a poison record (not JSON) can be traced to the DLQ.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from queueplane.kafka import clients
from queueplane.kafka.target import KafkaTarget

# A share group's broker acquires whole producer batches, whatever max.poll.records says
# (librdkafka has no share.acquire.mode, KIP-1206). Batches of thousands of records would
# lock more than a worker can start within lockDuration, so queue producers keep them small.
QUEUE_PRODUCER = {"linger.ms": 5, "batch.num.messages": 100}
ID_HEADER = "queueplane.load.id"
DRINKS = ("espresso", "flat white", "cappuccino", "latte", "mocha", "cortado", "americano")
SIZES = ("small", "medium", "large")


@dataclass
class LoadReport:
    topic: str
    count: int
    poison: int
    slow: int
    ids: list[str]


def make_order(index: int, keys: int, rng: random.Random, slow: bool, batch: str = "") -> tuple[str, bytes, bytes]:
    order_id = f"ord-{batch}{index:07d}"
    customer = f"cust-{index % keys:05d}"
    body = {
        "id": order_id,
        "customer": customer,
        "drink": rng.choice(DRINKS),
        "size": rng.choice(SIZES),
        "milk": rng.choice(["whole", "oat", "none"]),
        "slow": slow,
    }
    return order_id, customer.encode(), json.dumps(body, separators=(",", ":")).encode()


def produce_load(
    target: KafkaTarget,
    topic: str,
    count: int,
    keys: int = 64,
    poison_rate: float = 0.0,
    slow_rate: float = 0.0,
    seed: int = 7,
    on_progress: Callable[[int], None] = lambda _n: None,
) -> LoadReport:
    """Produce ``count`` orders and wait until the broker has them all."""
    rng = random.Random(seed)
    # Ids name the load too, so a second load adds new orders rather than repeating the first's ids.
    batch = f"{uuid.uuid4().hex[:6]}-"
    producer = clients.producer(target.settings, {**QUEUE_PRODUCER, "enable.idempotence": True})
    report = LoadReport(topic, count, 0, 0, [])
    failures: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    for index in range(count):
        slow = rng.random() < slow_rate
        order_id, key, value = make_order(index, keys, rng, slow, batch)
        if rng.random() < poison_rate:
            value = value[: len(value) // 2]  # cut in half: not JSON any more
            report.poison += 1
        report.slow += slow
        report.ids.append(order_id)
        while True:
            try:
                producer.produce(
                    topic, key=key, value=value, headers=[(ID_HEADER, order_id.encode())], on_delivery=delivered
                )
                break
            except BufferError:
                producer.poll(0.05)
        if index % 1000 == 999:
            producer.poll(0)
            on_progress(index + 1)
    remaining = producer.flush(60)
    on_progress(count)
    if remaining or failures:
        raise RuntimeError(f"{remaining} records not delivered; first error: {failures[:1]}")
    return report
