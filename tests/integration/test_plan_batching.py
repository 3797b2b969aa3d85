"""Planning costs the same number of round trips for 1 spec as for 40: describes are batched."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from specs_factory import dump, spec

from queueplane.kafka.target import KafkaTarget
from queueplane.provision import steps

pytestmark = pytest.mark.kafka


def _requests_for_plan(kafka: KafkaTarget, directory: Path) -> dict[str, int]:
    """Plan with librdkafka statistics on and return the requests sent, by API name."""
    reports: list[str] = []
    target = KafkaTarget({**kafka.settings, "statistics.interval.ms": 100, "stats_cb": reports.append}, kafka.label)
    planned = steps.plan([str(directory)], target)
    time.sleep(0.25)
    planned.cluster.admin.poll(1.0)
    totals: dict[str, int] = {}
    for broker in json.loads(reports[-1])["brokers"].values():
        for api, count in broker["req"].items():
            totals[api] = totals.get(api, 0) + count
    return totals


def _write_specs(directory: Path, count: int, tag: str) -> None:
    directory.mkdir()
    for i in range(count):
        kind = ("share", "consumer", "kmq")[i % 3]
        doc = spec(kind, name=f"{tag}-{i}", group=f"{tag}-g{i}", topic=f"{tag}.t{i}")
        (directory / f"{i}.yaml").write_text(dump(doc))


def test_describe_requests_do_not_grow_with_the_number_of_specs(kafka, tmp_path):
    _write_specs(tmp_path / "one", 1, "bone")
    _write_specs(tmp_path / "many", 40, "bmany")
    # Applied first, so the plans also read the configs of existing topics and groups.
    for directory in ("one", "many"):
        steps.apply(steps.plan([str(tmp_path / directory)], kafka))
    one = _requests_for_plan(kafka, tmp_path / "one")
    many = _requests_for_plan(kafka, tmp_path / "many")
    assert many["DescribeConfigs"] == one["DescribeConfigs"] == 3  # broker, groups, topics
    # librdkafka adds a metadata refresh of its own now and then; per-topic describes would be 100+.
    assert many["Metadata"] <= 4 and one["Metadata"] <= 4
