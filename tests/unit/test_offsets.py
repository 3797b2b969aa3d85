"""ListOffsets asked again while a partition's leader moves (queueplane/kafka/offsets.py)."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from queueplane.kafka.offsets import list_offsets


class _Answer:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class _Admin:
    """Answers ListOffsets with the errors it is given, one per request, then with offset 7."""

    def __init__(self, errors: list[int]) -> None:
        self.errors = list(errors)
        self.requests = 0

    def list_offsets(self, wanted, request_timeout):
        self.requests += 1
        futures = {}
        for tp in wanted:
            future: Future = Future()
            if self.errors:
                future.set_exception(KafkaException(KafkaError(self.errors[0])))
            else:
                future.set_result(_Answer(7))
            futures[tp] = future
        if self.errors:
            self.errors.pop(0)
        return futures


@pytest.mark.parametrize("code", [KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE])
def test_a_moving_leader_is_asked_again(code):
    """The broker's per-partition error comes without librdkafka's retriable flag: a topic just
    created answered NOT_LEADER_FOR_PARTITION and failed a plan under load."""
    admin = _Admin([code, code])
    answers = list_offsets(admin, [TopicPartition("t", 0)], OffsetSpec.latest(), timeout_s=5)
    assert {p: a.offset for p, a in answers.items()} == {0: 7}
    assert admin.requests == 3


def test_a_missing_topic_is_not_asked_again():
    admin = _Admin([KafkaError.UNKNOWN_TOPIC_OR_PART])
    with pytest.raises(KafkaException):
        list_offsets(admin, [TopicPartition("t", 0)], OffsetSpec.latest(), timeout_s=5)
    assert admin.requests == 1


def test_a_leader_that_never_settles_fails_at_the_deadline():
    admin = _Admin([KafkaError.NOT_LEADER_FOR_PARTITION] * 1000)
    with pytest.raises(KafkaException):
        list_offsets(admin, [TopicPartition("t", 0)], OffsetSpec.latest(), timeout_s=1)
    assert 2 <= admin.requests <= 10
