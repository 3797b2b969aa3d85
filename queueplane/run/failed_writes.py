"""The failed writes of a process's shared producer, reported by one callback for all its writes.

A delivery callback given with each write (a closure naming its record) cost more than a
trivial handler's whole call, and all but a few writes succeed. So a writer hands records to
the producer without one, and the producer reports every failure here instead: a refusal (a
record the broker will not take however often it is sent: too large, invalid) under the
fingerprint of the record, for the writer that holds the same fingerprint to claim; any other
failure as a count, which a writer compares with the count it saw before its writes.

A refusal reaches here before the producer stops counting its record as unacknowledged, so a
writer that waited for the producer to acknowledge everything it wrote finds its refusals here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from queueplane.run.handler import InvalidOutput
from queueplane.run.outcomes import ProducedRecord, refused_write

# Refusals nobody claims (their writer's task failed first, and its retry writes anew) would
# otherwise pile up for the life of the process; past this many, the oldest go.
MAX_UNCLAIMED = 10_000


def fingerprint(topic: str, key: bytes | None, value: bytes | None) -> int:
    """What a writer and the failure report of its record agree on: the record as written.

    Outputs are bytes by the time they are produced (outputs.output_record), and the report
    gives the same bytes back, so both sides hash equal objects.
    """
    return hash((topic, key, value))


def fingerprints(produced: list[ProducedRecord]) -> tuple[int, ...]:
    if len(produced) == 1:  # the usual record: one output, without a list to build
        topic, key, value, _ = produced[0]
        return (fingerprint(topic, key, value),)
    return tuple([fingerprint(topic, key, value) for topic, key, value, _ in produced])


class FailedWrites:
    """The producer's delivery callback (errors only) and what it learnt, for the writers to read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.errors = 0  # failures that were not refusals, since the process started
        self.last_error = ""
        self.failures = 0  # every failure, refusals too, for a writer that fails on any
        self.last_failure = ""
        self._refused: dict[int, list[InvalidOutput]] = {}

    def __call__(self, err: Any, msg: Any) -> None:
        """On the producer's delivery thread, once for each write that failed."""
        why = refused_write(err)
        with self._lock:
            self.failures += 1
            self.last_failure = f"a write to {msg.topic()} failed: {why or err}"
            if why is None:
                self.errors += 1
                self.last_error = f"a write to {msg.topic()} failed: {err}"
                return
            if len(self._refused) >= MAX_UNCLAIMED:
                del self._refused[next(iter(self._refused))]
            self._refused.setdefault(fingerprint(msg.topic(), msg.key(), msg.value()), []).append(why)

    @property
    def refusals(self) -> int:
        """Refusals not claimed yet. Read without the lock: once the producer acknowledged a
        write, its refusal, if any, is in already."""
        return len(self._refused)

    def claim(self, written: Iterable[int]) -> InvalidOutput | None:
        """Why one of these writes (fingerprints) was refused, or None. Each refusal is claimed once:
        two records that wrote the same bytes, both refused, each claim one."""
        found = None
        with self._lock:
            for print_ in written:
                whys = self._refused.get(print_)
                if whys:
                    found = whys.pop()
                    if not whys:
                        del self._refused[print_]
        return found
