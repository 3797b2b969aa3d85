"""The autoscaling controller in the driver: measures, asks the policy, and applies its answer.

Every micro-batch reports how many records ended and the backlog per partition; once per
decision interval the controller turns that into rates, asks queueplane.autoscale what to
run, and applies it with Spark's executor-request API (SparkContext.requestTotalExecutors and
killExecutors on the JVM side), which the Kubernetes and standalone schedulers honour.
In local mode there is nothing to scale; it only measures.

Share-group executors hold outcomes they settled and acknowledged but have not yet handed
to a task; killing one then would leave those records out of the counts and metrics. So
with a ``drain`` the controller kills in two steps: it asks for a draining micro-batch
(every process stops acquiring, settles and reports), and kills in the next batch's call,
once that batch has run. A draining batch runs as many tasks as the most executors have
cores, so while they idle between batches the scheduler gives each core one of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from queueplane.run.scaling.policy import Decision, Observation, ScalerState, decide, policy_for
from queueplane.spec.model import QueueSpec

log = logging.getLogger("queueplane.autoscaler")


class Drain(Protocol):
    def request(self, reason: str) -> None: ...
    def release(self, reason: str) -> None: ...


DRAIN_REASON = "scale-down"


class ExecutorController:
    def __init__(
        self,
        spark: Any,
        queue: QueueSpec,
        on_executors: Callable[[int, int], None] = lambda _running, _requested: None,
        clock: Callable[[], float] = time.monotonic,
        drain: Drain | None = None,
        executor_cap: int | None = None,
        **policy_overrides: float,
    ):
        self.sc = spark.sparkContext
        self.jsc = self.sc._jsc.sc()
        self.enabled = not self.sc.master.startswith("local")
        self.policy = policy_for(queue, executor_cap, **policy_overrides)
        self.state = ScalerState()
        self.clock = clock
        self.on_executors = on_executors
        conf = self.sc.getConf()
        self.requested = int(conf.get("spark.executor.instances", str(max(1, self.policy.min_executors))))
        # The first window opens at the first micro-batch: the time Spark took to start is no
        # part of a processing rate (read as one, a warm-up's few records look like a backlog
        # the executors cannot keep up with).
        self.window_start: float | None = None
        self.handled = 0
        self.last_lag: int | None = None
        self.synced = False
        self.decisions: list[dict[str, Any]] = []
        self.drain = drain
        self._after_drain: list[Callable[[], None]] = []  # kills waiting for the draining batch

    def executor_ids(self) -> list[str]:
        """Registered executors (the driver is not one)."""
        text = self.jsc.getExecutorIds().mkString(",")
        return [i for i in text.split(",") if i and i != "driver"]

    def _request_total(self, total: int) -> None:
        """Set Spark's target executor count, absolutely.

        The relative ``requestExecutors(n)`` adds to a target that, on Kubernetes, starts at zero
        rather than at the initial executors, so one more of one running would be a target of one.
        """
        no_locality = self.sc._jvm.PythonUtils.toScalaMap({})
        self.jsc.requestTotalExecutors(total, 0, no_locality)

    def _restore_target(self) -> None:
        """After kills, each of which lowered Spark's target by one: back to the requested count."""
        self._request_total(self.requested)

    def _kill(self, ids: list[str], then: Callable[[], None] = lambda: None) -> None:
        """Kill these executors, after a draining batch if there is a drain; ``then`` runs after the kill."""
        if not ids:
            return

        def kill() -> None:
            self.jsc.killExecutors(self.sc._jvm.PythonUtils.toSeq(ids))
            then()

        if self.drain is not None:
            log.info("draining before removing executor(s) %s", ", ".join(ids))
        if self.drain is None:
            kill()
            return
        self._after_drain.append(kill)
        self.drain.request(DRAIN_REASON)

    def _kill_drained(self) -> None:
        """The batch that just ran drained every process: the executors waiting to go hold nothing now."""
        if self.drain is None or not self._after_drain:
            return
        kills, self._after_drain = self._after_drain, []
        log.info("drained: removing the executor(s) that waited for it")
        for kill in kills:
            kill()
        self.drain.release(DRAIN_REASON)

    def _sync(self, ids: list[str]) -> None:
        """A standalone master starts as many executors as its cores allow; trim to the requested count."""
        self.synced = True
        extra = len(ids) - self.requested
        if extra > 0:
            log.info("trimming %d executor(s) started beyond the initial %d", extra, self.requested)
            # Each kill lowers Spark's target by one; the target is set back to the requested count after.
            self._kill(sorted(ids, key=_executor_order)[-extra:], then=self._restore_target)

    def on_batch(self, handled: int, lag_by_partition: dict[int, int | None] | None) -> Decision | None:
        if not self.enabled:
            return None
        self._kill_drained()
        ids = self.executor_ids()
        if not self.synced and ids:
            self._sync(ids)
            ids = self.executor_ids()
        # Every batch, not only at decisions: no decision is taken while the backlog cannot be
        # read, and the executors running then are what an operator most wants to see.
        self.on_executors(len(ids), self.requested)
        now = self.clock()
        if self.window_start is None:
            self.window_start = now
            return None
        self.handled += handled
        elapsed = now - self.window_start
        if elapsed < self.policy.interval_s or lag_by_partition is None:
            return None
        lag = sum(v for v in lag_by_partition.values() if v is not None)
        processing_rate = self.handled / elapsed
        growth = 0.0 if self.last_lag is None else (lag - self.last_lag) / elapsed
        observation = Observation(
            now_s=now,
            lag_by_partition=lag_by_partition,
            input_rate=max(0.0, processing_rate + growth),
            processing_rate=processing_rate,
            executors=len(ids),
            requested=self.requested,
        )
        decision = decide(self.policy, observation, self.state)
        self.state = decision.state
        self.window_start, self.handled, self.last_lag = now, 0, lag
        # The new count first: a kill without a drain restores Spark's target to it at once.
        previous, self.requested = self.requested, decision.desired
        if decision.desired > previous:
            self._request_total(decision.desired)
        elif decision.desired < previous:
            # Requested executors that never started are only cancelled; running ones beyond the
            # new count are drained and removed (the newest first).
            surplus = len(ids) - decision.desired
            if surplus > 0:
                self._kill(sorted(ids, key=_executor_order)[-surplus:], then=self._restore_target)
            else:
                self._request_total(decision.desired)
        if decision.desired != previous:
            log.info("executors %d -> %d: %s (backlog %d)", previous, decision.desired, decision.reason, lag)
        self.decisions.append(
            {
                "at_s": round(now, 1),
                "running": len(ids),
                "requested": previous,
                "desired": decision.desired,
                "lag": lag,
                "reason": decision.reason,
            }
        )
        self.on_executors(len(ids), self.requested)
        return decision


def _executor_order(executor_id: str) -> tuple[int, str]:
    """Newest last: executor ids are increasing numbers."""
    return (int(executor_id), "") if executor_id.isdigit() else (0, executor_id)
