"""Dead letters the DLQ refused show in the metrics by what became of them: a worker whose DLQ
refuses writes must look degraded, not idle and green."""

from __future__ import annotations

import pyarrow as pa
from prometheus_client import generate_latest

from queueplane.run.driver.metrics import WorkerMetrics
from queueplane.run.outcomes import Outcome, outcome_batch
from queueplane.run.parking import LOST, PARKED, RETRYING, refused_failure


def _row(offset: int, outcome: str, error: str | None) -> Outcome:
    return Outcome("t", 0, offset, None, 1, outcome, error, 1.0, 1)


def _error(fate: str) -> str:
    failure = refused_failure(fate, "the record was refused")
    return f"{failure.error_class}: {failure.message}"


def test_refused_dead_letters_are_counted_by_outcome():
    metrics = WorkerMetrics("q")
    rows = [
        _row(1, "released", _error(PARKED)),
        _row(2, "released", _error(PARKED)),
        _row(3, "released", _error(RETRYING)),
        _row(4, "released", "Retry: not yet"),
        _row(5, "accepted", None),
    ]
    metrics.observe({"released": 4, "accepted": 1}, pa.Table.from_batches([outcome_batch(rows)]))
    text = generate_latest(metrics.registry).decode()
    series = 'queueplane_dead_letter_write_failures_total{{outcome="{}",queue="q"}}'
    assert f"{series.format(PARKED)} 2.0" in text
    assert f"{series.format(RETRYING)} 1.0" in text
    assert f"{series.format(LOST)} 0.0" in text  # every outcome's series exists from the start
