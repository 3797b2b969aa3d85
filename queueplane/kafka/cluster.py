"""Reading and changing a Kafka cluster through the AdminClient.

Every read is batched: one DescribeTopics for all topics, one DescribeConfigs for all
topic configs, one for all group configs, issued together, so planning 200 specs costs
a handful of round trips rather than hundreds. A queue being removed (its spec gone) is read
apart, by what its owner records name: whether its topics exist and hold records, whether
its group still has members and lag, which group configs are set on it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from confluent_kafka import ConsumerGroupState, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourcePatternType,
    ResourceType,
)

from queueplane.errors import ACL_HINT, ClusterRefused, ClusterUnreachable
from queueplane.kafka import clients
from queueplane.kafka.owners import (
    ACLS_KEY,
    GROUP_KEY,
    Owner,
    group_owners_in,
    owners_in,
    queue_records_in,
    read_records,
    write_records,
)
from queueplane.kafka.refused import Refused
from queueplane.kafka.target import KafkaTarget

log = logging.getLogger("queueplane.cluster")

CONNECT_TIMEOUT_S = 8.0
AUTHORIZER_CONFIG = "authorizer.class.name"
AUTHENTICATION_ERROR = "_AUTHENTICATION"  # librdkafka's name for refused SASL credentials
REQUEST_TIMEOUT_S = 30.0

# Config sources that mean "inherited", not set on the resource itself.
_INHERITED = {
    ConfigSource.DEFAULT_CONFIG.value,
    ConfigSource.STATIC_BROKER_CONFIG.value,
    ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value,
    ConfigSource.DYNAMIC_BROKER_CONFIG.value,
}


# What a group coordinator answers while it loads or moves: asked again, not a failure.
_COORDINATOR_MOVING = ("COORDINATOR_LOAD_IN_PROGRESS", "NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE")

AclKey = tuple[str, str, str, str, bool]  # principal, resource, name, operation, prefixed
_Binding = TypeVar("_Binding", bound=AclBinding)  # an ACL to create, or a filter matching exactly it


@dataclass(frozen=True)
class LiveTopic:
    partitions: int
    replication_factor: int


@dataclass(frozen=True)
class TopicContents:
    """What a topic of a queue being removed holds."""

    records: int  # log-end minus log-start, summed over the partitions
    newest_ms: int | None  # the largest record timestamp (None: empty)


@dataclass(frozen=True)
class GroupActivity:
    """A group of a queue being removed, as the broker knows it."""

    exists: bool  # the broker holds the group (members, committed offsets or share state)
    members: int | None  # None: unknown (a share group on a listener queueplane cannot ask)
    lag: int | None  # records of the queue topic not yet done; None: unknown
    configs: tuple[str, ...] = ()  # GROUP configs set on the group itself


@dataclass(frozen=True)
class LiveConfig:
    """One config value and whether it is set on the resource itself (not inherited)."""

    value: str | None
    explicit: bool


@dataclass
class LiveState:
    """What the cluster holds for the topics and groups a plan is about."""

    cluster_id: str
    broker_ids: list[int]
    broker_configs: dict[str, str]
    topics: dict[str, LiveTopic] = field(default_factory=dict)
    topic_configs: dict[str, dict[str, LiveConfig]] = field(default_factory=dict)
    group_configs: dict[str, dict[str, LiveConfig]] = field(default_factory=dict)
    # GROUP config names the broker reports (its version's names); empty: no group configs at all.
    group_config_names: frozenset[str] = frozenset()
    # The queue each topic queueplane created or adopted belongs to (kafka/owners.py).
    owners: dict[str, Owner] = field(default_factory=dict)
    # The queue each group id apply claimed belongs to.
    group_owners: dict[str, Owner] = field(default_factory=dict)
    # team/name -> the ACLs apply created for that queue, as recorded
    acl_records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # ALLOW ACLs of the principals the specs name: (principal, resource, name, operation, prefixed);
    # None when the cluster has no authorizer (ACLs there would be listed, never enforced)
    acls: set[AclKey] | None = field(default_factory=set)
    # team/name -> the queue's whole record (its ACLs and what removal needs: kafka/owners.py)
    queue_records: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Of the queues being removed (read by read_removals): their topics' contents, by topic; their
    # groups' activity, by group id
    removed_topics: dict[str, TopicContents] = field(default_factory=dict)
    removed_groups: dict[str, GroupActivity] = field(default_factory=dict)


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        err: KafkaError = exc.args[0]
        return f"{err.name()}: {err.str()}"
    return str(exc)


def refusal(exc: BaseException) -> ClusterRefused | None:
    """A request Kafka refused for the credentials in use (authentication, or a missing ACL), as
    one line saying so; None for any other failure."""
    # The error's name, and how each line quotes it: a client's error (librdkafka) or queueplane's own requests'.
    if isinstance(exc, Refused):
        name, request_text, credentials_text = exc.what, str(exc), str(exc)
    elif isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        name, credentials_text = exc.args[0].name(), exc.args[0].str()
        request_text = f"{name} ({credentials_text})"
    else:
        return None
    if name.endswith("AUTHORIZATION_FAILED"):
        return ClusterRefused(
            f"Kafka refused the request: {request_text}; the principal in use lacks an ACL it needs ({ACL_HINT})"
        )
    if name in (AUTHENTICATION_ERROR, "SASL_AUTHENTICATION_FAILED"):
        return ClusterRefused(f"Kafka refused the credentials: {credentials_text}")
    return None


def _is_unknown_topic(exc: BaseException) -> bool:
    return (
        isinstance(exc, KafkaException)
        and bool(exc.args)
        and isinstance(exc.args[0], KafkaError)
        and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    )


def _existing(futures: Mapping[Any, Future[Any]]) -> Iterator[tuple[Any, Any]]:
    """(key, result) of each future, leaving out topics the cluster does not have."""
    for key, future in futures.items():
        try:
            yield key, future.result()
        except KafkaException as exc:
            if not _is_unknown_topic(exc):
                raise


def _configs(entries: dict[str, ConfigEntry], keys: Iterable[str] | None = None) -> dict[str, LiveConfig]:
    """The named configs (all when ``keys`` is None) as LiveConfig values."""
    names = entries.keys() if keys is None else [k for k in keys if k in entries]
    return {name: LiveConfig(entries[name].value, entries[name].source not in _INHERITED) for name in names}


class Cluster:
    """A connected cluster: AdminClient plus the facts every plan needs (brokers, their configs)."""

    def __init__(self, target: KafkaTarget, connect_timeout: float = CONNECT_TIMEOUT_S):
        self.target = target
        settings: dict[str, Any] = dict(target.settings)
        settings.setdefault("socket.connection.setup.timeout.ms", int(connect_timeout * 1000))
        try:
            self.admin = clients.admin(settings)
        except KafkaException as exc:
            from queueplane.errors import UsageError

            raise UsageError(f"invalid Kafka client settings for {target.label}: {_error_text(exc)}") from None
        described = self._describe_cluster(connect_timeout)
        self.cluster_id: str = described.cluster_id or ""
        self.broker_ids: list[int] = sorted(node.id for node in described.nodes)
        self._broker_configs: dict[str, str] | None = None

    def _describe_cluster(self, timeout: float) -> Any:
        """DescribeCluster, watching the client's errors meanwhile: refused credentials are reported
        at once (librdkafka retries them quietly until the request times out)."""
        refused_before, _ = clients.ERRORS.latest(AUTHENTICATION_ERROR)
        future = self.admin.describe_cluster(request_timeout=timeout)
        deadline = time.monotonic() + timeout + 1
        while True:
            try:
                return future.result(timeout=0.25)
            except FutureTimeout:
                pass
            except Exception as exc:
                raise ClusterUnreachable(
                    f"cannot reach Kafka at {self.target.label} within {timeout:.0f}s "
                    f"({_error_text(exc)}); nothing was changed"
                ) from None
            self.admin.poll(0)  # serves error_cb
            refused, text = clients.ERRORS.latest(AUTHENTICATION_ERROR)
            if refused > refused_before:
                raise ClusterRefused(
                    f"Kafka at {self.target.label} refused the credentials ({text}); check sasl.username, "
                    "sasl.password and sasl.mechanism (or the client certificate); nothing was changed"
                )
            if time.monotonic() > deadline:
                raise ClusterUnreachable(
                    f"cannot reach Kafka at {self.target.label} within {timeout:.0f}s; nothing was changed"
                )

    @classmethod
    def when_reachable(cls, target: KafkaTarget, wait_s: float) -> Cluster:
        """The connected cluster, trying again for up to ``wait_s``: a worker may start before its
        broker (a pod scheduled first, a broker restarting) and should carry on once it answers."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return cls(target)
            except ClusterUnreachable as exc:
                if time.monotonic() >= deadline:
                    if wait_s <= 0:
                        raise
                    raise ClusterUnreachable(
                        f"cannot reach Kafka at {target.label}: no answer in {wait_s:.0f}s of trying; "
                        "nothing was changed"
                    ) from None
                log.warning("%s; trying again for %.0fs more", exc, deadline - time.monotonic())
                time.sleep(2)

    def broker_configs(self) -> dict[str, str]:
        """Configs of one broker (the bounds of share-group settings live here)."""
        if self._broker_configs is None:
            resource = ConfigResource(ResourceType.BROKER, str(self.broker_ids[0]))
            entries = self.admin.describe_configs([resource], request_timeout=REQUEST_TIMEOUT_S)[resource].result()
            self._broker_configs = {name: e.value for name, e in entries.items() if e.value is not None}
        return self._broker_configs

    def read_state(
        self,
        topics: Iterable[str],
        groups: Iterable[str],
        configured: Mapping[str, Iterable[str]] | None = None,
        principals: Iterable[str] = (),
        acl_queues: Iterable[str] = (),
    ) -> LiveState:
        """Describe the named topics and groups, all requests in flight at once.

        ``configured`` maps the topics whose configs a spec manages to those config names;
        only these are read (other topics' configs are not queueplane's business).
        """
        configured = configured or {}
        topic_names = sorted(set(topics))
        config_names = sorted(configured)
        group_ids = sorted(set(groups))
        described: dict[str, Future[Any]] = {}
        topic_config_futures: dict[ConfigResource, Future[Any]] = {}
        if topic_names:
            # Both requests at once: a topic that does not exist simply answers UNKNOWN_TOPIC.
            described = self.admin.describe_topics(TopicCollection(topic_names), request_timeout=REQUEST_TIMEOUT_S)
        if config_names:
            topic_config_futures = self.admin.describe_configs(
                [ConfigResource(ResourceType.TOPIC, t) for t in config_names], request_timeout=REQUEST_TIMEOUT_S
            )
        group_resources = [ConfigResource(ResourceType.GROUP, g) for g in group_ids]
        # A made-up group tells which GROUP config names this broker version knows.
        probe = ConfigResource(ResourceType.GROUP, "queueplane.probe.group-config-names")
        group_futures = self.admin.describe_configs([*group_resources, probe], request_timeout=REQUEST_TIMEOUT_S)
        state = LiveState(self.cluster_id, self.broker_ids, self.broker_configs())
        for name, description in _existing(described):
            partitions = description.partitions
            state.topics[name] = LiveTopic(len(partitions), len(partitions[0].replicas) if partitions else 0)
        for resource, entries in _existing(topic_config_futures):
            if resource.name in state.topics:
                state.topic_configs[resource.name] = _configs(entries, configured[resource.name])
        for resource, future in group_futures.items():
            try:
                entries = future.result()
            except KafkaException:
                # Brokers before KIP-848 have no GROUP config resource at all.
                continue
            if resource == probe:
                state.group_config_names = frozenset(entries)
            else:
                state.group_configs[resource.name] = _configs(entries)
        # Always: the records also say which queues are gone from the specs (removal).
        records = read_records(self.target)
        state.owners = owners_in(records)
        state.group_owners = group_owners_in(records)
        state.queue_records = queue_records_in(records)
        state.acl_records = {queue: value.get("acls", []) for queue, value in state.queue_records.items()}
        # The ACLs of the principals the specs name, and of those apply once granted these queues.
        named = set(principals) | {a["principal"] for q in acl_queues for a in state.acl_records.get(q, [])}
        if named:
            state.acls = self.describe_acls(named) if self.has_authorizer() else None
        return state

    def read_removals(
        self,
        state: LiveState,
        topics: Iterable[str],
        groups: Mapping[str, tuple[str | None, str | None]],
        principals: Iterable[str] = (),
    ) -> None:
        """Into ``state``: the contents of ``topics`` that exist; for ``groups`` (group id -> (group
        type or None when unknown, the queue topic or None)) their members, lag and own configs;
        and the ALLOW ACLs of ``principals`` (those the removed queues' records name)."""
        names = sorted(set(topics))
        if names:
            described = self.admin.describe_topics(TopicCollection(names), request_timeout=REQUEST_TIMEOUT_S)
            partitions = {name: len(d.partitions) for name, d in _existing(described)}
            for name, count in partitions.items():
                state.removed_topics[name] = self._contents(name, count)
        unread = set(principals) - {key[0] for key in state.acls or ()}
        if unread and state.acls is not None:
            if self.has_authorizer():
                state.acls = state.acls | (self.describe_acls(unread) or set())
            else:
                state.acls = None
        if not groups:
            return
        resources = [ConfigResource(ResourceType.GROUP, g) for g in sorted(groups)]
        configs: dict[str, tuple[str, ...]] = {}
        for resource, future in self.admin.describe_configs(resources, request_timeout=REQUEST_TIMEOUT_S).items():
            try:
                entries = future.result()
            except KafkaException:
                continue  # brokers before KIP-848 have no GROUP configs
            configs[resource.name] = tuple(sorted(n for n, e in entries.items() if e.source not in _INHERITED))
        for group, (kind, topic) in sorted(groups.items()):
            if kind is None:  # a record from before group types were recorded: share configs tell
                kind = "share" if any(c.startswith("share.") for c in configs.get(group, ())) else "consumer"
            activity = self._share_activity(group, topic) if kind == "share" else self._group_activity(group, topic)
            state.removed_groups[group] = GroupActivity(
                activity.exists, activity.members, activity.lag, configs.get(group, ())
            )

    def _contents(self, topic: str, partitions: int) -> TopicContents:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        specs = {"start": OffsetSpec.earliest(), "end": OffsetSpec.latest(), "newest": OffsetSpec.max_timestamp()}
        from queueplane.kafka.offsets import list_offsets

        read = {key: list_offsets(self.admin, tps, spec) for key, spec in specs.items()}
        records = sum(max(0, read["end"][p].offset - read["start"][p].offset) for p in range(partitions))
        stamps = [read["newest"][p].timestamp for p in range(partitions) if read["newest"][p].offset >= 0]
        return TopicContents(records, max(stamps) if stamps and records else None)

    def _group_activity(self, group: str, topic: str | None) -> GroupActivity:
        """A consumer (or kmq) group: members, and the records of ``topic`` past its committed offsets
        (all of a partition it never committed)."""
        from queueplane.kafka.offsets import committed_offsets

        description = self.admin.describe_consumer_groups([group], request_timeout=REQUEST_TIMEOUT_S)[group].result()
        members = len(description.members or [])
        exists = description.state != ConsumerGroupState.DEAD
        if topic is None:
            return GroupActivity(exists, members, None)
        partitions = self._topic_partitions([topic]).get(topic)
        lag = 0
        if partitions:
            committed = committed_offsets(self.target, group, topic, partitions) if exists else {}
            for p, (start, end) in self._offsets(topic, partitions).items():
                done = committed.get(p)
                lag += max(0, end - max(done if done is not None else start, start))
        return GroupActivity(exists, members, lag)

    def _share_activity(self, group: str, topic: str | None) -> GroupActivity:
        """A share group: members and the broker's share-partition lag; unknown where queueplane's
        own requests cannot reach the cluster."""
        from queueplane.kafka.protocol import describe_share_group, share_partition_offsets

        if not self.target.speaks_share_requests():
            return GroupActivity(True, None, None)
        try:
            described = describe_share_group(self.target.settings, group, topic or "")
        except (OSError, ValueError):
            return GroupActivity(True, None, None)
        exists = described.state != "Dead"
        if topic is None:
            return GroupActivity(exists, len(described.members), None)
        partitions = self._topic_partitions([topic]).get(topic)
        if not partitions:
            return GroupActivity(exists, len(described.members), 0)
        contents = self._offsets(topic, partitions)
        try:
            states = share_partition_offsets(self.target.settings, group, topic, sorted(contents))
        except (OSError, ValueError):
            return GroupActivity(exists, len(described.members), None)
        lag: int | None = 0
        for p, (start, end) in contents.items():
            state_start, partition_lag = states.get(p, (None, None))
            if state_start is None:
                partition_lag = end - start  # never fetched: everything retained is still to do
            if partition_lag is None or lag is None:
                lag = None
            else:
                lag += partition_lag
        return GroupActivity(exists, len(described.members), lag)

    def _topic_partitions(self, topics: list[str]) -> dict[str, int]:
        described = self.admin.describe_topics(TopicCollection(topics), request_timeout=REQUEST_TIMEOUT_S)
        return {name: len(d.partitions) for name, d in _existing(described)}

    def _offsets(self, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
        from queueplane.kafka.offsets import log_offsets

        return log_offsets(self.admin, topic, partitions)

    def has_authorizer(self) -> bool:
        """Whether the brokers enforce ACLs: without an authorizer they keep and list ACLs
        (DescribeAcls answers an empty list) but never check them."""
        return bool(self.broker_configs().get(AUTHORIZER_CONFIG))

    def describe_acls(self, principals: Iterable[str]) -> set[AclKey] | None:
        """The ALLOW ACLs of ``principals``; None when the cluster has no authorizer."""
        found: set[AclKey] = set()
        futures = []  # all in flight at once
        for principal in sorted(set(principals)) or ["User:ANONYMOUS"]:
            futures.append(self.admin.describe_acls(_allows_of(principal), request_timeout=REQUEST_TIMEOUT_S))
        for future in futures:
            try:
                bindings = future.result()
            except KafkaException as exc:
                if exc.args and exc.args[0].code() == KafkaError.SECURITY_DISABLED:
                    return None
                raise
            for b in bindings:
                resource = "CLUSTER" if b.restype == ResourceType.BROKER else b.restype.name
                prefixed = b.resource_pattern_type == ResourcePatternType.PREFIXED
                found.add((b.principal, resource, b.name, b.operation.name, prefixed))
        return found

    # -- changes -------------------------------------------------------------------------------
    # Each returns {resource name: error text or None}, so apply can say exactly what happened.

    def create_topics(self, topics: list[NewTopic], validate_only: bool) -> dict[str, str | None]:
        if not topics:
            return {}
        futures = self.admin.create_topics(
            topics, validate_only=validate_only, operation_timeout=REQUEST_TIMEOUT_S, request_timeout=REQUEST_TIMEOUT_S
        )
        return _outcomes(futures)

    def record_owners(self, owners: dict[str, Owner]) -> dict[str, str | None]:
        """Record which queue owns each topic, before apply creates or changes it."""
        return write_records(self.target, {topic: asdict(owner) for topic, owner in owners.items()})

    def record_group_owners(self, owners: dict[str, Owner]) -> dict[str, str | None]:
        """Record which queue owns each group id; per group, the error or None."""
        written = write_records(self.target, {GROUP_KEY + group: asdict(owner) for group, owner in owners.items()})
        return {key.removeprefix(GROUP_KEY): error for key, error in written.items()}

    def record_acls(
        self, acls: dict[str, list[dict[str, Any]]], queue_fields: Mapping[str, Mapping[str, Any]] | None = None
    ) -> dict[str, str | None]:
        """Record the ACLs apply made for each queue (team/name), beside the rest of the queue's
        record (``queue_fields``: kafka/owners.QUEUE_RECORD_FIELDS); per queue, the error or None."""
        queue_fields = queue_fields or {}
        written = write_records(
            self.target,
            {ACLS_KEY + queue: {**queue_fields.get(queue, {}), "acls": made} for queue, made in acls.items()},
        )
        return {key.removeprefix(ACLS_KEY): error for key, error in written.items()}

    def forget(self, keys: Iterable[str]) -> dict[str, str | None]:
        """Delete owner records (topic names, ``group:<id>``, ``acls:<team>/<name>``); per key, the error or None."""
        return write_records(self.target, dict.fromkeys(keys))

    def delete_topics(self, topics: list[str]) -> dict[str, str | None]:
        """Delete topics; a topic already gone counts as deleted."""
        if not topics:
            return {}
        futures = self.admin.delete_topics(
            topics, operation_timeout=REQUEST_TIMEOUT_S, request_timeout=REQUEST_TIMEOUT_S
        )
        return {
            name: None if error and "UNKNOWN_TOPIC" in error else error for name, error in _outcomes(futures).items()
        }

    def delete_groups(self, groups: list[str], wait_s: float = 0.0) -> dict[str, str | None]:
        """Delete groups with their committed offsets or share-partition state (DeleteGroups, which
        the broker runs for every group type); a group already gone counts as deleted.

        The broker refuses a group that still has members (NON_EMPTY_GROUP): for up to ``wait_s``
        it is asked again, while a stopped worker's members leave (their session ends). A
        coordinator still loading the group is asked again in any case.
        """
        outcomes: dict[str, str | None] = {}
        pending = sorted(set(groups))
        deadline = time.monotonic() + max(wait_s, REQUEST_TIMEOUT_S)
        members_deadline = time.monotonic() + wait_s
        while pending:
            futures = self.admin.delete_consumer_groups(pending, request_timeout=REQUEST_TIMEOUT_S)
            again = []
            for group, error in _outcomes(futures).items():
                if error and "GROUP_ID_NOT_FOUND" in error:
                    error = None
                transient = error is not None and any(name in error for name in _COORDINATOR_MOVING)
                waiting = error is not None and "NON_EMPTY_GROUP" in error and time.monotonic() < members_deadline
                if (transient or waiting) and time.monotonic() < deadline:
                    again.append(group)
                outcomes[group] = error
            pending = again
            if pending:
                time.sleep(1.0)
        return outcomes

    def delete_group_configs(
        self, configs: Mapping[str, Iterable[str]], validate_only: bool = False
    ) -> dict[str, str | None]:
        """IncrementalAlterConfigs DELETE of the named GROUP configs: a group's configs outlive the
        group itself, and would apply to a later group of the same id."""
        resources = [
            ConfigResource(
                ResourceType.GROUP,
                group,
                incremental_configs=[
                    ConfigEntry(key, None, incremental_operation=AlterConfigOpType.DELETE) for key in sorted(keys)
                ],
            )
            for group, keys in sorted(configs.items())
            if keys
        ]
        if not resources:
            return {}
        futures = self.admin.incremental_alter_configs(
            resources, validate_only=validate_only, request_timeout=REQUEST_TIMEOUT_S
        )
        return {resource.name: outcome for resource, outcome in _outcomes(futures).items()}

    def change_acls(self, create: list[AclKey], delete: list[AclKey]) -> dict[AclKey, str | None]:
        """Create and delete ALLOW ACLs; per ACL, the error or None."""
        outcomes: dict[AclKey, str | None] = {}
        if create:
            bindings = {_binding(k, AclBinding): k for k in create}
            made = self.admin.create_acls(list(bindings), request_timeout=REQUEST_TIMEOUT_S)
            outcomes.update({bindings[b]: outcome for b, outcome in _outcomes(made).items()})
        if delete:
            filters = {_binding(k, AclBindingFilter): k for k in delete}
            deleted = self.admin.delete_acls(list(filters), request_timeout=REQUEST_TIMEOUT_S)
            outcomes.update({filters[f]: outcome for f, outcome in _outcomes(deleted).items()})
        return outcomes

    def create_partitions(self, increases: list[NewPartitions], validate_only: bool) -> dict[str, str | None]:
        if not increases:
            return {}
        futures = self.admin.create_partitions(
            increases,
            validate_only=validate_only,
            operation_timeout=REQUEST_TIMEOUT_S,
            request_timeout=REQUEST_TIMEOUT_S,
        )
        return _outcomes(futures)

    def set_configs(
        self, kind: ResourceType, configs: dict[str, dict[str, str]], validate_only: bool
    ) -> dict[str, str | None]:
        """IncrementalAlterConfigs SET of only the named keys: configs queueplane does not manage stay."""
        if not configs:
            return {}
        resources = [
            ConfigResource(
                kind,
                name,
                incremental_configs=[
                    ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
                    for key, value in sorted(values.items())
                ],
            )
            for name, values in sorted(configs.items())
        ]
        futures = self.admin.incremental_alter_configs(
            resources, validate_only=validate_only, request_timeout=REQUEST_TIMEOUT_S
        )
        return {resource.name: outcome for resource, outcome in _outcomes(futures).items()}


def _allows_of(principal: str) -> AclBindingFilter:
    """A filter matching every ALLOW ACL of ``principal``, on any resource from any host.

    None is AclBindingFilter's wildcard for the resource name and the host, as confluent-kafka
    documents the class, though its annotations type both as ``str``: hence the two ignores.
    """
    return AclBindingFilter(
        ResourceType.ANY,
        None,  # type: ignore[arg-type]
        ResourcePatternType.ANY,
        principal,
        None,  # type: ignore[arg-type]
        AclOperation.ANY,
        AclPermissionType.ALLOW,
    )


def _binding(key: AclKey, kind: type[_Binding]) -> _Binding:
    """The ALLOW binding from any host for ``key``; ``kind`` AclBindingFilter matches exactly it."""
    principal, resource, name, operation, prefixed = key
    return kind(
        ResourceType.BROKER if resource == "CLUSTER" else ResourceType[resource],
        name,
        ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL,
        principal,
        "*",
        AclOperation[operation],
        AclPermissionType.ALLOW,
    )


def _outcomes(futures: dict[Any, Future[Any]]) -> dict[Any, str | None]:
    outcomes: dict[Any, str | None] = {}
    for key, future in futures.items():
        try:
            future.result()
            outcomes[key] = None
        except Exception as exc:
            outcomes[key] = _error_text(exc)
    return outcomes
