"""A handler's output as the record to produce: the one conversion every runtime makes.

Apart from outcomes.py (rows, Arrow, the producer) so that a share suspect's child process,
which checks its handler's outputs before it hands them back, starts without pyarrow or the
Kafka client: the child's start counts against the call's deadline (queueplane.run.share.executor.isolated).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from queueplane.handler_api import Output, Record

if TYPE_CHECKING:
    from queueplane.run.outcomes import ProducedRecord


def output_record(output: Output, record: Record, default_topic: str | None) -> ProducedRecord:
    """An output as a record to produce: the spec's output topic and the input's key unless it sets them."""
    value, key, headers, topic = output
    to = topic or default_topic
    if to is None:
        raise RuntimeError("the handler returned outputs but the spec names no processing.output.topic")
    if topic is None and key is None and headers is None and type(value) is bytes:
        # The usual output, bytes to the spec's topic under the input's key, has nothing to
        # check or encode: encoded() would cost as much again as the rest of this record's duties.
        return (to, record.key, value, [])
    encoded_key, encoded_value, encoded_headers = output.encoded()
    return (to, encoded_key if key is not None else record.key, encoded_value, encoded_headers)
