"""The plan: what the specs want, what the cluster has, and the changes between them.

Planning is a pure function of the specs and a LiveState snapshot, so it is tested
without a broker and ``apply`` executes exactly what ``plan`` showed. A queue whose owner
records name a spec under the planned paths that no spec there declares any more is being
removed: provision/removal.py finds it, plans what goes away (lines that carry ``removes``)
and makes the whole plan; ``diff`` is told which queues are gone, so a new spec may take over
what they owned (a rename).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeGuard, get_args

from queueplane.errors import PlanRefused
from queueplane.kafka import names as kn
from queueplane.kafka.cluster import AclKey, LiveConfig, LiveState
from queueplane.kafka.owners import GROUP_KEY, Owner, QueueRecord, spec_key
from queueplane.provision.acls import Acl, AclChanges, Operation, Resource, acl_changes, wanted_acls
from queueplane.spec.model import QueueSpec, TopicSpec

Action = Literal["create", "adopt", "change", "delete", "refuse", "retain", "wait"]
Kind = Literal[
    "topic",
    "partitions",
    "replication",
    "topic-config",
    "group",
    "group-config",
    "acl",
    "queue",
    "release",
    "queue-object",
    "records",
]
# "=" for a topic taken over as it is (Pulumi's mark for an import), and for one a removal keeps;
# ">" for a removal that waits (the worker still runs, the queue is not drained yet): shown, not
# applied, and a change still to come (``--detailed-exitcode`` counts it).
SYMBOLS: dict[str, str] = {
    "create": "+",
    "adopt": "=",
    "change": "~",
    "delete": "-",
    "refuse": "!",
    "retain": "=",
    "wait": ">",
}
# Shown, never applied: what a removal keeps, and what it does later.
PENDING: frozenset[str] = frozenset({"retain", "wait"})
# The two halves an orchestrator applies as separate steps (each with its own log), and the
# removals (every line that ``removes`` a queue: Change.part), which it applies only once approved.
TOPIC_KINDS: frozenset[str] = frozenset({"topic", "partitions", "replication", "topic-config"})
GROUP_KINDS: frozenset[str] = frozenset({"group", "group-config", "acl", "queue"})
REMOVAL = "removal"
REMOVAL_KINDS: frozenset[str] = frozenset({REMOVAL})
Role = Literal["queue", "dead-letter", "markers", "output"]
_RESOURCES: frozenset[str] = frozenset(get_args(Resource))  # the resources and operations of queueplane's ACLs
_OPERATIONS: frozenset[str] = frozenset(get_args(Operation))


@dataclass(frozen=True)
class DesiredTopic:
    name: str
    partitions: int
    replication_factor: int | None
    config: dict[str, str]
    role: Role
    spec: str
    managed: bool = True  # output topics are only created, never altered
    queue: str = ""  # team/name of the owning queue (managed topics)
    adopt: bool = False


@dataclass(frozen=True)
class DesiredGroup:
    id: str
    config: dict[str, str]
    spec: str
    type: Literal["share", "consumer"] = "share"


@dataclass(frozen=True)
class Change:
    """One line of the plan."""

    action: Action
    kind: Kind
    target: str
    spec: str
    field: str = ""
    old: str | None = None
    new: str | None = None
    reason: str = ""
    removes: str = ""  # team/name of the queue whose removal this line is part of

    @property
    def symbol(self) -> str:
        return SYMBOLS[self.action]

    @property
    def part(self) -> str:
        """The part of the plan the line belongs to: its kind, or REMOVAL."""
        return REMOVAL if self.removes else self.kind

    @property
    def applicable(self) -> bool:
        """Whether ``apply`` makes this change (a kept or waiting line is only shown)."""
        return self.action not in PENDING and self.action != "refuse"

    def describe(self) -> str:
        if self.removes or self.action in PENDING or self.kind in ("queue", "release", "queue-object", "records"):
            return self.reason
        if self.field == "owner":
            return f"owner: queue {self.old} -> {self.new} ({self.reason})"
        if self.action == "refuse":
            return f"{self.field}: {self.old} -> {self.new}: {self.reason}" if self.field else self.reason
        if self.kind == "acl":
            return self.reason
        if self.kind in ("topic", "group"):
            return self.new or ""
        if self.old is None:
            return f"{self.field}={self.new}"
        return f"{self.field}: {self.old} -> {self.new}"


def brief(changes: list[Change], limit: int = 5) -> str:
    """A few changes in one line, with a count of the rest: error messages stay one paragraph."""
    shown = "; ".join(f"{c.kind} {c.target} {c.describe()}".rstrip() for c in changes[:limit])
    return shown + (f"; and {len(changes) - limit} more" if len(changes) > limit else "")


@dataclass
class Removal:
    """What apply removes for one queue whose spec is gone, in the order it removes it; nothing
    while the removal waits for its worker to stop."""

    spec: str  # the removed spec, as the plan names it
    release: tuple[str, str] | None = None  # (namespace, release) this removal uninstalls
    application: str = ""  # team/application the release must belong to
    # The queue's Queue object (namespace/name) and the release it goes with (this removal's or
    # another removed queue's of the same application)
    queue_object: tuple[str, tuple[str, str]] | None = None
    acls: list[Acl] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    group_configs: dict[str, list[str]] = field(default_factory=dict)
    topics: list[str] = field(default_factory=list)
    forget: list[str] = field(default_factory=list)  # owner record keys, deleted last
    # The queue's record as it is left while part of the removal waits (None: deleted with the rest)
    keep_record: dict[str, Any] | None = None
    renamed_to: list[str] = field(default_factory=list)  # planned queues that took over part of it
    waits_for_worker: bool = False  # nothing is removed until the worker stops


@dataclass(frozen=True)
class RemovalOptions:
    """How removals are planned: the grace a ``deletionPolicy: delete`` topic's newest record must
    be older than, whether a dead-letter topic that holds records may go, and the time now."""

    grace_s: int = 24 * 3600
    force_delete_dlq: bool = False
    now_ms: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"graceSeconds": self.grace_s, "forceDeleteDlq": self.force_delete_dlq}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> RemovalOptions:
        """The options as_dict wrote (a saved plan's); the time is the new plan's."""
        return cls(int(value.get("graceSeconds", cls.grace_s)), bool(value.get("forceDeleteDlq", False)))


@dataclass
class Plan:
    cluster: str
    specs: list[str]
    changes: list[Change] = field(default_factory=list)
    # What the "create" lines stand for, for apply (not shown: the change lines say it).
    new_topics: dict[str, DesiredTopic] = field(default_factory=dict, repr=False)
    # The owner record apply writes for each topic it creates or adopts, before touching it.
    claims: dict[str, Owner] = field(default_factory=dict, repr=False)
    # The owner record apply writes for each group id no queue has claimed yet.
    group_claims: dict[str, Owner] = field(default_factory=dict, repr=False)
    # Per queue (team/name) whose ACLs change: the ACLs to create and delete, and the record of
    # the ACLs queueplane made for it once they are applied.
    acls: dict[str, AclChanges] = field(default_factory=dict, repr=False)
    # The queue records (kafka/owners.QueueRecord fields, and the ACLs recorded when planned) of the
    # planned queues, and the queues whose record apply writes (those with any change: the record
    # says what a removal will need).
    queue_fields: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    record_queues: set[str] = field(default_factory=set, repr=False)
    # Per queue being removed (team/name): what apply deletes.
    removals: dict[str, Removal] = field(default_factory=dict, repr=False)
    # The planned paths (orphans are found under them) and how removals were planned.
    paths: list[str] = field(default_factory=list, repr=False)
    options: RemovalOptions = field(default_factory=RemovalOptions, repr=False)

    @property
    def refused(self) -> list[Change]:
        return [c for c in self.changes if c.action == "refuse"]

    @property
    def actionable(self) -> list[Change]:
        """The changes apply makes."""
        return [c for c in self.changes if c.applicable]

    @property
    def pending(self) -> list[Change]:
        """What a removal keeps, or does later: shown, never applied."""
        return [c for c in self.changes if c.action in PENDING]

    def raise_if_refused(self) -> None:
        """Refusals block the whole apply, so a half-applied spec never happens by design."""
        if self.refused:
            raise PlanRefused(
                f"the plan has {len(self.refused)} refused change(s); nothing was applied: {brief(self.refused)}"
            )

    def only(self, kinds: frozenset[str]) -> Plan:
        """The changes of these kinds; refusals of every kind stay, so a part never applies past one."""
        kept = [c for c in self.changes if c.part in kinds or c.action == "refuse"]
        topics = "topic" in kinds
        return Plan(
            self.cluster,
            self.specs,
            kept,
            {n: t for n, t in self.new_topics.items() if topics},
            {n: o for n, o in self.claims.items() if topics},
            {g: o for g, o in self.group_claims.items() if "group" in kinds},
            {q: c for q, c in self.acls.items() if "acl" in kinds},
            self.queue_fields,
            self.record_queues if "queue" in kinds else set(),
            self.removals if REMOVAL in kinds else {},
            self.paths,
            self.options,
        )

    def counts(self) -> dict[str, int]:
        return {a: sum(1 for c in self.changes if c.action == a) for a in SYMBOLS}

    def as_dict(self) -> dict[str, object]:
        return {
            "cluster": self.cluster,
            "specs": self.specs,
            "paths": self.paths,
            "removal": self.options.as_dict(),
            "summary": self.counts(),
            "changes": [asdict(c) for c in self.changes],
        }


def share_group_configs(queue: QueueSpec) -> dict[str, str]:
    """The GROUP configs a share spec manages."""
    group = queue.group
    return {
        kn.SHARE_LOCK_DURATION_MS: str(group.lock_duration_ms),
        kn.SHARE_DELIVERY_COUNT_LIMIT: str(group.broker_delivery_limit),
        kn.SHARE_MAX_RECORD_LOCKS: str(group.max_in_flight),
        kn.SHARE_AUTO_OFFSET_RESET: group.start_from,
        # Records of aborted transactions (a redrive killed midway) are never delivered.
        kn.SHARE_ISOLATION_LEVEL: "read_committed",
    }


def consumer_group_configs(queue: QueueSpec, live: LiveState | None = None) -> dict[str, str]:
    """The GROUP configs a consumer or kmq spec manages: its members' session and heartbeat under
    KIP-848's protocol.

    There the broker holds the session (``group.consumer.session.timeout.ms``, 45 s by default)
    and a member's own ``session.timeout.ms`` is not sent, so a killed member would keep its
    partitions for 45 s; the group's session is the members' classic one. A member learns of
    partitions another released (a scale-up, a member that drained) only on its next heartbeat,
    5 s by default, and nobody works them until then; the group's heartbeat is 1 s. Each is kept
    within the broker's bounds (live, when read).
    """
    del queue  # every consumer queue's members want the same
    brokers = live.broker_configs if live is not None else {}
    return {
        kn.CONSUMER_SESSION_TIMEOUT_MS: _within(
            kn.MEMBER_SESSION_TIMEOUT_MS, brokers, kn.BROKER_CONSUMER_SESSION_MIN, kn.BROKER_CONSUMER_SESSION_MAX
        ),
        kn.CONSUMER_HEARTBEAT_INTERVAL_MS: _within(
            kn.MEMBER_HEARTBEAT_INTERVAL_MS, brokers, kn.BROKER_CONSUMER_HEARTBEAT_MIN, kn.BROKER_CONSUMER_HEARTBEAT_MAX
        ),
    }


def _within(wanted: int, brokers: dict[str, str], low_name: str, high_name: str) -> str:
    """``wanted``, raised to the broker config ``low_name`` and lowered to ``high_name`` where set."""
    low, high = brokers.get(low_name), brokers.get(high_name)
    if low is not None:
        wanted = max(wanted, int(low))
    if high is not None:
        wanted = min(wanted, int(high))
    return str(wanted)


# The topic config that bounds a record batch, the broker setting a topic without it inherits,
# and that setting's default.
MAX_MESSAGE_BYTES = "max.message.bytes"
BROKER_MAX_MESSAGE_BYTES = "message.max.bytes"
KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
# What a dead letter adds to its record: eight headers (the source topic, partition and offset,
# the delivery count, the error class, the error message of up to 2000 characters (8 KB of UTF-8
# at most), two times) and, parked in the queue's topic, one more. 64 KiB holds them many times
# over, so a record the queue's topic took is never too large for its DLQ.
DEAD_LETTER_HEADROOM = 64 * 1024


def dead_letter_config(queue: QueueSpec, live: LiveState | None = None) -> dict[str, str]:
    """The DLQ's topic config: the spec's, with ``max.message.bytes`` at least the queue topic's
    plus ``DEAD_LETTER_HEADROOM``.

    A DLQ that refuses a record its queue's topic took turns every dead letter of that size
    into one that cannot be written. The queue topic's limit is the spec's, else the live one
    (the topic's, when read, else the broker's ``message.max.bytes`` it inherits), else Kafka's
    default. A DLQ spec asking for more keeps its own.
    """
    config = dict(queue.dead_letter.config)
    queue_limit = queue.topic.config.get(MAX_MESSAGE_BYTES)
    if queue_limit is None and live is not None:
        read = live.topic_configs.get(queue.topic.name, {}).get(MAX_MESSAGE_BYTES)
        queue_limit = read.value if read is not None else live.broker_configs.get(BROKER_MAX_MESSAGE_BYTES)
    wanted = int(queue_limit or KAFKA_DEFAULT_MAX_MESSAGE_BYTES) + DEAD_LETTER_HEADROOM
    own = config.get(MAX_MESSAGE_BYTES)
    if own is None or int(own) < wanted:
        config[MAX_MESSAGE_BYTES] = str(wanted)
    return config


def desired_state(
    queues: list[QueueSpec], live: LiveState | None = None
) -> tuple[list[DesiredTopic], list[DesiredGroup]]:
    """The topics and groups the specs want; ``live``, when known, gives the limits a spec leaves to the cluster."""
    topics: list[DesiredTopic] = []
    groups: list[DesiredGroup] = []
    owned = {name for q in queues for _, name in q.owned_topics()}
    for q in queues:
        owned_by_spec: list[tuple[TopicSpec, Role, dict[str, str]]] = [
            (q.topic, "queue", q.topic.config),
            (q.dead_letter, "dead-letter", dead_letter_config(q, live)),
        ]
        if q.markers is not None:
            owned_by_spec.append((q.markers, "markers", q.markers.config))
        for spec_topic, role, config in owned_by_spec:
            topics.append(
                DesiredTopic(
                    spec_topic.name,
                    spec_topic.partitions,
                    spec_topic.replication_factor,
                    config,
                    role,
                    q.source,
                    queue=q.owner,
                    adopt=spec_topic.adopt,
                )
            )
        if q.output_topic and q.output_topic not in owned:
            owned.add(q.output_topic)  # two specs writing one output topic create it once
            topics.append(
                DesiredTopic(
                    q.output_topic,
                    q.topic.partitions,
                    q.topic.replication_factor,
                    {},
                    "output",
                    q.source,
                    managed=False,
                )
            )
        if q.group.type == "share":
            groups.append(DesiredGroup(q.group.id, share_group_configs(q), q.source))
        else:  # consumer and kmq: both run as members of a consumer group
            groups.append(DesiredGroup(q.group.id, consumer_group_configs(q, live), q.source, "consumer"))
    return topics, groups


def _topic_summary(topic: DesiredTopic, default_rf: str | None) -> str:
    rf = topic.replication_factor if topic.replication_factor is not None else f"{default_rf or '?'} (cluster default)"
    parts = [f"partitions={topic.partitions}", f"replicationFactor={rf}"]
    parts += [f"{k}={v}" for k, v in sorted(topic.config.items())]
    if topic.role != "queue":
        parts.append(f"({topic.role})")
    return " ".join(parts)


def _config_changes(
    kind: Kind, target: str, spec: str, wanted: dict[str, str], live: dict[str, LiveConfig]
) -> list[Change]:
    out = []
    for key, value in sorted(wanted.items()):
        current = live.get(key)
        if current is None:
            out.append(Change("change", kind, target, spec, key, None, value))
        elif current.value != value:
            out.append(Change("change", kind, target, spec, key, current.value, value))
        elif not current.explicit:
            # Same value, but inherited: pin it so a changed cluster default cannot move it.
            out.append(Change("change", kind, target, spec, key, f"{current.value} (inherited)", value))
    return out


def _group_changes(group: DesiredGroup, live: LiveState) -> list[Change]:
    if group.type == "consumer":
        # A broker without the config (before Kafka 4.0) runs classic members only, and they
        # send their own session: nothing to set there.
        settable = {k: v for k, v in group.config.items() if k in live.group_config_names}
        return _config_changes("group-config", group.id, group.spec, settable, live.group_configs.get(group.id, {}))
    if not live.group_config_names:
        return [
            Change(
                "refuse",
                "group-config",
                group.id,
                group.spec,
                reason="the cluster has no GROUP configs (Kafka < 4.0): it cannot run share groups",
            )
        ]
    wanted: dict[str, str] = {}
    out: list[Change] = []
    for key, value in group.config.items():
        if key in live.group_config_names:
            wanted[key] = value
            continue
        fallback = kn.BROKER_FALLBACK_FOR_GROUP_CONFIG.get(key)
        broker_value = live.broker_configs.get(fallback) if fallback else None
        if broker_value == value:
            continue  # not settable per group, but the broker-wide value already matches
        out.append(
            Change(
                "refuse",
                "group-config",
                group.id,
                group.spec,
                key,
                broker_value,
                value,
                f"this broker cannot hold {key} per group; the broker-wide {fallback} applies "
                f"(upgrade to Kafka 4.3 or newer, or set {fallback}={value} on the brokers)"
                if fallback
                else f"this broker has no GROUP config {key} (share groups need Kafka 4.2 or newer)",
            )
        )
    out += _config_changes("group-config", group.id, group.spec, wanted, live.group_configs.get(group.id, {}))
    return out


def _ownership(topic: DesiredTopic, owner: Owner | None, gone: Collection[str] = ()) -> Change | None:
    """None when the topic is this queue's; an adopt line, a take-over from a queue being removed
    (a rename), or a refusal, when it is not (yet)."""
    if owner is not None and owner.queue == topic.queue:
        return None
    if owner is not None and owner.queue in gone:
        return Change("change", "topic", topic.name, topic.spec, "owner", owner.queue, topic.queue, "renamed")
    if owner is not None:
        reason = (
            f"the topic belongs to queue {owner.queue} ({owner.spec}); two queues never share a topic, "
            "so rename this one"
        )
        return Change("refuse", "topic", topic.name, topic.spec, reason=reason)
    if not topic.adopt:
        field = {"queue": "topic", "dead-letter": "deadLetter", "markers": "markers"}[topic.role]
        reason = (
            "the topic exists and no queueplane spec created it; to take it over as it is, and manage "
            f"its configs from this spec, set spec.{field}.adopt: true"
        )
        return Change("refuse", "topic", topic.name, topic.spec, reason=reason)
    return Change("adopt", "topic", topic.name, topic.spec, new=f"adopted as it is ({topic.role})")


def diff(queues: list[QueueSpec], live: LiveState, cluster_label: str, gone: Collection[str] = ()) -> Plan:
    """Every change needed to make the cluster match the specs; refusals for what must not change.

    ``gone``: the queues being removed (provision/removal.py), whose topics, group and ACLs a
    spec may take over (a rename); their own lines are removal.plan_removals'.
    """
    topics, groups = desired_state(queues, live)
    plan = Plan(cluster_label, sorted({q.source for q in queues}))
    brokers = len(live.broker_ids)
    for topic in topics:
        existing = live.topics.get(topic.name)
        if existing is None:
            if topic.replication_factor is not None and topic.replication_factor > brokers:
                plan.changes.append(
                    Change(
                        "refuse",
                        "topic",
                        topic.name,
                        topic.spec,
                        "replicationFactor",
                        None,
                        str(topic.replication_factor),
                        f"the cluster has {brokers} broker(s); a topic cannot have more replicas than brokers",
                    )
                )
                continue
            plan.changes.append(
                Change(
                    "create",
                    "topic",
                    topic.name,
                    topic.spec,
                    new=_topic_summary(topic, live.broker_configs.get(kn.BROKER_DEFAULT_REPLICATION)),
                )
            )
            plan.new_topics[topic.name] = topic
            if topic.managed:
                plan.claims[topic.name] = Owner(topic.queue, topic.spec, topic.role)
            continue
        if not topic.managed:
            continue
        ownership = _ownership(topic, live.owners.get(topic.name), gone)
        if ownership is not None:
            plan.changes.append(ownership)
            if ownership.action == "refuse":
                continue
            plan.claims[topic.name] = Owner(topic.queue, topic.spec, topic.role)
        if topic.partitions != existing.partitions:
            grow = topic.partitions > existing.partitions
            plan.changes.append(
                Change(
                    "change" if grow else "refuse",
                    "partitions",
                    topic.name,
                    topic.spec,
                    "partitions",
                    str(existing.partitions),
                    str(topic.partitions),
                    "" if grow else "Kafka cannot remove partitions; keep the count or create a new topic",
                )
            )
        if topic.replication_factor is not None and topic.replication_factor != existing.replication_factor:
            plan.changes.append(
                Change(
                    "refuse",
                    "replication",
                    topic.name,
                    topic.spec,
                    "replicationFactor",
                    str(existing.replication_factor),
                    str(topic.replication_factor),
                    "queueplane does not move replicas; use kafka-reassign-partitions, then update the spec",
                )
            )
        plan.changes += _config_changes(
            "topic-config", topic.name, topic.spec, topic.config, live.topic_configs.get(topic.name, {})
        )
    for queue in queues:
        _plan_group_owner(plan, queue, live, gone)
        _plan_foreign_output(plan, queue, live)
    for group in groups:
        plan.changes += _group_changes(group, live)
    handed_over = {a for q in gone for a in recorded_acls(live, q)}
    for queue in queues:
        _plan_acls(plan, queue, live, handed_over)
    for queue in queues:
        _plan_queue_record(plan, queue, live, gone)
    changed = {c.spec for c in plan.changes if c.applicable}
    plan.record_queues = {q.owner for q in queues if q.source in changed}
    return plan


def recorded_acls(live: LiveState, queue: str) -> set[Acl]:
    """The ACLs apply recorded making for ``queue``."""
    return {Acl(**a) for a in live.acl_records.get(queue, [])}


def _plan_queue_record(plan: Plan, queue: QueueSpec, live: LiveState, gone: Collection[str]) -> None:
    """The queue's record says what removal needs once the spec is gone (kafka/owners.QueueRecord).
    It is written with any change of the queue; a line shows a rename, and a record that differs
    from the spec in a queue with no other change (such as a new ``deletionPolicy``)."""
    wanted = QueueRecord(
        queue.owner,
        str(Path(queue.source).resolve()),
        spec_key(queue.source),
        queue.deletion_policy,
        queue.group.type,
        queue.application,
        queue.namespace,
        queue.deploy_target,
        recorded=True,
    )
    plan.queue_fields[queue.owner] = {**wanted.fields(), "acls": live.acl_records.get(queue.owner, [])}
    taken = [(key, owner) for key, owner in _owned_names(live) if key in _names_of(queue) and owner in gone]
    renamed = sorted({owner for _, owner in taken})
    if renamed:
        passed = ", ".join(sorted(key for key, _ in taken))
        reason = (
            f"renamed from queue {', '.join(renamed)}: {passed} pass to {queue.owner}; the rest of "
            f"{', '.join(renamed)} is removed (its lines below)"
        )
        plan.changes.append(Change("change", "queue", queue.owner, queue.source, reason=reason))
        return
    if any(c.spec == queue.source and c.applicable for c in plan.changes):
        return  # written with the queue's other changes
    current = QueueRecord.from_record(queue.owner, live.queue_records.get(queue.owner))
    differs = [
        (name, old, new)
        for name, old, new in (
            ("deletionPolicy", current.deletion_policy, wanted.deletion_policy),
            ("application", current.application, wanted.application),
            ("namespace", current.namespace, wanted.namespace),
            ("target", current.target, wanted.target),
        )
        if old != new
    ]
    if current.recorded and not _same_spec(current, wanted):
        differs.append(("spec", current.spec_key or current.spec, wanted.spec_key or wanted.spec))
    if differs:
        reason = "recorded " + ", ".join(f"{name}: {old} -> {new}" for name, old, new in differs)
        plan.changes.append(Change("change", "queue", queue.owner, queue.source, reason=reason))


def _names_of(queue: QueueSpec) -> set[str]:
    """The record keys of what the queue owns: its topics and ``group:<id>``."""
    return {name for _, name in queue.owned_topics()} | {GROUP_KEY + queue.group.id}


def _owned_names(live: LiveState) -> list[tuple[str, str]]:
    return [(n, o.queue) for n, o in live.owners.items()] + [
        (GROUP_KEY + g, o.queue) for g, o in live.group_owners.items()
    ]


def _same_spec(current: QueueRecord, wanted: QueueRecord) -> bool:
    """Whether a record names the spec file: by its place in the repository when both have one (each
    checkout has its own absolute path), else by the absolute path."""
    if current.spec_key and wanted.spec_key:
        return current.spec_key == wanted.spec_key
    return current.spec == wanted.spec


def _plan_group_owner(plan: Plan, queue: QueueSpec, live: LiveState, gone: Collection[str] = ()) -> None:
    """A group id belongs to the first queue apply claimed it for: another queue's is refused (one
    being removed hands it over: a rename), an unclaimed one is claimed (recorded before anything
    else of the plan's group half)."""
    group = queue.group.id
    owner = live.group_owners.get(group)
    if owner is not None and owner.queue == queue.owner:
        return
    if owner is not None and owner.queue in gone:
        plan.changes.append(
            Change("change", "group", group, queue.source, "owner", owner.queue, queue.owner, "renamed")
        )
        plan.group_claims[group] = Owner(queue.owner, queue.source, "group")
        return
    if owner is not None:
        reason = (
            f"the group belongs to queue {owner.queue} ({owner.spec}); two queues never share a group "
            "(each would steal the other's records), so rename this one"
        )
        plan.changes.append(Change("refuse", "group", group, queue.source, reason=reason))
        return
    plan.changes.append(Change("create", "group", group, queue.source, new=f"claimed for queue {queue.owner}"))
    plan.group_claims[group] = Owner(queue.owner, queue.source, "group")


def _plan_foreign_output(plan: Plan, queue: QueueSpec, live: LiveState) -> None:
    """An output topic another team's queue owns takes this queue's outputs only when that
    queue's applied spec lists the worker as a producer (its recorded WRITE ACL)."""
    topic = queue.output_topic
    owner = live.owners.get(topic) if topic else None
    if topic is None or owner is None or owner.queue.split("/", 1)[0] == queue.team:
        return
    listed = {Acl(**a) for a in live.acl_records.get(owner.queue, [])}
    worker = queue.worker_principal
    if worker is not None and Acl(worker, "TOPIC", topic, "WRITE") in listed:
        return
    reason = (
        f"the output topic belongs to queue {owner.queue} ({owner.spec}) of another team, whose applied "
        f"spec does not list this queue's worker ({worker or 'no spec.access.worker'}) in spec.access.producers"
    )
    plan.changes.append(Change("refuse", "topic", topic, queue.source, reason=reason))


def _is_resource(name: str) -> TypeGuard[Resource]:
    return name in _RESOURCES


def _is_operation(name: str) -> TypeGuard[Operation]:
    return name in _OPERATIONS


def _known_acls(keys: set[AclKey]) -> set[Acl]:
    """The live ACLs in the words queueplane grants in. The others (another operation, such as
    ALL or DESCRIBE, or another resource) are someone else's: never wanted, so never created or
    deleted, nor recorded, so left as they are."""
    return {
        Acl(principal, resource, name, operation, prefixed)
        for principal, resource, name, operation, prefixed in keys
        if _is_resource(resource) and _is_operation(operation)
    }


def _plan_acls(plan: Plan, queue: QueueSpec, live: LiveState, handed_over: Collection[Acl] = ()) -> None:
    """The queue's ACL changes. ``handed_over``: ACLs apply made for queues being removed; those this
    queue wants become its own (a renamed queue keeps its grants), the rest the removal revokes."""
    wanted = wanted_acls(queue)
    own = recorded_acls(live, queue.owner)
    recorded = own | (set(handed_over) & set(wanted))
    if not wanted and not recorded:
        return
    if live.acls is None:
        reason = "the cluster has no authorizer (authorizer.class.name): spec.access cannot be enforced"
        plan.changes.append(Change("refuse", "acl", queue.owner, queue.source, reason=reason))
        return
    changes = acl_changes(wanted, _known_acls(live.acls), recorded)
    for acl in changes.create:
        drift = "made by queueplane, deleted since (drift)" if acl in changes.drifted else ""
        plan.changes.append(Change("create", "acl", acl.describe(), queue.source, reason=drift))
    for acl in changes.delete:
        reason = "no longer in the spec"
        plan.changes.append(Change("delete", "acl", acl.describe(), queue.source, reason=reason))
    if changes.create or changes.delete or set(changes.record) != own:
        plan.acls[queue.owner] = changes
