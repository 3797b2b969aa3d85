"""When the queue's topic last grew, as one worker process sees it: read only while it drains.

A draining consumer with a fetch out must not leave while records arrive: its open fetch may
acquire the next one, which comes back one delivery higher once it has left. Its own polls and
its process's show only the records that came to this process; on a trickling queue the other
processes' open fetches take them, and this process sees an idle queue that is not (measured:
a record handed back across processes, docs/runtimes.md). The topic's end offsets show every
record produced, whichever consumer it goes to.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from queueplane.kafka import clients
from queueplane.kafka.offsets import end_offsets

log = logging.getLogger("queueplane.worker")

# How often a draining process reads the end offsets: a trickle of a few records a second moves
# them between two reads, and each read is one ListOffsets request.
READ_EVERY_S = 0.5
# A read holds up the fetcher thread that makes it: the broker away, it gives up soon.
READ_TIMEOUT_S = 2.0


class QueueEnd:
    """The sum of the topic's end offsets, read at most every READ_EVERY_S, and when it last moved.

    ``read`` returns that sum, or None when it cannot be read (the broker away): then nothing
    moves, and a drain falls back to its process's own polls.
    """

    def __init__(self, read: Callable[[], int | None], clock: Callable[[], float] = time.monotonic):
        self._read = read
        self._clock = clock
        self._reading = threading.Lock()
        self._read_at = float("-inf")
        self._last: int | None = None
        self._moved_at = 0.0

    def moved_at(self) -> float:
        """When (monotonic) a read last found the end further on; 0.0 if none did. A fetcher
        thread that finds another reading takes the last answer rather than wait for it."""
        if not self._reading.acquire(blocking=False):
            return self._moved_at
        try:
            now = self._clock()
            if now - self._read_at >= READ_EVERY_S:
                self._read_at = now
                total = self._read()
                if total is not None:
                    if self._last is not None and total != self._last:
                        self._moved_at = now
                    self._last = total
            return self._moved_at
        finally:
            self._reading.release()


def topic_end_reader(kafka: Mapping[str, Any], topic: str) -> Callable[[], int | None]:
    """A reader of the topic's summed end offsets, with an admin client made at its first read
    (a process that never drains never makes one). A read that fails is said once, when reads
    begin to fail, not at each of the reads an outage fails every READ_EVERY_S."""
    made: dict[str, Any] = {}

    def read() -> int | None:
        try:
            if "admin" not in made:
                made["admin"] = clients.admin(kafka)
            if "partitions" not in made:
                metadata = made["admin"].list_topics(topic, timeout=READ_TIMEOUT_S)
                made["partitions"] = sorted(metadata.topics[topic].partitions)
            total = sum(end_offsets(made["admin"], topic, made["partitions"], READ_TIMEOUT_S).values())
        except Exception as exc:  # advisory: a drain without it only waits less
            if not made.get("failing"):
                log.info("the queue's end offsets could not be read (%s); the drain goes by its own polls", exc)
            made["failing"] = True
            return None
        made["failing"] = False
        return total

    return read
