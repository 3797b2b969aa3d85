"""The group types a queue may run, each by its runtime: the one place the driver's dispatch lives."""

from __future__ import annotations

from queueplane.errors import QueueplaneError
from queueplane.run.consumer.runtime import ConsumerRuntime
from queueplane.run.driver.runtime import QueueRuntime
from queueplane.run.kmq.runtime import KmqRuntime
from queueplane.run.share.runtime import ShareRuntime
from queueplane.spec.model import QueueSpec

RUNTIMES: dict[str, type[QueueRuntime]] = {
    runtime.group_type: runtime for runtime in (ShareRuntime, ConsumerRuntime, KmqRuntime)
}


def runtime_class(queue: QueueSpec) -> type[QueueRuntime]:
    try:
        return RUNTIMES[queue.group.type]
    except KeyError:
        raise QueueplaneError(f"{queue.source}: group type {queue.group.type} has no runtime yet") from None
