"""Which queue owns which topic and group: a small compacted topic on the cluster itself.

Kafka topics carry no labels, yet plan must tell a topic queueplane created for a queue from
one that was there before (another application's, or another queue's). Apply records each
topic it creates, or that a spec adopts, as one record keyed by the topic's name, before it
creates or changes anything; plan reads them back. Group ids are claimed the same way (a
group belongs to one queue: two queues in one group steal each other's records, and another
team's worker in it reads that team's data), and so are the ACLs apply creates for a queue
(provision/acls.py). The record lives on the cluster, not in
a file, so every checkout, CI runner and Airflow worker sees the same owners.

A removed spec leaves nothing in git to say what it made, so these records are also what
removal works from: plan finds a queue whose records name a spec under the planned paths
that no spec there declares any more, and removes what the records say it made. The
queue's record (key ``acls:<team>/<name>``, the key its ACL record always had, so readers
that know only the ACLs still read it) also holds what removal needs once the spec is gone:
the spec's place, its ``deletionPolicy``, its group type and its worker's release (and, while
part of a removal waits for the queue to drain, that the release is already uninstalled). A
spec file's place is kept twice: its absolute path, and its path inside its git repository, so
a plan from another checkout, working directory or CI runner recognises it. That path is the
same in every clone of one repository, so the queues of one cluster come from one spec
repository (the platform's): another repository applying to the cluster with the same layout
would see this one's queues as its own removed specs.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from queueplane.kafka import clients
from queueplane.kafka.consumed import offset_of
from queueplane.kafka.names import CLEANUP_POLICY
from queueplane.kafka.target import KafkaTarget

# Kafka's internal-topic rule (names.is_internal_topic) keeps every spec away from it.
OWNERS_TOPIC = "_queueplane-owners"
ACLS_KEY = "acls:"  # + team/name: the ACLs apply created for that queue
GROUP_KEY = "group:"  # + group id: the queue that group belongs to
READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Owner:
    """The queue a topic belongs to: ``team/name``, and the spec that claimed it."""

    queue: str
    spec: str
    role: str

    @classmethod
    def from_record(cls, value: dict[str, Any]) -> Owner:
        """An owner record as written by this or a later version (fields it does not know are left out)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in value.items() if k in known})


# What a queue's record holds beside its ACLs (written by apply, read by removal).
QUEUE_RECORD_FIELDS = (
    "spec",
    "specKey",
    "deletionPolicy",
    "groupType",
    "application",
    "namespace",
    "target",
    "released",
)


@dataclass(frozen=True)
class QueueRecord:
    """What removal needs of a queue once its spec is gone; a record written before queueplane
    kept these reads as the spec's defaults (retain, the queue's own release in its team's namespace)."""

    queue: str  # team/name
    spec: str = ""  # absolute path of the spec file when applied ("" when never recorded)
    spec_key: str | None = None  # its path inside its git repository
    deletion_policy: str = "retain"
    group_type: str | None = None
    application: str = ""
    namespace: str = ""
    target: str = "kubernetes"
    released: bool = False  # a removal that waits uninstalled the release already
    recorded: bool = False  # whether the record holds these fields (else they are the defaults)

    @classmethod
    def from_record(cls, queue: str, value: dict[str, Any] | None) -> QueueRecord:
        team, _, name = queue.partition("/")
        value = value or {}
        return cls(
            queue,
            str(value.get("spec") or ""),
            value.get("specKey"),
            str(value.get("deletionPolicy") or "retain"),
            value.get("groupType"),
            str(value.get("application") or name),
            str(value.get("namespace") or team),
            str(value.get("target") or "kubernetes"),
            bool(value.get("released")),
            "deletionPolicy" in value,
        )

    def fields(self) -> dict[str, Any]:
        """The record's fields beside ``acls``."""
        return {
            "spec": self.spec,
            "specKey": self.spec_key,
            "deletionPolicy": self.deletion_policy,
            "groupType": self.group_type,
            "application": self.application,
            "namespace": self.namespace,
            "target": self.target,
            "released": self.released,
        }


def _repository_root(path: Path) -> Path | None:
    for candidate in (path, *path.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


def spec_key(spec: str) -> str | None:
    """The spec file's path inside its git repository (None outside one): the same in every checkout."""
    path = Path(spec).resolve()
    root = _repository_root(path.parent)
    return path.relative_to(root).as_posix() if root is not None else None


def _inside(path: Path, scope: Path) -> bool:
    return path == scope or scope in path.parents


def recorded_under(spec: str, key: str | None, paths: Iterable[str]) -> bool:
    """Whether a recorded spec (its path as recorded, and its path inside its repository) lies under
    one of ``paths`` (files or folders, relative or absolute).

    The recorded path counts as it is (a relative one, written by an older version, from the
    working directory); the repository path counts under the repository of each planned path,
    and under a planned folder without a repository (the Airflow DAG processor's copy of the
    specs folder) named like the first folder of the key.
    """
    for raw in paths:
        scope = Path(raw).resolve()
        if spec and _inside(Path(os.path.abspath(spec)).resolve(), scope):
            return True
        if not key:
            continue
        root = _repository_root(scope if scope.is_dir() else scope.parent)
        if root is not None:
            if _inside((root / key).resolve(), scope):
                return True
        else:
            # No repository here: the copy of a folder of one (its first part named like the folder).
            first, _, rest = key.partition("/")
            if rest and scope.is_dir() and first == scope.name and _inside((scope / rest).resolve(), scope):
                return True
    return False


def _unknown_topic(exc: KafkaException) -> bool:
    code = exc.args[0].code() if exc.args and isinstance(exc.args[0], KafkaError) else None
    return code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION)


def read_records(target: KafkaTarget) -> dict[str, dict[str, Any]]:
    """Every record, the latest per key (none when nothing was ever recorded).

    Keys are topic names (an Owner each), ``group:<group id>`` (an Owner each) and
    ``acls:<team>/<name>`` (the ACLs apply made for a queue); a topic name cannot contain ':',
    so they never meet.
    """
    consumer = clients.consumer(
        target, {"group.id": "queueplane-owners-reader", "enable.auto.commit": False, "enable.partition.eof": True}
    )
    try:
        partition = TopicPartition(OWNERS_TOPIC, 0)
        try:
            low, high = consumer.get_watermark_offsets(partition, timeout=READ_TIMEOUT_S)
        except KafkaException as exc:
            if _unknown_topic(exc):
                return {}
            raise
        records: dict[str, dict[str, Any]] = {}
        if high <= low:
            return records
        consumer.assign([TopicPartition(OWNERS_TOPIC, 0, low)])
        deadline = time.monotonic() + READ_TIMEOUT_S
        position = low
        while position < high:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {OWNERS_TOPIC} took over {READ_TIMEOUT_S:.0f}s (at {position} of {high})")
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    break
                raise KafkaException(error)
            position = offset_of(message) + 1
            key = (message.key() or b"").decode()
            value = message.value()
            if value is None:
                records.pop(key, None)
            else:
                records[key] = json.loads(value)
        return records
    finally:
        consumer.close()


def owners_in(records: dict[str, dict[str, Any]]) -> dict[str, Owner]:
    """The topic owners among the records."""
    return {
        key: Owner.from_record(value) for key, value in records.items() if not key.startswith((ACLS_KEY, GROUP_KEY))
    }


def group_owners_in(records: dict[str, dict[str, Any]]) -> dict[str, Owner]:
    """The group owners among the records, by group id."""
    return {
        key.removeprefix(GROUP_KEY): Owner.from_record(value)
        for key, value in records.items()
        if key.startswith(GROUP_KEY)
    }


def queue_records_in(records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each queue's record (its ACLs and, once written by this version, QUEUE_RECORD_FIELDS), by team/name."""
    return {key.removeprefix(ACLS_KEY): value for key, value in records.items() if key.startswith(ACLS_KEY)}


def write_records(target: KafkaTarget, records: dict[str, dict[str, Any] | None]) -> dict[str, str | None]:
    """Write one record per key (creating the topic on first use); None deletes the key (a tombstone,
    which compaction keeps until every reader saw it). Per key, the error text or None. Acknowledged
    by every in-sync replica before it returns."""
    if not records:
        return {}
    admin = clients.admin(target)
    created = admin.create_topics(
        [NewTopic(OWNERS_TOPIC, 1, -1, config={CLEANUP_POLICY: "compact"})],  # -1: the cluster's default
        request_timeout=READ_TIMEOUT_S,
    )[OWNERS_TOPIC]
    try:
        created.result()
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            return {key: f"cannot create {OWNERS_TOPIC}: {exc.args[0].str()}" for key in records}
    producer = clients.producer(target, {"acks": "all", "enable.idempotence": True})
    outcome: dict[str, str | None] = {}

    def delivered(err: KafkaError | None, message: Any) -> None:
        outcome[(message.key() or b"").decode()] = None if err is None else f"{err.name()}: {err.str()}"

    for key, value in sorted(records.items()):
        encoded = None if value is None else json.dumps(value).encode()
        producer.produce(OWNERS_TOPIC, key=key.encode(), value=encoded, on_delivery=delivered)
    producer.flush(READ_TIMEOUT_S)
    return {key: outcome.get(key, "not acknowledged in time") for key in records}
