"""The share source's offsets name the query, so a task's retry is told from a task of another query
(queueplane.run.share.executor.outbox)."""

from __future__ import annotations

from queueplane.run.share.source import ShareStreamReader


def _reader() -> ShareStreamReader:
    return ShareStreamReader("{}", tasks=2, drain_file="")


def test_a_batchs_tasks_carry_its_number_and_its_querys_name():
    reader = _reader()
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    tasks = reader.partitions(start, end)
    assert [(t.stream, t.batch, t.index) for t in tasks] == [(end["stream"], 1, 0), (end["stream"], 1, 1)]
    later = reader.latestOffset(end, None)
    assert (later["stream"], later["batch"]) == (end["stream"], 2)


def test_a_query_restarted_from_its_checkpoint_keeps_its_name_and_a_new_query_has_another():
    first = _reader()
    logged = first.latestOffset(first.initialOffset(), None)  # the offsets log keeps it
    restarted = _reader()  # a new reader, started from the checkpointed offsets
    assert restarted.latestOffset(logged, None)["stream"] == logged["stream"]
    assert restarted.partitions(logged, logged)[0].stream == logged["stream"], "a batch run again after a restart"
    fresh = _reader()
    assert fresh.latestOffset(fresh.initialOffset(), None)["stream"] != logged["stream"]


def test_offsets_checkpointed_before_the_query_had_a_name_get_one():
    reader = _reader()
    end = reader.latestOffset({"batch": 41}, None)
    assert end["batch"] == 42 and end["stream"]
