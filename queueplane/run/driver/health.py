"""Whether a worker is alive and ready, from what the driver sees; the chart's probes ask this.

A worker that answers its metrics endpoint but cannot work must look broken. Live: the
streaming query runs and no micro-batch has been running for longer than a stall bound (a
hung batch holds every record behind it). Ready: live, the query has started, Kafka
answered the last backlog read within ``kafka_stale_s``, and records that wait are handled:
micro-batches that keep coming back empty while the backlog says records wait mean the worker
is not being given them (a share partition its broker no longer delivers from was measured),
and that worker is idle, not healthy; micro-batches that stop ending while records wait (a
hung Python worker, a source that plans nothing) mean the backlog only grows, and that worker
is stuck, not idle; and what runs beside the query (the kmq tracker) is not degraded: a part
that keeps failing against Kafka rides the outage out and says why meanwhile, so the worker
is not ready rather than gone. Pure state with the clock passed in, so the
rules are tested without Spark or a broker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from queueplane.spec.model import QueueSpec

KAFKA_STALE_S = 30.0
MIN_STALL_S = 600.0
MIN_STARVE_S = 120.0
MIN_STOPPED_S = 30.0
STOPPED_BATCHES = 2  # a time-sliced runtime's longest batches that may go by without one ending


def stall_seconds(queue: QueueSpec) -> float:
    """How long one micro-batch may run before the worker counts as stuck.

    A batch legitimately runs while a record goes through every delivery with its backoff;
    four times that, and never under ten minutes, so a slow queue is not restarted for being slow.
    """
    attempt_s = (queue.group.lock_duration_ms + queue.retry_max_backoff_ms) / 1000
    return max(MIN_STALL_S, 4 * queue.group.delivery_limit * attempt_s)


def starve_seconds(queue: QueueSpec) -> float:
    """How long records may wait while every micro-batch comes back empty before the worker is not ready.

    Records can wait unhandled for a while legitimately: locked by a call that hangs until its
    lock runs out, or waiting out a retry's backoff. Three such cycles, never under two minutes.
    """
    return max(MIN_STARVE_S, 3 * (queue.group.lock_duration_ms + queue.retry_max_backoff_ms) / 1000)


def stopped_seconds(longest_batch_s: float | None) -> float:
    """How long records may wait while no micro-batch ends before the worker is not ready.

    ``longest_batch_s``: how long one micro-batch of the runtime lasts at most when nothing is
    wrong (``QueueRuntime.longest_batch_s``). Time-sliced sources (consumer, kmq and share groups)
    end a batch every slice whatever their handlers do: its tasks each hold one slice, the idle
    slice (15 s) at most, in turns where there are more tasks than cores. Two such batches
    without an end are no slow queue but a stuck one. Never under 30 s: that covers the first
    batch (Spark's Python workers start, members join their group) and Spark's own work between
    two batches on a busy machine, and it is still seen within half a minute (one local worker's
    bound is exactly that: twice the idle slice).

    None: a source whose batches last as long as their records take (Spark's Kafka source);
    a long batch is the stall bound's. Only the time its trigger sits idle while records wait
    counts, and new records start a batch within milliseconds: the floor alone.
    """
    if longest_batch_s is None:
        return MIN_STOPPED_S
    return max(MIN_STOPPED_S, STOPPED_BATCHES * longest_batch_s)


@dataclass
class Verdict:
    ok: bool
    reason: str


class Health:
    def __init__(
        self,
        stall_s: float,
        kafka_stale_s: float = KAFKA_STALE_S,
        starve_s: float = MIN_STARVE_S,
        degraded: Callable[[], str | None] = lambda: None,
        longest_batch_s: float | None = None,
        name: str = "",
    ):
        self.stall_s = stall_s
        self.name = name  # the queue's, for the lines its watcher logs
        self._degraded = degraded  # why a part beside the query cannot work now (the runtime's), or None
        self.kafka_stale_s = kafka_stale_s
        self.starve_s = starve_s
        self._waiting = 0
        self._starved_since: float | None = None  # records wait and batches come back empty since
        # Batches that stop ending while records wait: a time-sliced source's whole gap counts;
        # otherwise (None) only the time its trigger is not seen running a batch.
        self.stopped_s = stopped_seconds(longest_batch_s)
        self._idle_only = longest_batch_s is None
        self._ended_at: float | None = None  # when the last micro-batch ended, or the query started
        self._active_at: float | None = None  # when the trigger was last seen running a batch
        self._backlog: int | None = None  # records waiting at the last backlog read (None: unknown)
        self._lock = threading.Lock()
        self._started = False
        self._stopped: str | None = None
        self._batch_since: float | None = None
        self._kafka_ok_at: float | None = None
        self._kafka_error: str | None = None
        self._refused: str | None = None

    @property
    def started(self) -> bool:
        with self._lock:
            return self._started

    def query_started(self, now: float | None = None) -> None:
        """The query started at ``now`` (default: the monotonic clock's), where stopped batches count from."""
        with self._lock:
            self._started = True
            self._ended_at = time.monotonic() if now is None else now

    def query_stopped(self, why: str) -> None:
        with self._lock:
            self._stopped = why

    def batch_running(self, now: float, running: bool) -> None:
        """The query's trigger is (or is not) running a micro-batch at ``now``."""
        with self._lock:
            if not running:
                self._batch_since = None
                return
            self._active_at = now
            if self._batch_since is None:
                self._batch_since = now

    def batch_handled(self, now: float, waiting: int | None, handled: int) -> None:
        """A micro-batch ended at ``now``: ``handled`` records in it, ``waiting`` in the backlog (None: unknown)."""
        with self._lock:
            self._ended_at = now
            if handled or not waiting:
                self._starved_since = None
            elif self._starved_since is None:
                self._starved_since = now
            self._waiting = waiting or 0

    def starved(self, now: float) -> str | None:
        """Why records wait unhandled past the bound, or None."""
        with self._lock:
            since = self._starved_since
            if since is None or now - since <= self.starve_s:
                return None
            return (
                f"{self._waiting} records wait and no micro-batch has handled one for {now - since:.0f}s"
                f" (bound {self.starve_s:.0f}s): the worker is not being given them"
            )

    def backlog_seen(self, waiting: int | None) -> None:
        """A backlog read answered that ``waiting`` records wait (None: it failed, or cannot tell)."""
        with self._lock:
            self._backlog = waiting

    def batch_progress(self) -> float | None:
        """Since when no micro-batch has ended (nor, where only idle time counts, been seen running)."""
        with self._lock:
            return self._progress()

    def _progress(self) -> float | None:
        if self._ended_at is None or not self._idle_only or self._active_at is None:
            return self._ended_at
        return max(self._ended_at, self._active_at)

    def stopped(self, now: float) -> str | None:
        """Why records wait while micro-batches have stopped ending, past the bound; or None."""
        with self._lock:
            waiting, since = self._backlog, self._progress()
            if not self._started or self._stopped is not None or not waiting or since is None:
                return None
            if self._idle_only and self._batch_since is not None:
                return None  # a batch runs: however long it takes is the stall bound's
            if now - since <= self.stopped_s:
                return None
            return (
                f"{waiting} records wait and no micro-batch has "
                f"{'run' if self._idle_only else 'ended'} for {now - since:.0f}s"
                f" (bound {self.stopped_s:.0f}s): batches have stopped"
            )

    def kafka_answered(self, now: float) -> None:
        with self._lock:
            self._kafka_ok_at, self._kafka_error = now, None

    def kafka_failed(self, error: str) -> None:
        with self._lock:
            self._kafka_error = error

    def kafka_refused(self, why: str) -> None:
        """Kafka refused the worker's principal: not ready from now on, whatever answers later."""
        with self._lock:
            self._refused = why

    def live(self, now: float) -> Verdict:
        with self._lock:
            if self._stopped is not None:
                return Verdict(False, f"the streaming query stopped: {self._stopped}")
            if self._batch_since is not None and now - self._batch_since > self.stall_s:
                return Verdict(
                    False, f"a micro-batch has run {now - self._batch_since:.0f}s (stall bound {self.stall_s:.0f}s)"
                )
            return Verdict(True, "the streaming query runs")

    def ready(self, now: float) -> Verdict:
        live = self.live(now)
        if not live.ok:
            return live
        with self._lock:
            if self._refused is not None:
                return Verdict(False, self._refused)
            if not self._started:
                return Verdict(False, "the streaming query has not started yet")
            if self._kafka_ok_at is None or now - self._kafka_ok_at > self.kafka_stale_s:
                since = "never" if self._kafka_ok_at is None else f"{now - self._kafka_ok_at:.0f}s ago"
                return Verdict(False, f"Kafka last answered {since}: {self._kafka_error or 'no answer yet'}")
        degraded = self._degraded()
        if degraded is not None:
            return Verdict(False, degraded)
        stopped = self.stopped(now)
        if stopped is not None:
            return Verdict(False, stopped)
        starved = self.starved(now)
        if starved is not None:
            return Verdict(False, starved)
        return Verdict(True, "the query runs and Kafka answers")


class ApplicationHealth:
    """The health of an application of several queues: live and ready while each queue is.

    One driver serves the probes of all its queues; a queue that cannot work makes the whole
    pod not ready, and the reason names it, so an operator sees which one.
    """

    def __init__(self, queues: dict[str, Health]):
        self.queues = queues

    def _all(self, check: str, now: float) -> Verdict:
        verdicts = {name: getattr(health, check)(now) for name, health in self.queues.items()}
        if len(verdicts) == 1:
            return next(iter(verdicts.values()))
        failing = [f"{name}: {v.reason}" for name, v in verdicts.items() if not v.ok]
        if failing:
            return Verdict(False, "; ".join(failing))
        return Verdict(True, f"all {len(verdicts)} queues: {next(iter(verdicts.values())).reason}")

    def live(self, now: float) -> Verdict:
        return self._all("live", now)

    def ready(self, now: float) -> Verdict:
        return self._all("ready", now)
