"""Prometheus metrics of a worker, exported from the driver, and its health endpoints.

The driver sees every outcome row, so counts and histograms there are complete without
aggregating across executor processes. The same port answers `/livez` and `/readyz` (200 or
503 with the reason), which the chart's probes call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pyarrow.compute as pc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

from queueplane.run.health import Health, Verdict
from queueplane.run.outcomes import ACCEPTED, DEAD_LETTERED, DLQ_WRITE_FAILED, RELEASED

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
DELIVERY_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 20)


def _observe_many(histogram: Any, values: np.ndarray) -> None:
    """Histogram.observe for many values at once: bucket counts with numpy, one increment per bucket.

    prometheus_client has no bulk observe; this uses its bucket and sum values, and falls
    back to observing one by one if they are not where this version keeps them.
    """
    buckets, total = getattr(histogram, "_buckets", None), getattr(histogram, "_sum", None)
    bounds = getattr(histogram, "_upper_bounds", None)
    if buckets is None or total is None or bounds is None:
        for value in values:
            histogram.observe(float(value))
        return
    index = np.searchsorted(np.asarray(bounds, dtype=float), values, side="left")
    for bucket, n in zip(*np.unique(index, return_counts=True), strict=True):
        buckets[int(bucket)].inc(int(n))
    total.inc(float(values.sum()))


class _KafkaCollector:
    """Counters whose totals live elsewhere (the clients' error counts, the backlog watcher's outages)."""

    def __init__(self, queue: str, errors: Callable[[], Mapping[str, int]], unanswered_s: Callable[[], float]):
        self.queue, self.errors, self.unanswered_s = queue, errors, unanswered_s

    def collect(self) -> Iterator[CounterMetricFamily]:
        errors = CounterMetricFamily(
            "queueplane_kafka_client_errors",
            "Errors the driver's Kafka clients reported outside a request (broker down, refused, reset), by name.",
            labels=["queue", "error"],
        )
        for name, count in sorted(self.errors().items()):
            errors.add_metric([self.queue, name], count)
        yield errors
        unanswered = CounterMetricFamily(
            "queueplane_kafka_unanswered_seconds",
            "Time the driver's backlog reads found Kafka not answering.",
            labels=["queue"],
        )
        unanswered.add_metric([self.queue], self.unanswered_s())
        yield unanswered


class WorkerMetrics:
    def __init__(self, queue: str):
        self.queue = queue
        self.registry = CollectorRegistry()
        self.records = Counter(
            "queueplane_records",
            "Records handled, by outcome (accepted, released, dlq).",
            ["queue", "outcome"],
            registry=self.registry,
        )
        self.dlq_write_failures = Counter(
            "queueplane_dead_letter_write_failures",
            "Dead letters the DLQ refused (each parked in the queue's topic until it takes them).",
            ["queue"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "queueplane_handler_latency_seconds",
            "Handler call time per delivery.",
            ["queue"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.deliveries = Histogram(
            "queueplane_delivery_count",
            "Delivery count of each handled record.",
            ["queue"],
            buckets=DELIVERY_BUCKETS,
            registry=self.registry,
        )
        self.inflight = Gauge(
            "queueplane_inflight",
            "Most handler calls in flight at once in the last batch.",
            ["queue"],
            registry=self.registry,
        )
        self.backlog = Gauge(
            "queueplane_backlog_records",
            "Records not yet delivered, per partition.",
            ["queue", "partition"],
            registry=self.registry,
        )
        self.removed_unread = Gauge(
            "queueplane_records_removed_unread",
            "Records retention removed before the group read them (skipped: in neither output nor DLQ).",
            ["queue"],
            registry=self.registry,
        )
        self.executors = Gauge(
            "queueplane_executors",
            "Spark executors: running (registered with the driver) and requested by the autoscaler.",
            ["queue", "state"],
            registry=self.registry,
        )
        self.oldest_waiting = Gauge(
            "queueplane_oldest_waiting_seconds",
            "How long the oldest record the group has not finished has waited (read every few seconds).",
            ["queue"],
            registry=self.registry,
        )
        self.dead_letters_pending = Gauge(
            "queueplane_dead_letters_pending",
            "Records waiting in the dead-letter topic after its redrive position (counted every few seconds).",
            ["queue"],
            registry=self.registry,
        )
        self.target_lag = Gauge(
            "queueplane_target_lag_seconds",
            "The spec's autoscaling.targetLagSeconds: the oldest wait the queue should stay under.",
            ["queue"],
            registry=self.registry,
        )
        self.max_executors = Gauge(
            "queueplane_max_executors",
            "The most executors the autoscaler may ask for (the spec's bound, or the partitions' cap).",
            ["queue"],
            registry=self.registry,
        )
        # Every labelled series exists from the start, at 0: a rate over a series that appears
        # with its first increment misses that increment, and an absent series reads as no data.
        for outcome in (ACCEPTED, RELEASED, DEAD_LETTERED):
            self.records.labels(queue, outcome)
        self.dlq_write_failures.labels(queue)
        self.latency.labels(queue)
        self.deliveries.labels(queue)
        self.inflight.labels(queue)
        self._server: Any = None

    def watch_kafka(self, errors: Callable[[], Mapping[str, int]], unanswered_s: Callable[[], float]) -> None:
        """Kafka as the driver sees it, read at each scrape: client errors by name, time without an answer."""
        self.registry.register(_KafkaCollector(self.queue, errors, unanswered_s))

    def serve(self, port: int, host: str, health: Health) -> None:
        self._server = ThreadingHTTPServer((host, port), _handler(self.registry, health))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="qp-metrics", daemon=True).start()

    def observe(self, counts: Mapping[str, int], table: Any) -> None:
        """One batch of outcome rows (an Arrow table), added in bulk rather than row by row."""
        for outcome, n in counts.items():
            self.records.labels(self.queue, outcome).inc(n)
        if counts.get(RELEASED):
            refused = pc.sum(pc.starts_with(table.column("error"), DLQ_WRITE_FAILED)).as_py()
            if refused:
                self.dlq_write_failures.labels(self.queue).inc(refused)
        if table.num_rows:
            _observe_many(self.latency.labels(self.queue), table.column("latency_ms").to_numpy() / 1000)
            _observe_many(self.deliveries.labels(self.queue), table.column("delivery_count").to_numpy())
            self.inflight.labels(self.queue).set(pc.max(table.column("inflight")).as_py() or 0)

    def set_backlog(self, lag: dict[int, int | None] | None) -> None:
        for partition, value in (lag or {}).items():
            if value is not None:
                self.backlog.labels(self.queue, str(partition)).set(value)

    def set_removed_unread(self, count: int) -> None:
        self.removed_unread.labels(self.queue).set(count)

    def set_bounds(self, target_lag_s: float, max_executors: int) -> None:
        self.target_lag.labels(self.queue).set(target_lag_s)
        self.max_executors.labels(self.queue).set(max_executors)

    def set_queue_reads(self, oldest_s: float | None, dead_letters: int | None) -> None:
        """The latest reads; an unknown one keeps its last value (Prometheus would see a gap as a reset)."""
        if oldest_s is not None:
            self.oldest_waiting.labels(self.queue).set(oldest_s)
        if dead_letters is not None:
            self.dead_letters_pending.labels(self.queue).set(dead_letters)

    def set_executors(self, running: int, requested: int) -> None:
        self.executors.labels(self.queue, "running").set(running)
        self.executors.labels(self.queue, "requested").set(requested)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _handler(registry: CollectorRegistry, health: Health) -> type[BaseHTTPRequestHandler]:
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
