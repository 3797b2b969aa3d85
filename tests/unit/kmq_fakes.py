"""A kmq worker process for unit tests: real handler threads and crash journal, a producer that
keeps what it was given, and writes acknowledged at once."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from queueplane.run.executor.crash_journal import CrashJournal
from queueplane.run.executor.failed_writes import FailedWrites
from queueplane.run.kmq.executor.tasks import HandlerThreads

LOCK_MS = 30_000
MARKERS, DLQ = "q.markers", "q.dlq"


class KeptProducer:
    """What was produced, as (topic, key, value)."""

    def __init__(self) -> None:
        self.produced: list[tuple[str, bytes | None, bytes | None]] = []

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None, partition=None) -> None:
        self.produced.append((topic, key, value))

    def to(self, topic: str) -> list[tuple[str, bytes | None, bytes | None]]:
        return [item for item in self.produced if item[0] == topic]


def kmq_process(journal_folder: Path, handler: Any, threads: int = 2, delivery_limit: int = 3) -> SimpleNamespace:
    settings = SimpleNamespace(
        lock_ms=LOCK_MS,
        markers_topic=MARKERS,
        dlq_topic=DLQ,
        output_topic=None,
        delivery_limit=delivery_limit,
        backoff_ms=100,
        max_backoff_ms=100,
    )
    return SimpleNamespace(
        settings=settings,
        handler=handler,
        producer=KeptProducer(),
        delivery=SimpleNamespace(all_delivered=lambda within_s: True),
        threads=HandlerThreads(threads),
        journal=CrashJournal(journal_folder, alone_s=LOCK_MS / 1000),
        failed_writes=FailedWrites(),
    )
