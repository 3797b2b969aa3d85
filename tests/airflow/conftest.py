"""Airflow for the tests: a private AIRFLOW_HOME with a migrated metadata DB (SQLite).

Airflow reads its configuration when first imported, so the environment is set here, when
pytest collects this folder and before any test module imports airflow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
import yaml
from helpers import EXAMPLES, REPO

from queueplane.connection import KafkaTarget

AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="queueplane-airflow-"))
AIRFLOW_ENV = {
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME / 'airflow.db'}",
}
os.environ.update(AIRFLOW_ENV)


def airflow_bin() -> str:
    return str(Path(sys.executable).with_name("airflow"))


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """The migrated metadata DB of this test session's AIRFLOW_HOME."""
    subprocess.run([airflow_bin(), "db", "migrate"], check=True, capture_output=True, timeout=300)
    return AIRFLOW_HOME


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
