"""The planner is a pure function of specs and a cluster snapshot; these snapshots are the
shapes real brokers of other versions answer with, which the local broker cannot play."""

from __future__ import annotations

import pytest
from specs_factory import dump, spec

from queueplane.kafka import names as kn
from queueplane.kafka.cluster import LiveConfig, LiveState, LiveTopic
from queueplane.kafka.owners import Owner
from queueplane.provision.plan import desired_state, diff, share_group_configs
from queueplane.spec.rules import check_text

GROUP_NAMES_43 = frozenset(share_group_configs(check_text(dump(spec("share"))).queues[0]))


def _queue(doc):
    return check_text(dump(doc)).raise_if_invalid()[0]


def _state(**kw) -> LiveState:
    base = {"cluster_id": "c", "broker_ids": [1, 2, 3], "broker_configs": {}, "group_config_names": GROUP_NAMES_43}
    base.update(kw)
    return LiveState(**base)


def test_empty_cluster_plans_creates_for_every_owned_and_output_topic():
    queue = _queue(spec("share"))
    plan = diff([queue], _state(), "test")
    created = {c.target for c in plan.changes if c.action == "create" and c.kind == "topic"}
    assert created == {"brew.orders.v1", "brew.orders.v1.dlq", "brew.ready.v1"}
    groups = {c.field: c.new for c in plan.changes if c.kind == "group-config"}
    assert groups == {
        kn.SHARE_LOCK_DURATION_MS: "30000",
        kn.SHARE_DELIVERY_COUNT_LIMIT: "7",  # deliveryLimit 5 plus the reserve deliveries
        kn.SHARE_MAX_RECORD_LOCKS: "2000",
        kn.SHARE_AUTO_OFFSET_RESET: "earliest",
        kn.SHARE_ISOLATION_LEVEL: "read_committed",
    }


def test_existing_output_topic_is_never_altered():
    queue = _queue(spec("share"))
    live = _state(topics={"brew.ready.v1": LiveTopic(1, 1)}, topic_configs={"brew.ready.v1": {}})
    plan = diff([queue], live, "test")
    assert not [c for c in plan.changes if c.target == "brew.ready.v1"]


def test_broker_without_per_group_delivery_limit_refuses_unless_broker_value_matches():
    queue = _queue(spec("share"))
    names_42 = GROUP_NAMES_43 - {kn.SHARE_DELIVERY_COUNT_LIMIT}
    refused = diff(
        [queue], _state(group_config_names=names_42, broker_configs={kn.BROKER_SHARE_DELIVERY_DEFAULT: "3"}), "t"
    ).refused
    (change,) = refused
    assert change.field == kn.SHARE_DELIVERY_COUNT_LIMIT
    assert "cannot hold share.delivery.count.limit per group" in change.reason
    assert kn.BROKER_SHARE_DELIVERY_DEFAULT in change.reason
    matching = diff(
        [queue],
        _state(
            group_config_names=names_42,
            broker_configs={kn.BROKER_SHARE_DELIVERY_DEFAULT: str(queue.group.broker_delivery_limit)},
        ),
        "t",
    )
    assert matching.refused == []
    assert kn.SHARE_DELIVERY_COUNT_LIMIT not in {c.field for c in matching.changes}


def test_cluster_without_group_configs_cannot_run_share_groups():
    queue = _queue(spec("share"))
    (change,) = diff([queue], _state(group_config_names=frozenset()), "t").refused
    assert "cannot run share groups" in change.reason


def test_more_replicas_than_brokers_is_refused():
    doc = spec("share")
    doc["spec"]["topic"]["replicationFactor"] = 5
    refused = diff([_queue(doc)], _state(), "t").refused
    assert {c.target for c in refused} == {"brew.orders.v1", "brew.orders.v1.dlq", "brew.ready.v1"}
    assert "3 broker(s)" in refused[0].reason


def test_inherited_value_equal_to_spec_is_pinned_and_explicit_equal_value_is_not():
    queue = _queue(spec("consumer"))
    topics, _ = desired_state([queue])
    live_topics = {t.name: LiveTopic(t.partitions, 1) for t in topics}
    owners = {t.name: Owner(t.queue, t.spec, t.role) for t in topics if t.managed}
    group_owners = {queue.group.id: Owner(queue.owner, queue.source, "group")}
    doc = spec("consumer")
    doc["spec"]["topic"]["config"] = {"retention.ms": "1000"}
    queue = _queue(doc)
    dlq = {queue.dead_letter.name: {"max.message.bytes": LiveConfig(str(1_048_588 + 65536), True)}}
    configs = {"pay.events.v1": {"retention.ms": LiveConfig("1000", False)}, **dlq}
    inherited = _state(topics=live_topics, topic_configs=configs, owners=owners, group_owners=group_owners)
    (change,) = diff([queue], inherited, "t").changes
    assert change.old == "1000 (inherited)" and change.new == "1000"
    configs = {"pay.events.v1": {"retention.ms": LiveConfig("1000", True)}, **dlq}
    explicit = _state(topics=live_topics, topic_configs=configs, owners=owners, group_owners=group_owners)
    assert diff([queue], explicit, "t").changes == []


def test_created_topics_are_claimed_for_their_queue_and_the_output_topic_is_not():
    plan = diff([_queue(spec("share"))], _state(), "t")
    assert plan.claims == {
        "brew.orders.v1": Owner("kitchen/brew-orders", "spec.yaml", "queue"),
        "brew.orders.v1.dlq": Owner("kitchen/brew-orders", "spec.yaml", "dead-letter"),
    }


def test_an_existing_topic_no_spec_created_is_refused_unless_the_spec_adopts_it():
    live = _state(
        topics={"brew.orders.v1": LiveTopic(6, 1)},
        topic_configs={"brew.orders.v1": {"retention.ms": LiveConfig("1", True)}},
    )
    (refused,) = diff([_queue(spec("share"))], live, "t").refused
    assert (refused.kind, refused.target) == ("topic", "brew.orders.v1")
    assert "no queueplane spec created it" in refused.reason and "spec.topic.adopt: true" in refused.reason
    # Nothing else is planned for a refused topic: not its configs, not a claim.
    assert [c for c in diff([_queue(spec("share"))], live, "t").changes if c.target == "brew.orders.v1"] == [refused]

    doc = spec("share")
    doc["spec"]["topic"]["adopt"] = True
    plan = diff([_queue(doc)], live, "t")
    assert plan.refused == []
    lines = [(c.action, c.kind, c.describe()) for c in plan.changes if c.target == "brew.orders.v1"]
    assert lines == [
        ("adopt", "topic", "adopted as it is (queue)"),
        ("change", "topic-config", "retention.ms: 1 -> 604800000"),
    ]
    assert plan.claims["brew.orders.v1"] == Owner("kitchen/brew-orders", "spec.yaml", "queue")


def test_a_dead_letter_topic_needs_its_own_adopt():
    live = _state(topics={"brew.orders.v1.dlq": LiveTopic(6, 1)})
    (refused,) = diff([_queue(spec("share"))], live, "t").refused
    assert "spec.deadLetter.adopt: true" in refused.reason


def test_a_topic_another_queue_owns_is_refused_even_with_adopt():
    doc = spec("share")
    doc["spec"]["topic"]["adopt"] = True
    owners = {"brew.orders.v1": Owner("bakery/bread-orders", "specs/bakery/bread.yaml", "queue")}
    live = _state(topics={"brew.orders.v1": LiveTopic(6, 1)}, owners=owners)
    (refused,) = diff([_queue(doc)], live, "t").refused
    assert "belongs to queue bakery/bread-orders (specs/bakery/bread.yaml)" in refused.reason
    assert "brew.orders.v1" not in diff([_queue(doc)], live, "t").claims


def test_an_unclaimed_group_is_claimed_for_its_queue_and_anothers_is_refused():
    queue = _queue(spec("share"))
    plan = diff([queue], _state(), "t")
    (claim,) = [c for c in plan.changes if c.kind == "group"]
    assert (claim.action, claim.target, claim.new) == (
        "create",
        "kitchen-service",
        "claimed for queue kitchen/brew-orders",
    )
    assert plan.group_claims == {"kitchen-service": Owner("kitchen/brew-orders", "spec.yaml", "group")}
    # Another queue that takes the same group id later (another checkout, another team) is refused.
    taken = {"kitchen-service": Owner("victim-team/ledger", "specs/victim-team/ledger.yaml", "group")}
    refused = diff([queue], _state(group_owners=taken), "t")
    (change,) = [c for c in refused.refused if c.kind == "group"]
    assert "the group belongs to queue victim-team/ledger (specs/victim-team/ledger.yaml)" in change.reason
    assert refused.group_claims == {}
    # Its own claim plans nothing.
    own = {"kitchen-service": Owner("kitchen/brew-orders", "spec.yaml", "group")}
    assert [c for c in diff([queue], _state(group_owners=own), "t").changes if c.kind == "group"] == []


def test_an_output_topic_another_team_owns_needs_its_recorded_producer_acl():
    doc = spec("share")
    doc["spec"]["access"] = {"worker": "User:kitchen-worker"}
    queue = _queue(doc)
    owned = {"brew.ready.v1": Owner("victim-team/ledger", "specs/victim-team/ledger.yaml", "queue")}
    live = {"topics": {"brew.ready.v1": LiveTopic(1, 1)}, "owners": owned, "acls": None}

    (change,) = [c for c in diff([queue], _state(**live), "t").refused if c.target == "brew.ready.v1"]
    assert "belongs to queue victim-team/ledger" in change.reason
    assert "does not list this queue's worker (User:kitchen-worker)" in change.reason

    listed = {"victim-team/ledger": [{"principal": "User:kitchen-worker", "resource": "TOPIC", "name": "brew.ready.v1",
                                      "operation": "WRITE", "prefixed": False}]}  # fmt: skip
    allowed = diff([queue], _state(**live, acl_records=listed), "t").refused
    assert [c for c in allowed if c.target == "brew.ready.v1"] == []
    # The same team's topic needs no listing.
    mine = {"brew.ready.v1": Owner("kitchen/other", "specs/kitchen/other.yaml", "queue")}
    assert [
        c for c in diff([queue], _state(**{**live, "owners": mine}), "t").refused if c.target == "brew.ready.v1"
    ] == []


@pytest.mark.parametrize("group_type", ["consumer", "kmq"])
def test_a_consumer_group_gets_the_members_session_within_the_brokers_bounds(group_type):
    """Under KIP-848 the broker holds the session (45 s by default): a killed member's partitions
    would wait that long, so plan sets the group's to the members' 10 s, or the broker's least.
    kmq's workers are members of a consumer group too."""
    queue = _queue(spec(group_type))
    names = GROUP_NAMES_43 | {kn.CONSUMER_SESSION_TIMEOUT_MS}
    inherited = {queue.group.id: {kn.CONSUMER_SESSION_TIMEOUT_MS: LiveConfig("45000", False)}}
    bounds = {kn.BROKER_CONSUMER_SESSION_MIN: "6000", kn.BROKER_CONSUMER_SESSION_MAX: "60000"}
    plan = diff([queue], _state(group_config_names=names, group_configs=inherited, broker_configs=bounds), "t")
    (change,) = [c for c in plan.changes if c.kind == "group-config"]
    assert (change.target, change.field, change.old, change.new) == (
        queue.group.id,
        kn.CONSUMER_SESSION_TIMEOUT_MS,
        "45000",
        "10000",
    )
    # Kafka's default lower bound is 45 s: the group gets that, pinned, rather than a refused 10 s.
    strict = {**bounds, kn.BROKER_CONSUMER_SESSION_MIN: "45000"}
    plan = diff([queue], _state(group_config_names=names, group_configs=inherited, broker_configs=strict), "t")
    (change,) = [c for c in plan.changes if c.kind == "group-config"]
    assert (change.old, change.new) == ("45000 (inherited)", "45000")
    # Set as wanted: nothing to change.
    held = {queue.group.id: {kn.CONSUMER_SESSION_TIMEOUT_MS: LiveConfig("10000", True)}}
    plan = diff([queue], _state(group_config_names=names, group_configs=held, broker_configs=bounds), "t")
    assert [c for c in plan.changes if c.kind == "group-config"] == []


@pytest.mark.parametrize("group_type", ["consumer", "kmq"])
def test_a_consumer_group_gets_the_members_heartbeat_within_the_brokers_bounds(group_type):
    """A member learns of partitions another released only on its next heartbeat (5 s by default),
    and nobody works them meanwhile: plan sets the group's to 1 s, or the broker's least."""
    queue = _queue(spec(group_type))
    names = GROUP_NAMES_43 | {kn.CONSUMER_SESSION_TIMEOUT_MS, kn.CONSUMER_HEARTBEAT_INTERVAL_MS}
    inherited = {
        queue.group.id: {
            kn.CONSUMER_SESSION_TIMEOUT_MS: LiveConfig("10000", True),
            kn.CONSUMER_HEARTBEAT_INTERVAL_MS: LiveConfig("5000", False),
        }
    }
    lowered = {kn.BROKER_CONSUMER_SESSION_MIN: "10000", kn.BROKER_CONSUMER_HEARTBEAT_MIN: "1000"}
    plan = diff([queue], _state(group_config_names=names, group_configs=inherited, broker_configs=lowered), "t")
    changes = [(c.field, c.old, c.new) for c in plan.changes if c.kind == "group-config"]
    assert changes == [(kn.CONSUMER_HEARTBEAT_INTERVAL_MS, "5000", "1000")]
    # Kafka's default lower bound is 5 s: the group gets that, pinned, rather than a refused 1 s.
    default = {kn.BROKER_CONSUMER_SESSION_MIN: "10000", kn.BROKER_CONSUMER_HEARTBEAT_MIN: "5000"}
    plan = diff([queue], _state(group_config_names=names, group_configs=inherited, broker_configs=default), "t")
    changes = [(c.field, c.old, c.new) for c in plan.changes if c.kind == "group-config"]
    assert changes == [(kn.CONSUMER_HEARTBEAT_INTERVAL_MS, "5000 (inherited)", "5000")]


def test_a_consumer_group_on_a_broker_without_group_configs_plans_nothing_for_it():
    """Brokers before Kafka 4.0 run classic members, which send their own session."""
    queue = _queue(spec("consumer"))
    plan = diff([queue], _state(group_config_names=frozenset()), "t")
    assert [c for c in plan.changes if c.kind == "group-config"] == []
    assert plan.refused == []
