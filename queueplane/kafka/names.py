"""Kafka config names queueplane reads or writes, in one place.

Names differ between Kafka versions; code that talks to a live broker checks the
names that broker reports (see ``queueplane.cluster``) before using these.
"""

from __future__ import annotations

# Topic configs
RETENTION_MS = "retention.ms"
CLEANUP_POLICY = "cleanup.policy"

# Share-group GROUP configs (KIP-932, IncrementalAlterConfigs on ConfigResource GROUP)
SHARE_LOCK_DURATION_MS = "share.record.lock.duration.ms"
SHARE_DELIVERY_COUNT_LIMIT = "share.delivery.count.limit"  # per group from Kafka 4.3
SHARE_MAX_RECORD_LOCKS = "share.partition.max.record.locks"
SHARE_AUTO_OFFSET_RESET = "share.auto.offset.reset"
SHARE_ISOLATION_LEVEL = "share.isolation.level"

# Consumer-group GROUP config (KIP-848): the session of the group's consumer-protocol members,
# which the broker holds for them (a member's own session.timeout.ms is not sent under it).
CONSUMER_SESSION_TIMEOUT_MS = "consumer.session.timeout.ms"
# The session a consumer queue's members get: a killed member's partitions move after it. Under
# the consumer protocol it is the group config above, raised to the broker's lower bound; classic
# members send it themselves.
MEMBER_SESSION_TIMEOUT_MS = 10_000
# And how often its members heartbeat: a member learns of partitions another member released only
# on its next heartbeat, and until then nobody works them (Kafka's default is 5 s).
CONSUMER_HEARTBEAT_INTERVAL_MS = "consumer.heartbeat.interval.ms"
MEMBER_HEARTBEAT_INTERVAL_MS = 1_000

# Broker configs that bound the consumer-group GROUP configs above
BROKER_CONSUMER_SESSION_MIN = "group.consumer.min.session.timeout.ms"
BROKER_CONSUMER_SESSION_MAX = "group.consumer.max.session.timeout.ms"
BROKER_CONSUMER_HEARTBEAT_MIN = "group.consumer.min.heartbeat.interval.ms"
BROKER_CONSUMER_HEARTBEAT_MAX = "group.consumer.max.heartbeat.interval.ms"

# Broker configs that bound the share-group GROUP configs above
BROKER_SHARE_LOCK_MIN = "group.share.min.record.lock.duration.ms"
BROKER_SHARE_LOCK_MAX = "group.share.max.record.lock.duration.ms"
BROKER_SHARE_LOCK_DEFAULT = "group.share.record.lock.duration.ms"
BROKER_SHARE_DELIVERY_MIN = "group.share.min.delivery.count.limit"
BROKER_SHARE_DELIVERY_MAX = "group.share.max.delivery.count.limit"
BROKER_SHARE_DELIVERY_DEFAULT = "group.share.delivery.count.limit"
BROKER_SHARE_LOCKS_MIN = "group.share.min.partition.max.record.locks"
BROKER_SHARE_LOCKS_MAX = "group.share.max.partition.max.record.locks"
BROKER_SHARE_LOCKS_DEFAULT = "group.share.partition.max.record.locks"
BROKER_DEFAULT_REPLICATION = "default.replication.factor"

# Feature flag that turns share groups on (kafka-features / ApiVersions)
SHARE_FEATURE = "share.version"

# The broker-wide setting that stands in for a GROUP config the broker cannot hold per group
BROKER_FALLBACK_FOR_GROUP_CONFIG = {
    SHARE_LOCK_DURATION_MS: BROKER_SHARE_LOCK_DEFAULT,
    SHARE_DELIVERY_COUNT_LIMIT: BROKER_SHARE_DELIVERY_DEFAULT,
    SHARE_MAX_RECORD_LOCKS: BROKER_SHARE_LOCKS_DEFAULT,
}

# Topics that belong to Kafka itself (__consumer_offsets, __transaction_state,
# __share_group_state, __cluster_metadata, …) and to the tools around it (Schema Registry's
# _schemas, Confluent's _confluent-*), and queueplane's own record of which queue owns which
# topic (kafka/owners.py): no spec may create, alter or write to them.
INTERNAL_TOPIC_PREFIXES = ("__", "_confluent", "_queueplane")
INTERNAL_TOPICS = frozenset({"_schemas"})


# Names the worker of group ``group_id`` gives its own Kafka resources, in one place: the runtime
# uses them, and the worker's ACLs (provision/acls.py) grant exactly these. A spec's group id
# has no ':' (the schema's pattern), so a prefix ending in ':' after the group id starts no
# other group's names: ``queueplane.g.`` would have covered group ``g.x``'s ids too.
def transactional_id_prefix(group_id: str) -> str:
    """exactlyOnce producers' transactional ids: this prefix, then topic and partition."""
    return f"queueplane:{group_id}:"


# Groups queueplane's own tools and readers take (all start with this), and the group ids it
# derives from a queue's (``dlq redrive``, ``lag``): no spec may take one as its group.
RESERVED_GROUP_PREFIX = "queueplane"
REDRIVE_GROUP_SUFFIX = ".dlq-redrive"
LAG_SAMPLER_GROUP_SUFFIX = ".lag-sampler"
DERIVED_GROUP_SUFFIXES = (REDRIVE_GROUP_SUFFIX, LAG_SAMPLER_GROUP_SUFFIX)


def redrive_group(group_id: str) -> str:
    """The group ``queueplane dlq redrive`` reads a queue's DLQ with."""
    return group_id + REDRIVE_GROUP_SUFFIX


def lag_sampler_group(group_id: str) -> str:
    """The group ``queueplane lag`` samples a queue's newest records with."""
    return group_id + LAG_SAMPLER_GROUP_SUFFIX


def reserved_group_use(group_id: str) -> str | None:
    """Why ``group_id`` is queueplane's own and no spec's, or None."""
    if group_id.lower().startswith(RESERVED_GROUP_PREFIX):
        return f"starts with {RESERVED_GROUP_PREFIX}, which names queueplane's own groups"
    for suffix in DERIVED_GROUP_SUFFIXES:
        if group_id.endswith(suffix):
            return f"ends with {suffix}, which names the group queueplane derives from another queue's"
    return None


def kmq_tracker_group(group_id: str) -> str:
    """The consumer group a kmq queue's redelivery tracker reads the markers topic with."""
    return f"queueplane-kmq-tracker-{group_id}"


def spark_reader_group_prefix(group_id: str) -> str:
    """Spark's Kafka source names its own consumer groups with this prefix (``groupIdPrefix``).

    A spec's group id has no ':', so no queue's prefix is the start of another's.
    """
    return f"queueplane-spark:{group_id}:"


def is_internal_topic(name: str) -> bool:
    return name in INTERNAL_TOPICS or name.startswith(INTERNAL_TOPIC_PREFIXES)
