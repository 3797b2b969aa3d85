"""Accepted records handed over as runs (queueplane.run.outcomes): a run is exactly a partition's
consecutive accepted records at one delivery count, and every count the driver makes of the rows
(outcomes, latency and delivery histograms, calls in flight, handler time) is the count it made
of one row per record."""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from queueplane.run.driver.metrics import DELIVERY_BUCKETS, WorkerMetrics
from queueplane.run.outcomes import (
    ACCEPTED,
    DEAD_LETTERED,
    LATENCY_BUCKETS,
    RELEASED,
    SKIPPED,
    Outcome,
    accepted_columns,
    columns_batch,
    columns_of,
    each_record,
    outcome_batch,
    outcome_counts,
)


def _accepted(partition: int, offset: int, latency_ms: float = 1.0, delivery: int = 1, inflight: int = 1) -> Outcome:
    return Outcome("q.work", partition, offset, None, delivery, ACCEPTED, None, latency_ms, inflight)


def _released(partition: int, offset: int) -> Outcome:
    return Outcome("q.work", partition, offset, "k", 1, RELEASED, "Retry: later", 2.0, 1)


def _spans(rows: list[Outcome]) -> list[tuple[int, int, int, int, str]]:
    """(partition, first offset, last offset, records, outcome) of each row handed over."""
    table = outcome_batch(rows).to_pydict()
    return sorted(
        zip(table["partition"], table["offset"], table["last_offset"], table["records"], table["outcome"], strict=True)
    )


def test_a_partitions_consecutive_accepted_records_are_one_row():
    rows = [_accepted(0, offset, latency_ms=offset % 7) for offset in range(100, 1100)]
    (row,) = outcome_batch(rows).to_pylist()
    assert (row["offset"], row["last_offset"], row["records"]) == (100, 1099, 1000)
    assert row["key"] is None and row["error"] is None


def test_a_record_not_accepted_breaks_the_run_and_keeps_its_own_row():
    rows = [_accepted(0, offset) for offset in range(10)]
    rows[4] = _released(0, 4)
    assert _spans(rows) == [(0, 0, 3, 4, ACCEPTED), (0, 4, 4, 1, RELEASED), (0, 5, 9, 5, ACCEPTED)]
    (released,) = [r for r in outcome_batch(rows).to_pylist() if r["outcome"] == RELEASED]
    assert (released["key"], released["error"], released["latency_ms"], released["latency_buckets"]) == (
        "k",
        "Retry: later",
        2.0,
        None,
    ), "a record not accepted is handed over as it was"


def test_a_partition_change_breaks_the_run():
    rows = [_accepted(0, o) for o in range(5)] + [_accepted(1, o) for o in range(5, 10)] + [_accepted(0, 5)]
    assert _spans(rows) == [(0, 0, 4, 5, ACCEPTED), (0, 5, 5, 1, ACCEPTED), (1, 5, 9, 5, ACCEPTED)]


def test_a_delivery_count_change_or_a_gap_breaks_the_run():
    rows = [_accepted(0, 0), _accepted(0, 1), _accepted(0, 2, delivery=2), _accepted(0, 3), _accepted(0, 5)]
    assert _spans(rows) == [
        (0, 0, 1, 2, ACCEPTED),
        (0, 2, 2, 1, ACCEPTED),
        (0, 3, 3, 1, ACCEPTED),
        (0, 5, 5, 1, ACCEPTED),
    ]


def test_records_accepted_out_of_order_make_the_runs_of_their_offsets():
    """kmq's handler threads end a task's records in any order."""
    offsets = [*range(0, 50), *range(51, 80)]
    random.Random(7).shuffle(offsets)
    assert _spans([_accepted(2, o) for o in offsets]) == [(2, 0, 49, 50, ACCEPTED), (2, 51, 79, 29, ACCEPTED)]
    twice = [_accepted(2, o) for o in (3, 4, 4, 5)]  # one offset accepted twice is counted twice
    assert sum(records for *_, records, _ in _spans(twice)) == 4


def test_a_poll_of_several_partitions_makes_a_run_of_each():
    messages = [
        Message(topic="q.work", partition=p, offset=o, delivery_count=1) for p, o in [(0, 5), (0, 6), (1, 2), (1, 3)]
    ]
    table = columns_batch([accepted_columns(messages, 3.0, [1, 4, 2, 2])]).to_pydict()
    assert list(zip(table["partition"], table["offset"], table["last_offset"], table["inflight"], strict=True)) == [
        (0, 5, 6, 4),
        (1, 2, 3, 2),
    ]
    assert table["latency_ms"] == [6.0, 6.0]
    assert table["latency_buckets"][0] == [0, 2] + [0] * (len(LATENCY_BUCKETS) - 1), "3 ms: the 5 ms bucket"


# Latencies on and around the bounds: a record exactly at a bound is in that bound's bucket.
latencies = st.one_of(
    st.sampled_from([bound * 1000 for bound in LATENCY_BUCKETS] + [0.0, 70_000.0]),
    st.floats(0, 70_000, allow_nan=False),
)
record_outcomes = st.tuples(
    st.integers(0, 2),  # partition
    st.integers(1, 3),  # offsets since the partition's last record (a gap above 1)
    st.sampled_from([ACCEPTED] * 6 + [RELEASED, DEAD_LETTERED, SKIPPED]),
    st.integers(1, 3),  # delivery count
    latencies,
    st.integers(0, 64),  # calls in flight
)


def _records(drawn: list[tuple[int, int, str, int, float, int]]) -> list[Outcome]:
    """Records' outcomes as a task has them: each partition's offsets rising."""
    last: dict[int, int] = {}
    rows = []
    for partition, step, outcome, delivery, latency_ms, inflight in drawn:
        offset = last[partition] = last.get(partition, 100) + step
        error = None if outcome == ACCEPTED else "Retry: later"
        rows.append(Outcome("q.work", partition, offset, None, delivery, outcome, error, latency_ms, inflight))
    return rows


def _samples(registry: CollectorRegistry, names: tuple[str, ...]) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in registry.collect()
        for sample in metric.samples
        if metric.name in names and not sample.name.endswith("_created")
    }


@settings(deadline=None, max_examples=150)
@given(st.lists(record_outcomes, min_size=1, max_size=120), st.booleans())
def test_the_driver_counts_of_runs_are_the_counts_of_one_row_per_record(drawn, shuffled):
    rows = _records(drawn)
    if shuffled:  # handed over in the order calls ended, not by offset
        random.Random(len(rows)).shuffle(rows)
    table = pa.Table.from_batches([outcome_batch(rows)])

    assert outcome_counts(table) == Counter(row.outcome for row in rows)
    block = tuple(table.column(i).to_pylist() for i in range(table.num_columns))
    assert Counter(each_record(block)) == Counter((r.partition, r.offset, r.delivery_count, r.outcome) for r in rows)
    handled = sum(row.latency_ms for row in rows)
    assert abs(sum(table.column("latency_ms").to_pylist()) - handled) <= 1e-9 * max(1.0, handled), "busy time"

    metrics = WorkerMetrics("q")
    metrics.observe(outcome_counts(table), table)
    reference = CollectorRegistry()
    latency = Histogram("queueplane_handler_latency_seconds", "", buckets=LATENCY_BUCKETS, registry=reference)
    deliveries = Histogram("queueplane_delivery_count", "", buckets=DELIVERY_BUCKETS, registry=reference)
    for row in rows:
        latency.observe(row.latency_ms / 1000)
        deliveries.observe(row.delivery_count)
    names = ("queueplane_handler_latency_seconds", "queueplane_delivery_count")
    counted = {
        (name, tuple(pair for pair in labels if pair[0] != "queue")): value
        for (name, labels), value in _samples(metrics.registry, names).items()
    }
    expected = _samples(reference, names)
    assert counted.keys() == expected.keys()
    for sample, value in expected.items():
        if sample[0].endswith("_sum"):
            assert abs(counted[sample] - value) <= 1e-9 * max(1.0, value)
        else:
            assert counted[sample] == value, sample
    inflight = metrics.registry.get_sample_value("queueplane_inflight", {"queue": "q"})
    assert inflight == max(row.inflight for row in rows)


@settings(deadline=None, max_examples=100)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(1, 2), st.integers(1, 2)), min_size=1, max_size=80),
    st.floats(0, 70_000, allow_nan=False),
)
def test_a_polls_runs_are_the_rows_of_its_records_accepted_one_by_one(drawn, latency_ms):
    """The share runtime's quick path builds its runs from the messages; the same runs as from its
    records' outcomes one by one."""
    last: dict[int, int] = {}
    messages = []
    for partition, step, delivery in drawn:
        offset = last[partition] = last.get(partition, 0) + step
        messages.append(Message(topic="q.work", partition=partition, offset=offset, delivery_count=delivery))
    inflight = [i % 5 for i in range(len(messages))]
    rows = [
        _accepted(m.partition(), m.offset(), latency_ms, m.delivery_count(), n)
        for m, n in zip(messages, inflight, strict=True)
    ]
    quick = columns_batch([accepted_columns(messages, latency_ms, inflight)])
    general = columns_batch([columns_of(rows)])
    assert quick.drop_columns(["latency_ms"]).equals(general.drop_columns(["latency_ms"]))
    for fast, slow in zip(
        quick.column("latency_ms").to_pylist(), general.column("latency_ms").to_pylist(), strict=True
    ):
        assert abs(fast - slow) <= 1e-9 * max(1.0, slow)
