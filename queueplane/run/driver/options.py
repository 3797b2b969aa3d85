"""What a run is asked to do, and what it reports: shared by the driver, the CLI and the entrypoint."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RunOptions:
    """What a worker run is asked to do. The worker's flags make it (queueplane/cli/worker_command.py,
    one flag per field but batch_ms); tests and benchmarks build it directly."""

    local: bool = True
    until_idle_s: float | None = None
    max_records: int | None = None
    max_duration_s: float | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    tasks: int | None = None  # parallel tasks per micro-batch; default: the cores Spark has
    batch_ms: int | None = None  # share groups: time slice of one micro-batch (default: the runtime's)
    checkpoint_dir: str | None = None
    max_batch_records: int | None = None  # consumer groups: most records per micro-batch (maxOffsetsPerTrigger)
    scaling: dict[str, float] = field(default_factory=dict)  # autoscaling policy overrides (intervals, cooldowns)
    event_log_dir: str | None = None  # Spark event logs (for a history server): a path or an object-store URL


@dataclass
class BatchProgress:
    batch_id: int
    counts: dict[str, int]
    batch_counts: dict[str, int]
    backlog: int | None
    elapsed_s: float


SUMMARY_DEAD_ROWS = 100
STARTUP_WAIT_S = 120.0  # how long a starting worker waits for an unreachable cluster


@dataclass
class DeadLetters:
    """The dead letters a run reports: the first SUMMARY_DEAD_ROWS in full, all counted by
    delivery count. A poison flood must not grow the driver's memory; `queueplane dlq list`
    shows every one."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    by_delivery_count: Counter[int] = field(default_factory=Counter)

    def add(self, row: dict[str, Any]) -> None:
        self.by_delivery_count[row["delivery_count"]] += 1
        if len(self.rows) < SUMMARY_DEAD_ROWS:
            self.rows.append(row)

    def merge(self, other: DeadLetters) -> None:
        self.by_delivery_count.update(other.by_delivery_count)
        self.rows.extend(other.rows[: max(0, SUMMARY_DEAD_ROWS - len(self.rows))])


@dataclass
class RunSummary:
    queue: str
    group_type: str
    counts: dict[str, int]
    dead_lettered: list[dict[str, Any]]  # the first SUMMARY_DEAD_ROWS
    duration_s: float
    batches: int
    records_per_s: float
    lag_at_exit: int | None
    lag_by_partition: dict[str, int | None] = field(default_factory=dict)
    scaling: list[dict[str, Any]] = field(default_factory=list)
    dead_lettered_by_delivery_count: dict[int, int] = field(default_factory=dict)
    # Consumer and kmq groups: records retention removed before the group read them (skipped).
    removed_by_retention: int = 0
    # When the driver's backlog reads found Kafka not answering (began, seconds, first error).
    kafka_outages: list[dict[str, Any]] = field(default_factory=list)
    # Errors the driver's Kafka clients reported outside a request, by name (clients.ERRORS).
    kafka_client_errors: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
