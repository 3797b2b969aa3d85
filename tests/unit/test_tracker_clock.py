"""The kmq tracker's clock: ticks while the tracker may hold an open delivery, none while it holds none."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from queueplane.run.kmq.tracker import TrackerClock


def _progress(began: float, open_rows: int | None) -> dict:
    """A query progress report; without state operators, as for a trigger that ran no batch."""
    stamp = datetime.fromtimestamp(began, UTC).isoformat().replace("+00:00", "Z")
    operators = [] if open_rows is None else [{"numRowsTotal": open_rows}]
    return {"timestamp": stamp, "stateOperators": operators}


def test_the_clock_ticks_until_a_batch_after_the_last_worker_batch_has_found_nothing_open():
    clock = TrackerClock(producer=None, markers_topic="q.markers", interval_ms=2000)
    query = SimpleNamespace(lastProgress=None, isActive=True)
    assert clock.wanted(query), "no batch has run yet: its state is unknown"
    clock.last_worker_batch = 1_000.0
    query.lastProgress = _progress(1_001.0, 3)
    assert clock.wanted(query), "three deliveries open: their timers must fire"
    query.lastProgress = _progress(999.0, 0)
    assert clock.wanted(query), "that batch began before the worker's last batch ended: markers unread"
    query.lastProgress = _progress(1_002.0, 0)
    assert not clock.wanted(query), "nothing open after the last worker batch: the tracker may sleep"
    query.lastProgress = _progress(1_012.0, None)
    assert not clock.wanted(query), "a trigger without a batch reports no state: the last batch's count stands"
    assert clock.open_deliveries(query, 1_000.0) == 0
    clock.last_worker_batch = 1_020.0
    assert clock.wanted(query), "a worker batch since: its markers may have opened deliveries"
    assert clock.every_s == 1.0, "two ticks a tracker interval"
