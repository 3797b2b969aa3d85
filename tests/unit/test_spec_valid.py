"""The schema is complete and strict, the examples pass, and defaults come from the schema."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import EXAMPLES
from specs_factory import dump, spec

from queueplane.spec import durations
from queueplane.spec.rules import check_text, load_specs
from queueplane.spec.schema import load_schema, resolve


def _objects(node: dict[str, Any], path: str = "#") -> list[tuple[str, dict[str, Any]]]:
    node = resolve(node)
    found = [(path, node)]
    for key, child in node.get("properties", {}).items():
        found += _objects(child, f"{path}/{key}")
    return found


def test_every_field_is_described_and_every_object_is_closed():
    for path, node in _objects(load_schema()):
        assert node.get("description"), f"{path} has no description"
        if "properties" in node:
            assert node.get("additionalProperties") is False, f"{path} accepts unknown keys"


def test_examples_cover_every_group_type_and_are_valid():
    loaded = load_specs([str(EXAMPLES)])
    assert loaded.problems == []
    assert sorted(q.group.type for q in loaded.queues) == ["consumer", "kmq", "share"]


def test_defaults_come_from_the_schema():
    doc = spec("kmq")
    (queue,) = check_text(dump(doc)).raise_if_invalid()
    group_schema = load_schema()["properties"]["spec"]["properties"]["group"]["properties"]
    assert queue.group.delivery_limit == group_schema["deliveryLimit"]["default"]
    assert queue.group.max_in_flight == group_schema["maxInFlight"]["default"]
    assert queue.group.ordering == "none"
    assert queue.dead_letter.name == "mail.jobs.v1.dlq"
    assert queue.dead_letter.partitions == 2
    assert queue.markers is not None and queue.markers.name == "mail.jobs.v1.markers"
    assert queue.markers.partitions == 2
    assert queue.markers.config["retention.ms"] == str(3_600_000)
    assert queue.namespace == "mail"
    assert queue.retry_backoff_ms == 1000 and queue.retry_max_backoff_ms == 60_000


def test_config_values_are_sent_in_kafka_spelling():
    doc = spec("share")
    doc["spec"]["topic"]["config"] = {"retention.ms": 86400000, "preallocate": True}
    (queue,) = check_text(dump(doc)).raise_if_invalid()
    assert queue.topic.config == {"retention.ms": "86400000", "preallocate": "true"}


@pytest.mark.parametrize(
    ("text", "ms"),
    [("500ms", 500), ("30s", 30_000), ("5m", 300_000), ("1h", 3_600_000), ("1h30m", 5_400_000), ("2d", 172_800_000)],
)
def test_durations_parse(text, ms):
    assert durations.parse_ms(text) == ms
    assert durations.parse_ms(durations.format_ms(ms)) == ms


@pytest.mark.parametrize("text", ["", "30", "30 s", "1.5s", "-1s", "s", "1w", "30sec"])
def test_durations_reject(text):
    assert not durations.is_duration(text)
    with pytest.raises(ValueError, match="not a duration"):
        durations.parse_ms(text)


def test_duration_pattern_is_the_schemas():
    assert durations.is_duration("1h30m")
    schema_pattern = load_schema()["$defs"]["duration"]["pattern"]
    assert durations._pattern().pattern == schema_pattern
