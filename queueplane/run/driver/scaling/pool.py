"""The application's executors: one target for Spark, the sum of what its queues ask for.

An application's queues share one executor pool, so each queue's controller
(``controller.ExecutorController``) decides its own demand from its own lag and rate, and the
pool asks Spark for the sum, through Spark's executor-request API
(SparkContext.requestTotalExecutors and killExecutors on the JVM side), which the Kubernetes
and standalone schedulers honour. An application of one queue asks for exactly that queue's
demand.

Removing an executor must not cut a share queue's delivery short: share-group executors hold
outcomes they settled and acknowledged but have not yet handed to a task. So a kill waits until
every queue whose runtime drains has run a draining micro-batch (every process handles what its
consumers acquired, settles, reports and leaves the group). The queue that asked waits for its next
batch; any other draining queue may be in the middle of a batch that began before the request,
so it waits for the batch after that one; and a kill waits the drains' ``settle_s`` too, the
time after which processes that had no task in a draining batch have let go as well. That time
is an estimate (a process's lease, its idle wait, its last poll and its close, on a busy
machine), so a kill then waits, up to each drain's ``wait_s``, until the broker shows no
consumer of the queue's group left: a consumer still a member when its executor goes hands
what it acquired back one delivery higher. Queues
that do not drain (consumer, kmq) lose the tasks running on a removed executor, which Spark
runs again: their offsets commit only after a batch.

Demand that rises again while a removal waits for its drain cancels the removal: removed after
all, the executor would be replaced at once by the higher target, and a removal planned then
would find the replacement beside an executor already gone (the pool stayed one executor over
its target in a load that rose and fell every few seconds). Executors once removed are not
chosen again while Spark still lists them.

The queues' stream threads call in concurrently, so every method holds the pool's lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("queueplane.autoscaler")

DRAIN_REASON = "scale-down"


class Drain(Protocol):
    settle_s: float  # after the request, how long until processes that ran no draining task let go
    wait_s: float  # after the request, the longest a kill waits for the group's consumers to leave

    def request(self, reason: str) -> None: ...
    def release(self, reason: str) -> None: ...
    def members(self) -> int | None:
        """Consumers still in the queue's group (None: not known)."""
        ...


class ExecutorPool:
    def __init__(self, spark: Any):
        self.sc = spark.sparkContext
        self.jsc = self.sc._jsc.sc()
        self.enabled = not self.sc.master.startswith("local")
        self.lock = threading.RLock()
        self.demands: dict[str, int] = {}
        self.drains: dict[str, Drain] = {}
        self.synced = False
        self._after_drain: list[Callable[[], None]] = []  # kills waiting for the draining batches
        self._waiting: dict[str, int] = {}  # draining batches each queue must still run before them
        self._kill_not_before = 0.0  # monotonic: and not before the drains have settled
        self._kill_by = 0.0  # monotonic: and then once the groups are empty, or by this time
        self._told_waiting = False
        self._removed: set[str] = set()  # executor ids killed; Spark lists them until they are gone

    def join(self, name: str, minimum: int, drain: Drain | None) -> None:
        """A queue of the application. It starts at its minimum: Spark starts the sum of the
        queues' minimums (``spark.executor.instances``, set by the chart and by spark-submit)."""
        with self.lock:
            self.demands[name] = minimum
            if drain is not None:
                self.drains[name] = drain

    @property
    def requested(self) -> int:
        """What Spark is asked for: the sum of the queues' demands."""
        with self.lock:
            return sum(self.demands.values())

    def executor_ids(self) -> list[str]:
        """Registered executors (the driver is not one)."""
        text = self.jsc.getExecutorIds().mkString(",")
        return [i for i in text.split(",") if i and i != "driver"]

    def share(self, name: str, running: int) -> int:
        """A queue's part of the running executors, in proportion to its demand: what its rate is measured on."""
        with self.lock:
            total = self.requested
            if total <= 0 or len(self.demands) == 1:
                return running
            return max(1, round(running * self.demands[name] / total)) if running else 0

    def draining(self) -> bool:
        """A removal waits for its drain: the draining queues' consumption has stopped meanwhile."""
        with self.lock:
            return bool(self._after_drain)

    def batch_ran(self, name: str) -> None:
        """A queue's micro-batch ended: kills waiting for drains may go, and a fresh pool is trimmed."""
        if not self.enabled:
            return
        with self.lock:
            if name in self._waiting:
                self._waiting[name] -= 1
                if all(left <= 0 for left in self._waiting.values()) and time.monotonic() >= self._kill_not_before:
                    members = self._members_left()
                    held = ", ".join(f"{queue}: {n}" for queue, n in sorted(members.items()))
                    if not members or time.monotonic() >= self._kill_by:
                        if members:
                            log.warning(
                                "removing executor(s) while consumers are still in their groups (%s): "
                                "what they acquired comes back one delivery higher",
                                held,
                            )
                        self._kill_drained()
                    elif not self._told_waiting:
                        self._told_waiting = True
                        log.info("waiting for the consumers still in their groups to leave (%s)", held)
            if not self.synced:
                ids = self.executor_ids()
                if ids:
                    self._sync(name, ids)

    def set_demand(self, name: str, desired: int, ids: list[str]) -> None:
        """A queue's new demand: ask Spark for the new total, or remove the newest executors beyond it."""
        with self.lock:
            previous = self.requested
            self.demands[name] = desired
            total = self.requested
            if total > previous:
                self._cancel_kills()
                self._request_total(total)
            elif total < previous:
                # Requested executors that never started are only cancelled; running ones beyond the
                # new count are drained and removed (the newest first).
                running = [i for i in ids if i not in self._removed]
                surplus = len(running) - total
                if surplus > 0:
                    self._kill(name, sorted(running, key=_executor_order)[-surplus:])
                else:
                    self._request_total(total)

    def _request_total(self, total: int) -> None:
        """Set Spark's target executor count, absolutely.

        The relative ``requestExecutors(n)`` adds to a target that, on Kubernetes, starts at zero
        rather than at the initial executors, so one more of one running would be a target of one.
        """
        no_locality = self.sc._jvm.PythonUtils.toScalaMap({})
        self.jsc.requestTotalExecutors(total, 0, no_locality)

    def _kill(self, caller: str, ids: list[str]) -> None:
        """Kill these executors once every draining queue has drained; then the target is set back
        to the requested total (each kill lowers Spark's target by one)."""

        def kill() -> None:
            self._removed.update(ids)
            self.jsc.killExecutors(self.sc._jvm.PythonUtils.toSeq(ids))
            self._request_total(self.requested)

        if not self.drains:
            kill()
            return
        log.info("draining before removing executor(s) %s", ", ".join(ids))
        self._after_drain.append(kill)
        self._waiting = {name: 1 if name == caller else 2 for name in self.drains}
        now = time.monotonic()
        self._kill_not_before = now + max(drain.settle_s for drain in self.drains.values())
        self._kill_by = now + max(drain.wait_s for drain in self.drains.values())
        self._told_waiting = False
        for drain in self.drains.values():
            drain.request(DRAIN_REASON)

    def _cancel_kills(self) -> None:
        """Removals still waiting for their drain are dropped, and the draining queues go on as before."""
        if not self._after_drain:
            return
        log.info("demand rose again: the executor(s) waiting to be removed stay")
        self._after_drain, self._waiting = [], {}
        for drain in self.drains.values():
            drain.release(DRAIN_REASON)

    def _members_left(self) -> dict[str, int]:
        """The draining queues whose groups still have consumers; a queue whose group cannot be
        read now (the broker away) is not waited for: its settle time has passed."""
        left = {}
        for name, drain in self.drains.items():
            members = drain.members()
            if members:
                left[name] = members
        return left

    def _kill_drained(self) -> None:
        """Every draining queue ran a batch that drained its processes: the executors hold nothing now."""
        kills, self._after_drain, self._waiting = self._after_drain, [], {}
        if not kills:
            return
        log.info("drained: removing the executor(s) that waited for it")
        for kill in kills:
            kill()
        for drain in self.drains.values():
            drain.release(DRAIN_REASON)

    def _sync(self, caller: str, ids: list[str]) -> None:
        """A standalone master starts as many executors as its cores allow; trim to the requested count."""
        self.synced = True
        extra = len(ids) - self.requested
        if extra > 0:
            log.info("trimming %d executor(s) started beyond the initial %d", extra, len(ids) - extra)
            self._kill(caller, sorted(ids, key=_executor_order)[-extra:])


def _executor_order(executor_id: str) -> tuple[int, str]:
    """Newest last: executor ids are increasing numbers."""
    return (int(executor_id), "") if executor_id.isdigit() else (0, executor_id)
