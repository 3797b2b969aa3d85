"""A consumed record's place and headers, read where confluent-kafka's types allow None."""

from __future__ import annotations

import pytest
from confluent_kafka import Message

from queueplane.kafka.consumed import NotARecord, headers_of, offset_of, partition_of, topic_of


def test_a_consumed_records_place_and_headers_come_back_as_the_client_gave_them():
    record = Message(topic="brew.orders.v1", partition=3, offset=41, headers=[("trace", b"1"), ("empty", None)])
    assert (topic_of(record), partition_of(record), offset_of(record)) == ("brew.orders.v1", 3, 41)
    assert headers_of(record) == [("trace", b"1"), ("empty", None)]
    assert headers_of(Message(topic="t", partition=0, offset=0)) == []  # none at all


@pytest.mark.parametrize(
    ("read", "missing"),
    [(topic_of, "a topic"), (partition_of, "a partition"), (offset_of, "an offset")],
)
def test_a_message_without_a_place_is_refused_rather_than_read_as_none(read, missing):
    with pytest.raises(NotARecord, match=f"a message without {missing} "):
        read(Message())


def test_headers_in_produces_dict_form_are_refused_rather_than_read_as_names():
    with pytest.raises(NotARecord, match="headers as a dict"):
        headers_of(Message(topic="t", partition=0, offset=0, headers={"trace": b"1"}))
