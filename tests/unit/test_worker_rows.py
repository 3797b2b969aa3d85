"""What the runtimes hand Spark and the handler: outcome batches, records, the daemon's path."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from queueplane.handler_api import Record
from queueplane.run.executor.handler import MessageRecord
from queueplane.run.outcomes import (
    ACCEPTED,
    OUTCOME_ARROW,
    RELEASED,
    Outcome,
    accepted_columns,
    arrow_column,
    columns_batch,
    columns_of,
    outcome_batch,
)
from queueplane.run.spark.kafka_input import input_records

texts = st.one_of(st.none(), st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12))
outcome_rows = st.builds(
    Outcome,
    topic=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20),
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(0, 2**63 - 1),
    key=texts,
    delivery_count=st.integers(1, 1000),
    outcome=st.sampled_from(["accepted", "released", "dlq", "skipped"]),
    error=texts,
    latency_ms=st.floats(0, 1e9),
    inflight=st.integers(0, 10_000),
)


def _one_record_row(row: Outcome) -> dict:
    """The row a record that is not accepted is handed over as: its own, with its key and error."""
    return {**row._asdict(), "last_offset": row.offset, "records": 1, "latency_buckets": None}


@settings(deadline=None)  # the expected batch's first pa.array call imports pandas
@given(st.lists(outcome_rows, min_size=1, max_size=40))
def test_outcome_batches_hold_the_rows_pyarrow_itself_would_build(rows):
    """Each record not accepted is a row of its own, as it was; the accepted are runs (test_outcome_runs.py)."""
    batch = outcome_batch(rows)
    batch.validate(full=True)
    others = [row for row in rows if row.outcome != ACCEPTED]
    expected = pa.RecordBatch.from_pylist([_one_record_row(row) for row in others], schema=OUTCOME_ARROW)
    assert batch.filter(pc.not_equal(batch.column("outcome"), ACCEPTED)).equals(expected)


@settings(deadline=None)
@given(st.lists(st.lists(outcome_rows, min_size=1, max_size=10), min_size=1, max_size=6))
def test_blocks_of_columns_make_the_batch_of_all_their_rows_in_order(blocks):
    """The share runtime hands over a block of columns per poll; the batch must read as the blocks' rows would."""
    batch = columns_batch([columns_of(rows) for rows in blocks])
    batch.validate(full=True)
    each = pa.Table.from_batches([outcome_batch(rows) for rows in blocks]).combine_chunks()
    assert pa.Table.from_batches([batch]).equals(each)


def test_the_columns_of_an_accepted_poll_are_its_rows_column_by_column():
    """The share runtime's fast path must give the rows the general path would, in schema order."""
    messages = [
        Message(topic="orders", partition=1, offset=5, key=b"k1", value=b"", delivery_count=2),
        Message(topic="orders", partition=0, offset=9, key=None, value=b""),
        Message(topic="orders", partition=1, offset=6, key=b"\xff", value=b"", delivery_count=1),
        Message(topic="orders", partition=1, offset=7, key=b"k3", value=b"", delivery_count=1),
    ]
    inflight = [3, 1, 2, 5]
    rows = [Outcome.of(MessageRecord.of(m), ACCEPTED, None, 7.5, n) for m, n in zip(messages, inflight, strict=True)]
    assert columns_batch([accepted_columns(messages, 7.5, inflight)]).equals(outcome_batch(rows))
    assert rows[1].delivery_count == 1, "no count yet is a first delivery"
    released = Outcome.of(MessageRecord.of(messages[2]), RELEASED, None, 7.5, 2)
    assert released.key == "\ufffd", "undecodable key bytes replaced"


@pytest.mark.parametrize("text", ["accepted", "", "näh", None])
def test_a_column_of_one_repeated_value_is_that_value_in_every_row(text):
    rows = [Outcome("orders", 0, i, text, 1, "released", text, 0.5, 1) for i in range(1000)]
    batch = outcome_batch(rows)
    batch.validate(full=True)
    assert batch.equals(pa.RecordBatch.from_pylist([_one_record_row(row) for row in rows], schema=OUTCOME_ARROW))


@pytest.mark.parametrize(
    "build", [MessageRecord.of, lambda message: MessageRecord.many([Message(offset=1), message, Message(offset=9)])[1]]
)
@pytest.mark.parametrize("delivery_count", [None, 3])
def test_a_message_record_shows_the_handler_what_a_copied_record_would(delivery_count, build):
    message = Message(
        topic="orders",
        partition=2,
        offset=7,
        key=None,
        value=b'{"id": 1}',
        headers=[("trace", b"abc")],
        timestamp=(1, 1700000000123),
        **({} if delivery_count is None else {"delivery_count": delivery_count}),
    )
    lazy = build(message)
    copied = Record.make(None, b'{"id": 1}', (("trace", b"abc"),), "orders", 2, 7, delivery_count or 1, 1700000000123)
    assert isinstance(lazy, Record)
    assert dataclasses.astuple(lazy) == dataclasses.astuple(copied)
    assert lazy.header("trace") == b"abc" and lazy.json() == {"id": 1}
    with pytest.raises(AttributeError):
        lazy.value = b"changed"  # records stay read-only for handlers


def test_a_column_of_missing_values_is_all_nulls():
    column = arrow_column((None, None, None), pa.string())
    assert column.null_count == 3
    assert column.to_pylist() == [None, None, None]


@pytest.mark.parametrize("kind", [pa.int32(), pa.int64(), pa.float64()])
def test_a_missing_number_is_a_null_and_the_others_keep_their_places(kind):
    column = arrow_column([1, None, 3], kind)
    column.validate(full=True)
    assert column.type == kind and column.to_pylist() == [1, None, 3]


def test_building_outcome_batches_does_not_import_pandas():
    """pa.array imports pandas on first use; every Spark Python worker paid for that import."""
    code = (
        "import sys\n"
        "from queueplane.run.outcomes import Outcome, outcome_batch\n"
        "outcome_batch([Outcome('t', 0, 1, None, 1, 'accepted', None, 0.5, 1)])\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_record_made_for_speed_equals_one_made_by_its_constructor():
    fields = (b"k", b"v", (("h", b"1"),), "orders", 3, 42, 2, 1_700_000_000_000)
    fast, plain = Record.make(*fields), Record(*fields)
    assert fast == plain and hash(fast) == hash(plain) and repr(fast) == repr(plain)
    with pytest.raises(AttributeError):
        fast.offset = 1  # type: ignore[misc]


INPUT_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("ts", pa.int64()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)


def test_input_records_keep_headers_where_there_are_some_and_read_delivery_counts_from_them():
    batch = pa.RecordBatch.from_pydict(
        {
            "key": [b"a", None, b"c"],
            "value": [b"1", b"2", None],
            "topic": ["t"] * 3,
            "partition": [0, 0, 0],
            "offset": [10, 11, 12],
            "ts": [5, 6, 7],
            "headers": [[], None, [{"key": "n", "value": b"4"}]],
        },
        schema=INPUT_SCHEMA,
    )
    records = input_records(batch)
    assert [r.headers for r in records] == [(), (), (("n", b"4"),)]
    assert [(r.key, r.value, r.offset, r.delivery_count, r.timestamp) for r in records] == [
        (b"a", b"1", 10, 1, 5),
        (None, b"2", 11, 1, 6),
        (b"c", None, 12, 1, 7),
    ]
    # A slice without headers takes the no-headers path and still lines records up.
    assert [r.offset for r in input_records(batch.slice(0, 2))] == [10, 11]
    counted = input_records(batch, lambda headers: int(headers[0][1]) if headers else 1)
    assert [r.delivery_count for r in counted] == [1, 1, 4]


def test_an_accepted_row_made_the_short_way_is_the_row_made_the_general_way():
    for key in (b"k-1", None, b"\xff\xfe"):
        record = Record(key, b"v", (), "in", 3, 42, 2, 0)
        quick = Outcome.accepted(record, 1.5, 4)
        assert quick == Outcome.of(record, ACCEPTED, None, 1.5, 4) and type(quick) is Outcome
        assert quick.key is None, "an accepted record's row is a run's, which shows no key"
