"""Prometheus metrics of a worker, exported from the driver.

The driver sees every outcome row, so counts and histograms there are complete without
aggregating across executor processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

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
        self.executors = Gauge(
            "queueplane_executors",
            "Spark executors: running (registered with the driver) and requested by the autoscaler.",
            ["queue", "state"],
            registry=self.registry,
        )
        self._server: Any = None

    def serve(self, port: int, host: str) -> None:
        self._server, _thread = start_http_server(port, addr=host, registry=self.registry)

    def observe(self, counts: Mapping[str, int], table: Any) -> None:
        """One batch of outcome rows (an Arrow table), added in bulk rather than row by row."""
        for outcome, n in counts.items():
            self.records.labels(self.queue, outcome).inc(n)
        if table.num_rows:
            _observe_many(self.latency.labels(self.queue), table.column("latency_ms").to_numpy() / 1000)
            _observe_many(self.deliveries.labels(self.queue), table.column("delivery_count").to_numpy())
            self.inflight.labels(self.queue).set(pc.max(table.column("inflight")).as_py() or 0)

    def set_backlog(self, lag: dict[int, int | None] | None) -> None:
        for partition, value in (lag or {}).items():
            if value is not None:
                self.backlog.labels(self.queue, str(partition)).set(value)

    def set_executors(self, running: int, requested: int) -> None:
        self.executors.labels(self.queue, "running").set(running)
        self.executors.labels(self.queue, "requested").set(requested)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
