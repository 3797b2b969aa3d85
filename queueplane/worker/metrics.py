"""Prometheus metrics of a worker, exported from the driver.

The driver sees every outcome row, so counts and histograms there are complete without
aggregating across executor processes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
DELIVERY_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 20)


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
        self._server: Any = None

    def serve(self, port: int, host: str) -> None:
        self._server, _thread = start_http_server(port, addr=host, registry=self.registry)

    def observe(self, rows: Iterable[Any]) -> None:
        peak = 0
        for row in rows:
            self.records.labels(self.queue, row.outcome).inc()
            self.latency.labels(self.queue).observe(row.latency_ms / 1000)
            self.deliveries.labels(self.queue).observe(row.delivery_count)
            peak = max(peak, row.inflight or 0)
        self.inflight.labels(self.queue).set(peak)

    def set_backlog(self, lag: dict[int, int | None] | None) -> None:
        for partition, value in (lag or {}).items():
            if value is not None:
                self.backlog.labels(self.queue, str(partition)).set(value)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
