"""Prometheus metrics of a worker, exported from the driver, and its health endpoints.

The driver sees every outcome row, so counts and histograms there are complete without
aggregating across executor processes. A row may stand for a run of accepted records
(outcomes.py): it counts its ``records``, and its latency bucket counts go into the histogram
as they are. The same port answers `/livez` and `/readyz` (200 or
503 with the reason), which the chart's probes call.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import numpy as np
import pyarrow.compute as pc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

from queueplane.run.driver.health import Verdict
from queueplane.run.outcomes import ACCEPTED, DEAD_LETTERED, DLQ_WRITE_FAILED, LATENCY_BUCKETS, LATENCY_SLOTS, RELEASED
from queueplane.run.parking import FATES, fate_prefix


class Checks(Protocol):
    """What the probes ask: a worker's health, or an application's over all its queues."""

    def live(self, now: float) -> Verdict: ...
    def ready(self, now: float) -> Verdict: ...


DELIVERY_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 20)


def _add_counts(histogram: Any, bounds: tuple[float, ...], counts: np.ndarray, total: float) -> None:
    """Histogram.observe for many values at once, given as counts per bucket (one per bound, then
    +Inf) and their sum: one increment per bucket.

    prometheus_client has no bulk observe; this uses its bucket and sum values, and falls back
    to observing each bucket's count at its bound (the counts exact, the sum not) if they are
    not where this version keeps them.
    """
    buckets, summed = getattr(histogram, "_buckets", None), getattr(histogram, "_sum", None)
    if buckets is None or summed is None or len(buckets) != len(counts):
        for i, n in enumerate(counts.tolist()):
            value = bounds[i] if i < len(bounds) else math.nextafter(bounds[-1], math.inf)
            for _ in range(n):
                histogram.observe(value)
        return
    for i, n in enumerate(counts.tolist()):
        if n:
            buckets[i].inc(n)
    summed.inc(total)


def bucket_counts(bounds: tuple[float, ...], values: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """How many values (each ``weights`` times) fall in each bucket, as the histogram places them:
    in the first bucket whose bound they do not pass, +Inf last."""
    index = np.searchsorted(np.asarray(bounds, dtype=float), values, side="left")
    return np.bincount(index, weights=weights, minlength=len(bounds) + 1).astype(np.int64)


def latency_histogram(table: Any) -> np.ndarray:
    """Records per latency bucket in a table of outcome rows: the runs' counts summed, and the
    one-record rows' latencies placed in the same buckets."""
    buckets = table.column("latency_buckets")
    runs = pc.list_flatten(buckets).to_numpy()
    counts = (
        runs.reshape(-1, LATENCY_SLOTS).sum(axis=0, dtype=np.int64) if len(runs) else np.zeros(LATENCY_SLOTS, np.int64)
    )
    single = pc.is_null(buckets)
    if pc.any(single).as_py():
        latencies = table.column("latency_ms").filter(single).to_numpy() / 1000
        counts = counts + bucket_counts(LATENCY_BUCKETS, latencies)
    return counts


class _KafkaCollector:
    """Counters whose totals live elsewhere (the clients' error counts, each queue's backlog outages).

    One per registry: an application's queues share its driver's Kafka clients, so each queue
    shows the driver's error counts beside the time its own backlog reads went unanswered.
    """

    def __init__(self) -> None:
        self.queues: dict[str, tuple[Callable[[], Mapping[str, int]], Callable[[], float]]] = {}

    def collect(self) -> Iterator[CounterMetricFamily]:
        errors = CounterMetricFamily(
            "queueplane_kafka_client_errors",
            "Errors the driver's Kafka clients reported outside a request (broker down, refused, reset), by name.",
            labels=["queue", "error"],
        )
        unanswered = CounterMetricFamily(
            "queueplane_kafka_unanswered_seconds",
            "Time the driver's backlog reads found Kafka not answering.",
            labels=["queue"],
        )
        for queue, (read_errors, unanswered_s) in sorted(self.queues.items()):
            for name, count in sorted(read_errors().items()):
                errors.add_metric([queue, name], count)
            unanswered.add_metric([queue], unanswered_s())
        yield errors
        yield unanswered


class _Families:
    """The metric families of one registry, which every queue of an application labels with its name."""

    def __init__(self, registry: CollectorRegistry):
        self.records = Counter(
            "queueplane_records",
            "Records handled, by outcome (accepted, released, dlq).",
            ["queue", "outcome"],
            registry=registry,
        )
        self.dlq_write_failures = Counter(
            "queueplane_dead_letter_write_failures",
            "Dead letters the DLQ refused, by what became of them: parked in the queue's topic until the "
            "DLQ takes them, retrying (parking failed too: delivered again), lost (a share record's last "
            "delivery ran out with both writes failing).",
            ["queue", "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            "queueplane_handler_latency_seconds",
            "Handler call time per delivery.",
            ["queue"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.deliveries = Histogram(
            "queueplane_delivery_count",
            "Delivery count of each handled record.",
            ["queue"],
            buckets=DELIVERY_BUCKETS,
            registry=registry,
        )
        self.inflight = Gauge(
            "queueplane_inflight",
            "Most handler calls in flight at once in the last batch.",
            ["queue"],
            registry=registry,
        )
        self.backlog = Gauge(
            "queueplane_backlog_records",
            "Records not yet delivered, per partition.",
            ["queue", "partition"],
            registry=registry,
        )
        self.removed_unread = Gauge(
            "queueplane_records_removed_unread",
            "Records retention removed before the group read them (skipped: in neither output nor DLQ).",
            ["queue"],
            registry=registry,
        )
        self.executors = Gauge(
            "queueplane_executors",
            "Spark executors: running (registered with the driver) and requested by the autoscaler.",
            ["queue", "state"],
            registry=registry,
        )
        self.oldest_waiting = Gauge(
            "queueplane_oldest_waiting_seconds",
            "How long the oldest record the group has not finished has waited (read every few seconds).",
            ["queue"],
            registry=registry,
        )
        self.dead_letters_pending = Gauge(
            "queueplane_dead_letters_pending",
            "Records waiting in the dead-letter topic after its redrive position (counted every few seconds).",
            ["queue"],
            registry=registry,
        )
        self.target_lag = Gauge(
            "queueplane_target_lag_seconds",
            "The spec's autoscaling.targetLagSeconds: the oldest wait the queue should stay under.",
            ["queue"],
            registry=registry,
        )
        self.max_executors = Gauge(
            "queueplane_max_executors",
            "The most executors the autoscaler may ask for (the spec's bound, or the partitions' cap).",
            ["queue"],
            registry=registry,
        )
        self.kafka = _KafkaCollector()
        registry.register(self.kafka)


_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = weakref.WeakKeyDictionary()


class WorkerMetrics:
    """One queue's series in a registry; the queues of one application share the registry."""

    def __init__(self, queue: str, registry: CollectorRegistry | None = None):
        self.queue = queue
        self.registry = registry if registry is not None else CollectorRegistry()
        if self.registry not in _FAMILIES:
            _FAMILIES[self.registry] = _Families(self.registry)
        families = self.f = _FAMILIES[self.registry]
        # Every labelled series exists from the start, at 0: a rate over a series that appears
        # with its first increment misses that increment, and an absent series reads as no data.
        for outcome in (ACCEPTED, RELEASED, DEAD_LETTERED):
            families.records.labels(queue, outcome)
        for fate in FATES:
            families.dlq_write_failures.labels(queue, fate)
        families.latency.labels(queue)
        families.deliveries.labels(queue)
        families.inflight.labels(queue)

    def watch_kafka(self, errors: Callable[[], Mapping[str, int]], unanswered_s: Callable[[], float]) -> None:
        """Kafka as the driver sees it, read at each scrape: client errors by name, time without an answer."""
        self.f.kafka.queues[self.queue] = (errors, unanswered_s)

    def observe(self, counts: Mapping[str, int], table: Any) -> None:
        """One batch of outcome rows (an Arrow table), added in bulk rather than row by row."""
        for outcome, n in counts.items():
            self.f.records.labels(self.queue, outcome).inc(n)
        if counts.get(RELEASED):
            errors = table.column("error")
            if pc.sum(pc.starts_with(errors, DLQ_WRITE_FAILED)).as_py():
                for fate in FATES:
                    refused = pc.sum(pc.starts_with(errors, fate_prefix(fate))).as_py()
                    if refused:
                        self.f.dlq_write_failures.labels(self.queue, fate).inc(refused)
        if table.num_rows:
            latency_s = (pc.sum(table.column("latency_ms")).as_py() or 0.0) / 1000
            _add_counts(self.f.latency.labels(self.queue), LATENCY_BUCKETS, latency_histogram(table), latency_s)
            deliveries = table.column("delivery_count").to_numpy().astype(np.int64)
            records = table.column("records").to_numpy().astype(np.int64)
            _add_counts(
                self.f.deliveries.labels(self.queue),
                DELIVERY_BUCKETS,
                bucket_counts(DELIVERY_BUCKETS, deliveries, records),
                float((deliveries * records).sum()),
            )
            self.f.inflight.labels(self.queue).set(pc.max(table.column("inflight")).as_py() or 0)

    def set_backlog(self, lag: dict[int, int | None] | None) -> None:
        for partition, value in (lag or {}).items():
            if value is not None:
                self.f.backlog.labels(self.queue, str(partition)).set(value)

    def set_removed_unread(self, count: int) -> None:
        self.f.removed_unread.labels(self.queue).set(count)

    def set_bounds(self, target_lag_s: float, max_executors: int) -> None:
        self.f.target_lag.labels(self.queue).set(target_lag_s)
        self.f.max_executors.labels(self.queue).set(max_executors)

    def set_queue_reads(self, oldest_s: float | None, dead_letters: int | None) -> None:
        """The latest reads; an unknown one keeps its last value (Prometheus would see a gap as a reset)."""
        if oldest_s is not None:
            self.f.oldest_waiting.labels(self.queue).set(oldest_s)
        if dead_letters is not None:
            self.f.dead_letters_pending.labels(self.queue).set(dead_letters)

    def set_executors(self, running: int, requested: int) -> None:
        self.f.executors.labels(self.queue, "running").set(running)
        self.f.executors.labels(self.queue, "requested").set(requested)


class MetricsServer:
    """The driver's HTTP endpoint: ``/metrics`` from a registry, ``/livez`` and ``/readyz`` from a health."""

    def __init__(self, registry: CollectorRegistry, health: Checks, port: int, host: str):
        self._server = ThreadingHTTPServer((host, port), _handler(registry, health))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="qp-metrics", daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(registry: CollectorRegistry, health: Checks) -> type[BaseHTTPRequestHandler]:
    checks: dict[str, Callable[[float], Verdict]] = {"/livez": health.live, "/readyz": health.ready}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif path in checks:
                verdict = checks[path](time.monotonic())
                self._send(200 if verdict.ok else 503, "text/plain; charset=utf-8", f"{verdict.reason}\n".encode())
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found: /metrics, /livez, /readyz\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: no access log
            return None

    return Handler
