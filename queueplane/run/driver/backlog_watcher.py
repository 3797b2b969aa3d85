"""The driver's view of a queue's backlog, read in the background: lag, outages, refusals, and
micro-batches that stopped while records wait."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from queueplane.errors import ClusterRefused
from queueplane.kafka.cluster import refusal
from queueplane.run.driver.health import Health

log = logging.getLogger("queueplane.worker")


def records_waiting(lags: dict[int, int | None] | None) -> int | None:
    """Records waiting in the partitions whose lag is known; None when none is."""
    known = [lag for lag in (lags or {}).values() if lag is not None]
    return sum(known) if known else None


class BacklogWatcher:
    """Reads the queue's backlog in the background, so no micro-batch waits for a broker round trip.

    Each read also tells the worker's health whether Kafka answers; a failing read is logged
    once when it starts failing and once when it answers again. A read Kafka refuses (the
    worker's credentials, or an ACL it lost) is kept in ``refused``: the worker stops on it.

    Each answer tells the health how many records wait, and after each read in the background
    the watcher looks whether micro-batches have stopped ending meanwhile (``Health.stopped``):
    one error line when they are found stopped, one line when one ends again. Nothing else
    looks every second whatever the query does: the sink runs only when a batch ends.
    """

    INTERVAL_S = 1.0
    # A read in flight for longer hangs (a stalled connection): the answer it leaves standing
    # says nothing of the records that keep coming meanwhile.
    RECENT_S = 3 * INTERVAL_S

    def __init__(self, read: Callable[[], dict[int, int | None] | None], health: Health):
        self.read = read
        self.health = health
        self.latest: dict[int, int | None] | None = None
        self._failing = False
        self._failing_since: tuple[float, float] | None = None  # (wall, monotonic) of the first failed read
        self._error = ""
        self.refused: ClusterRefused | None = None
        # Where batches stood when they were found stopped (Health.batch_progress), until one ends.
        self._stopped_at: float | None = None
        self.outages: list[dict[str, Any]] = []  # ended ones: when, how long, the first error
        # Since when Kafka answers without a break (monotonic): the worker's start, or the end of an outage.
        self.answering_since = time.monotonic()
        # When the read that gave ``latest`` began (monotonic): a read that hung without failing
        # leaves an old answer standing, which says nothing of records that came since.
        self.latest_began = 0.0
        self._reading_since: float | None = None  # when the read in flight began (monotonic)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="qp-backlog", daemon=True)

    def start(self) -> None:
        self.read_now()
        self._thread.start()

    def fresh(self, since: float) -> bool:
        """Whether the latest answer comes from a read that began after ``since`` (monotonic)."""
        return self.latest is not None and self.latest_began > since

    def current(self, since: float, now: float) -> bool:
        """Whether the latest answer tells of now: ``fresh`` after ``since``, and no read since
        has been in flight for ``RECENT_S`` (a slow read that ends is no sign of a stall)."""
        reading = self._reading_since
        return self.fresh(since) and (reading is None or now - reading < self.RECENT_S)

    @property
    def failing(self) -> bool:
        """The last backlog read failed: Kafka does not answer."""
        return self._failing

    def read_now(self) -> dict[int, int | None] | None:
        try:
            return self._read()
        finally:
            self._reading_since = None

    def _read(self) -> dict[int, int | None] | None:
        # A read against a stopped broker can wait out its timeout before it fails: the outage
        # counts from when the failing read began, not from when it gave up.
        began = (time.time(), time.monotonic())
        self._reading_since = began[1]
        try:
            self.latest = self.read()
            self.latest_began = began[1]
            self.health.backlog_seen(records_waiting(self.latest))
        except Exception as exc:  # lag is advisory: a failed read must not stop the worker, a refused one does
            self.latest = None
            self.health.backlog_seen(None)
            refused = refusal(exc)
            if refused is not None:
                # Kafka answered, with a refusal: not an outage. The worker is not ready from now
                # on and stops on it (``refused``), with the refusal as its one line.
                if self.refused is None:
                    self.refused = refused
                    self.health.kafka_refused(str(refused))
                    log.error("%s", refused)
                return None
            self.health.kafka_failed(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            if not self._failing:
                log.warning("backlog read failed (Kafka does not answer): %s", exc)
                self._failing_since = began
                self._error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self._failing = True
        else:
            self.health.kafka_answered(time.monotonic())
            if self._failing:
                self.answering_since = time.monotonic()
                self.outages.append(self._outage(self.answering_since))
                log.info("backlog read: Kafka answers again, after %.0fs", self.outages[-1]["seconds"])
            self._failing = False
        return self.latest

    def _outage(self, now: float) -> dict[str, Any]:
        wall, since = self._failing_since or (time.time(), now)
        began = datetime.fromtimestamp(wall, UTC).isoformat(timespec="seconds")
        return {"began": began, "seconds": round(now - since, 1), "error": self._error}

    def all_outages(self) -> list[dict[str, Any]]:
        """The outages seen, with the one still going (if any) up to now."""
        return self.outages + ([self._outage(time.monotonic())] if self._failing else [])

    def _loop(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            self.read_now()
            self.watch_batches(time.monotonic())

    def watch_batches(self, now: float) -> None:
        """Log once when micro-batches are found stopped while records wait, and once when one ends again.

        Only a batch that ends closes the episode: records that stop waiting meanwhile, or a
        backlog read that fails, make ``Health.stopped`` quiet without any batch having ended.
        """
        health = self.health
        progress = health.batch_progress()  # before the verdict: a batch ending in between counts as after it
        if self._stopped_at is not None:
            if progress is not None and progress > self._stopped_at:
                log.info(
                    "%s: micro-batches end again, after %.0fs without one", health.name, progress - self._stopped_at
                )
                self._stopped_at = None
            return
        stopped = health.stopped(now)
        if stopped is not None:
            log.error("%s: %s", health.name, stopped)
            self._stopped_at = progress

    def stop(self) -> None:
        self._stop.set()
