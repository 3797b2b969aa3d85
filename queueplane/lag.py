"""How far behind a queue's group is, per partition.

Share groups: the broker's share-partition lag (KIP-1226), read with DescribeShareGroupOffsets
v1 straight over the Kafka protocol, because the Python client has no call for it. That
path speaks PLAINTEXT only; on a secured listener the lag is reported as unknown (None).
"""

from __future__ import annotations

from collections.abc import Callable

from queueplane.connection import KafkaTarget
from queueplane.kafka_protocol import share_partition_lag
from queueplane.model import QueueSpec


def _plaintext_bootstrap(target: KafkaTarget) -> tuple[str, int] | None:
    if target.settings.get("security.protocol", "plaintext").lower() != "plaintext":
        return None
    first = target.bootstrap.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


def share_lag(target: KafkaTarget, group: str, topic: str, partitions: int) -> dict[int, int | None] | None:
    """Lag per partition (None where the broker has no state for it yet); None if it cannot be read."""
    address = _plaintext_bootstrap(target)
    if address is None:
        return None
    try:
        lags = share_partition_lag(address[0], address[1], group, topic, list(range(partitions)))
    except (OSError, ValueError):
        return None
    return lags


def queue_backlog(target: KafkaTarget, queue: QueueSpec) -> Callable[[], dict[int, int | None] | None]:
    """The backlog reader a worker polls in the background while it runs."""
    return lambda: share_lag(target, queue.group.id, queue.topic.name, queue.topic.partitions)


def total_lag(lags: dict[int, int | None] | None) -> int | None:
    """The sum, or None while any partition's lag is unknown."""
    if lags is None or any(v is None for v in lags.values()):
        return None
    return sum(v for v in lags.values() if v is not None)
