"""Valid spec documents for tests, one per group type, to mutate into invalid ones."""

from __future__ import annotations

import copy
from typing import Any

import yaml

BASES: dict[str, dict[str, Any]] = {
    "share": {
        "apiVersion": "queueplane.io/v1",
        "kind": "Queue",
        "metadata": {"name": "brew-orders", "team": "kitchen"},
        "spec": {
            "topic": {"name": "brew.orders.v1", "partitions": 6, "config": {"retention.ms": "604800000"}},
            "group": {
                "type": "share",
                "id": "kitchen-service",
                "lockDuration": "30s",
                "deliveryLimit": 5,
                "maxInFlight": 2000,
            },
            "deadLetter": {"topic": "brew.orders.v1.dlq"},
            "processing": {
                "handler": "kitchen.handlers:prepare",
                "concurrency": 16,
                "output": {"topic": "brew.ready.v1"},
            },
            "autoscaling": {"minExecutors": 1, "maxExecutors": 10, "targetLagSeconds": 30},
            "deployment": {
                "namespace": "kitchen",
                "image": "registry.example.com/qp/worker:0.1.0",
                "executor": {"cores": 2, "memory": "2g"},
            },
        },
    },
    "consumer": {
        "apiVersion": "queueplane.io/v1",
        "kind": "Queue",
        "metadata": {"name": "pay-events", "team": "payments"},
        "spec": {
            "topic": {"name": "pay.events.v1", "partitions": 3},
            "group": {"type": "consumer", "id": "pay-ledger", "ordering": "key", "lockDuration": "10s"},
            "retry": {"backoff": "100ms", "maxBackoff": "5s"},
            "processing": {"handler": "pay.ledger:post", "exactlyOnce": True},
        },
    },
    "kmq": {
        "apiVersion": "queueplane.io/v1",
        "kind": "Queue",
        "metadata": {"name": "mail-jobs", "team": "mail"},
        "spec": {
            "topic": {"name": "mail.jobs.v1", "partitions": 2},
            "group": {"type": "kmq", "id": "mailer", "lockDuration": "1m"},
            "markers": {"retention": "1h"},
            "processing": {"handler": "mail.send:send"},
        },
    },
}


def spec(kind: str = "share", **renames: str) -> dict[str, Any]:
    """A deep copy of a base spec; keyword arguments rename it (name=, group=, topic=) to keep specs apart."""
    doc = copy.deepcopy(BASES[kind])
    if "name" in renames:
        doc["metadata"]["name"] = renames["name"]
    if "group" in renames:
        doc["spec"]["group"]["id"] = renames["group"]
    if "topic" in renames:
        doc["spec"]["topic"]["name"] = renames["topic"]
        doc["spec"].pop("deadLetter", None)
        if "output" in doc["spec"]["processing"]:
            doc["spec"]["processing"]["output"]["topic"] = renames["topic"] + ".out"
    return doc


def set_path(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Set (or with value DELETE, remove) the field at a slash path like spec/group/type."""
    parts = path.strip("/").split("/")
    node = doc
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    if value is DELETE:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = value
    return doc


DELETE = object()


def dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False)
