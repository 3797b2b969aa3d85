"""Reading and changing a Kafka cluster through the AdminClient.

Every read is batched: one DescribeTopics for all topics, one DescribeConfigs for all
topic configs, one for all group configs, issued together, so planning 200 specs costs
a handful of round trips rather than hundreds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, TopicCollection
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
    ResourcePatternType,
    ResourceType,
)

from queueplane.errors import ACL_HINT, ClusterRefused, ClusterUnreachable
from queueplane.kafka import clients
from queueplane.kafka.owners import ACLS_KEY, GROUP_KEY, Owner, group_owners_in, owners_in, read_records, write_records
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


AclKey = tuple[str, str, str, str, bool]  # principal, resource, name, operation, prefixed
_Binding = TypeVar("_Binding", bound=AclBinding)  # an ACL to create, or a filter matching exactly it


@dataclass(frozen=True)
class LiveTopic:
    partitions: int
    replication_factor: int


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
                    raise
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
        if topic_names:
            records = read_records(self.target)
            state.owners = owners_in(records)
            state.group_owners = group_owners_in(records)
            state.acl_records = {
                key.removeprefix(ACLS_KEY): value["acls"] for key, value in records.items() if key.startswith(ACLS_KEY)
            }
        # The ACLs of the principals the specs name, and of those apply once granted these queues.
        named = set(principals) | {a["principal"] for q in acl_queues for a in state.acl_records.get(q, [])}
        if named:
            state.acls = self.describe_acls(named) if self.has_authorizer() else None
        return state

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

    def record_acls(self, acls: dict[str, list[dict[str, Any]]]) -> dict[str, str | None]:
        """Record the ACLs apply made for each queue (team/name); per queue, the error or None."""
        written = write_records(self.target, {ACLS_KEY + queue: {"acls": made} for queue, made in acls.items()})
        return {key.removeprefix(ACLS_KEY): error for key, error in written.items()}

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
