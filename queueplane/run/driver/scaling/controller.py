"""A queue's autoscaling controller in the driver: measures, asks the policy, and hands its answer on.

Every micro-batch reports how many records ended and the backlog per partition; once per
decision interval the controller turns that into rates and asks queueplane.autoscale how
many executors the queue needs. The application's ``ExecutorPool`` (pool.py) asks Spark for
the sum of its queues' demands, and drains share queues before it removes an executor.
In local mode there is nothing to scale; it only measures.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from queueplane.run.driver.scaling.policy import Decision, Observation, ScalerState, decide, policy_for
from queueplane.run.driver.scaling.pool import Drain, ExecutorPool
from queueplane.spec.model import QueueSpec

log = logging.getLogger("queueplane.autoscaler")

# How long records may wait with no batch of their queue ending before a queue that holds no
# executor asks for one (ExecutorController.on_waiting).
STARVED_S = 10.0


class ExecutorController:
    def __init__(
        self,
        pool: ExecutorPool,
        queue: QueueSpec,
        on_executors: Callable[[int, int], None] = lambda _running, _requested: None,
        clock: Callable[[], float] = time.monotonic,
        drain: Drain | None = None,
        executor_cap: int | None = None,
        policy_overrides: Mapping[str, float] | None = None,
    ):
        self.pool, self.name = pool, queue.name
        self.enabled = pool.enabled
        self.policy = policy_for(queue, executor_cap, **(policy_overrides or {}))
        self.state = ScalerState()
        self.clock = clock
        self.on_executors = on_executors
        self.requested = queue.min_executors  # this queue's demand; the pool asks for the sum
        self.drains = drain is not None  # a removal's drain pauses this queue's consumption
        pool.join(queue.name, self.requested, drain)
        # The first window opens at the first micro-batch: the time Spark took to start is no
        # part of a processing rate (read as one, a warm-up's few records look like a backlog
        # the executors cannot keep up with).
        self.window_start: float | None = None
        self.handled = 0
        self.busy_s = 0.0  # handler calls' seconds in the window
        self.paused = False  # a drain stopped consumption during the window
        self.last_lag: int | None = None
        self.least_lag: int | None = None  # the smallest backlog a batch of the window saw
        self.last_batch_at = clock()  # when a batch of the queue last ended (or the queue started)
        self.decisions: list[dict[str, Any]] = []

    def on_batch(
        self, handled: int, lag_by_partition: dict[int, int | None] | None, busy_s: float = 0.0
    ) -> Decision | None:
        """A micro-batch ended: ``handled`` records reached an outcome, their handler calls took
        ``busy_s`` seconds in all, and the backlog is ``lag_by_partition`` (None: unreadable)."""
        if not self.enabled:
            return None
        # Before the pool hears of the batch: a drain that this batch ends still paused the window.
        self.paused = self.paused or self._drain_pauses()
        self.last_batch_at = self.clock()
        self.pool.batch_ran(self.name)
        ids = self.pool.executor_ids()
        # The queue's part of a pool that other queues share: its rate is measured on those.
        running = self.pool.share(self.name, len(ids))
        # Every batch, not only at decisions: no decision is taken while the backlog cannot be
        # read, and the executors running then are what an operator most wants to see.
        self.on_executors(running, self.requested)
        now = self.clock()
        if self.window_start is None:
            self.window_start = now
            return None
        self.handled += handled
        self.busy_s += busy_s
        if lag_by_partition is None:
            return None
        lag = sum(v for v in lag_by_partition.values() if v is not None)
        self.least_lag = lag if self.least_lag is None else min(self.least_lag, lag)
        elapsed = now - self.window_start
        if elapsed < self.policy.interval_s:
            return None
        processing_rate = self.handled / elapsed
        growth = 0.0 if self.last_lag is None else (lag - self.last_lag) / elapsed
        observation = Observation(
            now_s=now,
            lag_by_partition=lag_by_partition,
            input_rate=max(0.0, processing_rate + growth),
            processing_rate=processing_rate,
            executors=running,
            requested=self.requested,
            in_flight=self.busy_s / elapsed,
            paused=self.paused or self._drain_pauses(),
            least_lag=self.least_lag,
        )
        decision = decide(self.policy, observation, self.state)
        self.state = decision.state
        self.window_start, self.handled, self.busy_s, self.paused, self.last_lag = now, 0, 0.0, False, lag
        self.least_lag = None
        previous, self.requested = self.requested, decision.desired
        if decision.desired != previous:
            self.pool.set_demand(self.name, decision.desired, ids)
            log.info("executors %d -> %d: %s (backlog %d)", previous, decision.desired, decision.reason, lag)
        self.decisions.append(
            {
                "at_s": round(now, 1),
                "running": running,
                "requested": previous,
                "desired": decision.desired,
                "lag": lag,
                "reason": decision.reason,
            }
        )
        self.on_executors(running, self.requested)
        return decision

    def on_waiting(self, waiting: int | None) -> None:
        """Records wait (``waiting``, None: unknown) and no batch of the queue has ended for
        ``STARVED_S``: a queue that holds no executor of its own asks for one.

        Decisions come at the end of a batch, and a queue whose batches do not run gets none. In
        an application, Spark's FAIR pools tie while no task of theirs runs and then go by name,
        so on fewer cores than busy queues the queue last by name never gets a task: with a
        minimum of 0 it would wait for good. Its own executor gives it a core; the decisions
        that its batches then bring take the demand from there, back to 0 once it is idle.
        """
        if not self.enabled or self.requested > 0 or not waiting or self.policy.ceiling < 1:
            return
        if self.clock() - self.last_batch_at < STARVED_S:
            return
        self.requested = 1
        ids = self.pool.executor_ids()
        self.pool.set_demand(self.name, 1, ids)
        self.on_executors(self.pool.share(self.name, len(ids)), self.requested)
        log.info("executors 0 -> 1: %d records wait and no batch has run for %.0fs", waiting, STARVED_S)

    def _drain_pauses(self) -> bool:
        """A removal waits for a drain that stops this queue's consumption (a queue that does not
        drain, consumer or kmq, goes on meanwhile)."""
        return self.drains and self.pool.draining()
