"""Spec copies and connections for the Airflow tests."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import yaml
from helpers import EXAMPLES

from queueplane.kafka.target import KafkaTarget


def kafka_connection(kafka: KafkaTarget) -> str:
    """kafka_default as the Apache Kafka provider keeps it: the librdkafka config in the extra JSON."""
    return json.dumps({"conn_type": "kafka", "extra": dict(kafka.settings)})


def tagged_examples(directory: Path, tag: str) -> dict[str, Path]:
    """The example specs under ``directory``/<team>/, with topics and group ids made unique by ``tag``.

    DAG ids stay those of the examples; the Kafka names cannot clash with other tests' on the
    shared broker. Returns the spec files by dag_id.
    """
    out: dict[str, Path] = {}
    for source in sorted(EXAMPLES.glob("*.yaml")):
        doc = yaml.safe_load(source.read_text())
        spec = doc["spec"]
        spec["topic"]["name"] = f"{tag}.{spec['topic']['name']}"
        spec["group"]["id"] = f"{tag}-{spec['group']['id']}"
        for section, key in (("deadLetter", "topic"), ("markers", "topic")):
            if key in spec.get(section, {}):
                spec[section][key] = f"{tag}.{spec[section][key]}"
        output = spec.get("processing", {}).get("output")
        if output:
            output["topic"] = f"{tag}.{output['topic']}"
        meta = doc["metadata"]
        path = directory / meta["team"] / source.name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        out[f"queue__{meta['team']}__{meta['name']}"] = path
    return out


def unique_tag() -> str:
    return f"af{uuid.uuid4().hex[:8]}"
