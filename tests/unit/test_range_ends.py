"""Reading a micro-batch's range ends from Spark's offsets log, and which partitions end in markers."""

from __future__ import annotations

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException

from queueplane.run.driver import range_ends
from queueplane.run.driver.range_ends import batch_range_ends, handled_ends, markers_only


def _log(tmp_path, batch_id: int, text: str) -> str:
    (tmp_path / "offsets").mkdir(exist_ok=True)
    (tmp_path / "offsets" / str(batch_id)).write_text(text)
    return str(tmp_path)


def test_the_offsets_log_gives_the_topics_range_ends(tmp_path):
    checkpoint = _log(tmp_path, 7, 'v1\n{"batchWatermarkMs":0,"conf":{}}\n{"q.work":{"1":12505,"0":7501}}')
    assert batch_range_ends(checkpoint, 7, "q.work") == {0: 7501, 1: 12505}
    assert batch_range_ends("file:" + checkpoint, 7, "q.work") == {0: 7501, 1: 12505}
    assert batch_range_ends(checkpoint, 7, "other") == {}
    assert batch_range_ends(checkpoint, 8, "q.work") == {}, "no entry: nothing to move"
    assert batch_range_ends(_log(tmp_path, 9, "v1\n{}\nnot json"), 9, "q.work") == {}


def test_only_partitions_ending_beyond_their_last_record_are_moved():
    # A row may stand for a run of records: partition 0's last record is the run's last, 11.
    table = pa.table({"partition": [0, 0, 1], "offset": [10, 5, 40], "last_offset": [10, 11, 40]})
    assert handled_ends(table) == {0: 12, 1: 41}
    # 0 ends at its last record; 1 has a commit marker after it; 2 held only markers.
    assert markers_only({0: 12, 1: 42, 2: 5}, table) == {1: 42, 2: 5}


@pytest.mark.parametrize("failure", [KafkaException(KafkaError(KafkaError._TRANSPORT)), TimeoutError()])
def test_a_commit_is_retried_with_new_clients_while_kafka_does_not_answer(failure, monkeypatch):
    """A request's future that times out (the broker away) is retried like a refused request, not
    raised into the micro-batch: a kmq worker failed its query that way in the broker outage test."""
    monkeypatch.setattr(range_ends.time, "sleep", lambda _s: None)
    failures, renewed = [failure, failure], []

    def commit():
        if failures:
            raise failures.pop()

    assert range_ends.retry_commit(commit, lambda: renewed.append(1), "offsets")
    assert len(renewed) == 2


def test_a_commit_kafka_never_answers_is_left_to_the_next_batch(monkeypatch):
    monkeypatch.setattr(range_ends.time, "sleep", lambda _s: None)

    def commit():
        raise TimeoutError()

    assert not range_ends.retry_commit(commit, lambda: None, "offsets", within_s=-1)
