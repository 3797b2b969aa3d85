"""The Queue resource's status: what `kubectl get queues` and `kubectl describe queue` show.

The chart creates one ``Queue`` object per release (its definition is in the chart's crds/),
and the worker's driver patches that object's status subresource every few seconds. Nothing
reconciles a Queue: the driver is the only process that knows the queue's phase, backlog,
rate and executors, and the Deployment already restarts it, so the status is a report
written by the one party that has the facts (see docs/kubernetes.md for what a controller
would add). Building a status is pure (``StatusBuilder``, tested without a cluster); the
reporter thread and the API call sit behind callables the driver hands in.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from queueplane.run.driver.health import Verdict
from queueplane.run.driver.kube_api import InClusterApi

log = logging.getLogger("queueplane.worker")

GROUP, VERSION, PLURAL = "queueplane.io", "v1", "queues"
REPORT_EVERY_S = 5.0
# Executors asked for but not running for this long (no room on the nodes, pulls failing):
# the queue is degraded, not merely scaling.
MISSING_EXECUTORS_S = 120.0
LAST_ERROR_CHARS = 300

STARTING, RUNNING, DRAINING, DEGRADED, STOPPED, FAILED = (
    "Starting",
    "Running",
    "Draining",
    "Degraded",
    "Stopped",
    "Failed",
)


@dataclass(frozen=True)
class Observation:
    """What the driver knows about its queue at one moment (wall clock ``at``, seconds)."""

    at: float
    phase: str  # STARTING, RUNNING, DRAINING, STOPPED or FAILED; DEGRADED is the builder's call
    ready: Verdict
    lag: int | None
    oldest_s: float | None
    finished: int  # records accepted or dead-lettered by this driver so far
    dead_lettered: int  # records this driver sent to the DLQ so far
    dead_letters: int | None  # records pending in the DLQ topic (any writer), None if unknown
    executors_running: int
    executors_requested: int
    max_executors: int
    target_lag_s: float
    last_error: str | None  # the newest error the driver saw (a handler's, Kafka's, the query's)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _timestamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StatusBuilder:
    """Status documents from observations; keeps what one observation alone cannot tell.

    The rate needs the previous observation, a condition keeps its lastTransitionTime while its
    status holds, missing executors count from when they went missing, and the last error stays
    shown once the worker has moved on (with when it was seen).
    """

    def __init__(self) -> None:
        self._previous: Observation | None = None
        self._conditions: dict[str, dict[str, str]] = {}
        self._missing_since: float | None = None
        self._last_error: tuple[str, float] | None = None

    def status(self, obs: Observation) -> dict[str, Any]:
        previous, self._previous = self._previous, obs
        interval = obs.at - previous.at if previous is not None else 0.0
        rate = (obs.finished - previous.finished) / interval if previous is not None and interval > 0 else 0.0
        newly_dead = obs.dead_lettered - previous.dead_lettered if previous is not None else obs.dead_lettered
        if obs.last_error and (self._last_error is None or self._last_error[0] != obs.last_error):
            self._last_error = (obs.last_error, obs.at)
        if obs.executors_running < obs.executors_requested:
            self._missing_since = self._missing_since if self._missing_since is not None else obs.at
        else:
            self._missing_since = None

        lagging = obs.oldest_s is not None and obs.oldest_s > obs.target_lag_s
        degraded = self._degraded(obs, lagging)
        phase = DEGRADED if obs.phase == RUNNING and degraded is not None else obs.phase
        conditions = [
            self._condition(
                "Ready",
                obs.ready.ok,
                "Working" if obs.ready.ok else "NotReady",
                obs.ready.reason,
                obs.at,
            ),
            self._lagging(obs, lagging),
            self._condition(
                "DeadLettering",
                newly_dead > 0,
                "RecordsDeadLettered" if newly_dead > 0 else "NoneRecently",
                f"{newly_dead} records went to the DLQ in the last {interval:.0f}s"
                if newly_dead > 0
                else f"no record went to the DLQ in the last {interval:.0f}s",
                obs.at,
            ),
            self._condition(
                "Degraded",
                degraded is not None,
                degraded[0] if degraded is not None else "Healthy",
                degraded[1] if degraded is not None else "the worker runs as asked",
                obs.at,
            ),
        ]
        status: dict[str, Any] = {
            "phase": phase,
            "lag": obs.lag,
            "oldestSeconds": None if obs.oldest_s is None else round(obs.oldest_s, 1),
            "oldest": _age(obs.oldest_s),
            "ratePerSecond": round(rate, 1),
            "executors": f"{obs.executors_running}/{obs.executors_requested}",
            "executorsRunning": obs.executors_running,
            "executorsRequested": obs.executors_requested,
            "deadLetters": obs.dead_letters,
            "lastError": "",
            "lastErrorTime": None,
            "updated": _timestamp(obs.at),
            "conditions": conditions,
        }
        if self._last_error is not None:
            status["lastError"] = self._last_error[0][:LAST_ERROR_CHARS]
            status["lastErrorTime"] = _timestamp(self._last_error[1])
        return status

    def _degraded(self, obs: Observation, lagging: bool) -> tuple[str, str] | None:
        if obs.phase == FAILED:
            return "QueryFailed", obs.last_error or "the streaming query stopped with an error"
        if obs.phase in (STARTING, STOPPED):
            return None
        if not obs.ready.ok:
            return "NotReady", obs.ready.reason
        if self._missing_since is not None and obs.at - self._missing_since >= MISSING_EXECUTORS_S:
            return "ExecutorsMissing", (
                f"{obs.executors_requested - obs.executors_running} of {obs.executors_requested} requested "
                f"executors have not run for {obs.at - self._missing_since:.0f}s"
            )
        if lagging and obs.executors_requested >= obs.max_executors > 0:
            return "AtMaxExecutors", (
                f"the backlog is over target with all {obs.max_executors} executors the spec allows"
            )
        return None

    def _lagging(self, obs: Observation, lagging: bool) -> dict[str, str]:
        if obs.oldest_s is None:
            return self._condition(
                "Lagging", None, "AgeUnknown", "the oldest waiting record's age could not be read", obs.at
            )
        return self._condition(
            "Lagging",
            lagging,
            "OverTarget" if lagging else "WithinTarget",
            f"the oldest waiting record has waited {_age(obs.oldest_s) or '0s'}; the target is {obs.target_lag_s:.0f}s",
            obs.at,
        )

    def _condition(self, kind: str, value: bool | None, reason: str, message: str, at: float) -> dict[str, str]:
        status = "Unknown" if value is None else str(bool(value))
        before = self._conditions.get(kind)
        since = before["lastTransitionTime"] if before is not None and before["status"] == status else _timestamp(at)
        condition = {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": since}
        self._conditions[kind] = condition
        return condition


@dataclass(frozen=True)
class QueueReads:
    """The Kafka reads behind a watched worker's status and gauges, made off the batch path.

    How old the oldest waiting record is and how many records wait in the DLQ are questions
    about the queue, answered by queueplane.ops; the entrypoint hands them in (ops.status.queue_reads).
    """

    oldest_seconds: Callable[[], float | None]
    dead_letters: Callable[[], int | None]


class StatusReporter:
    """Observes the queue every REPORT_EVERY_S on a thread of its own, and once more at the end.

    Each observation becomes a status document for ``patch`` (the Queue resource), when there is one.

    A patch that fails (the API server away, the Queue object or its definition missing, the
    Role not allowing it) is logged when it starts failing and when it works again, and never
    stops the worker: the status is a report, the queue's work comes first.
    """

    def __init__(
        self,
        observe: Callable[[], Observation],
        patch: Callable[[dict[str, Any]], None],
        every_s: float = REPORT_EVERY_S,
    ):
        self.observe = observe
        self.patch = patch
        self.every_s = every_s
        self.builder = StatusBuilder()
        self._failing = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="qp-queue-status", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def report(self, observation: Observation | None = None) -> None:
        with self._lock:  # the final report must not interleave with the thread's
            try:
                self.patch(self.builder.status(observation or self.observe()))
            except Exception as exc:  # a report must never stop the worker
                if not self._failing:
                    log.warning("the Queue status could not be written (kubectl get queues shows it stale): %s", exc)
                self._failing = True
            else:
                if self._failing:
                    log.info("the Queue status is written again")
                self._failing = False

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.report()

    def stop(self, final: Observation | None = None) -> None:
        """Stop the thread; ``final`` (the stopped or failed queue) is reported last."""
        self._stop.set()
        self._thread.join(timeout=self.every_s + 30)
        if final is not None:
            self.report(final)


class InClusterStatusPatch:
    """A merge patch of one Queue's status subresource, as the pod's service account.
    ``resource`` is ``namespace/name``."""

    def __init__(self, resource: str, api: InClusterApi | None = None):
        namespace, _, name = resource.partition("/")
        if not namespace or not name or "/" in name:
            raise ValueError(f"--status-resource {resource!r}: expected NAMESPACE/NAME")
        self.path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"
        self.api = api or InClusterApi()

    def __call__(self, status: dict[str, Any]) -> None:
        self.api("PATCH", self.path, {"status": status})
