"""The ACLs a spec's principals get, and which of them plan creates, deletes or leaves alone."""

from __future__ import annotations

from specs_factory import dump, spec

from queueplane.kafka.cluster import LiveState
from queueplane.provision.acls import Acl, acl_changes, wanted_acls
from queueplane.provision.plan import diff
from queueplane.spec.rules import check_text


def _queue(doc):
    return check_text(dump(doc)).raise_if_invalid()[0]


def _with_access(kind: str, **access):
    doc = spec(kind)
    doc["spec"]["access"] = access
    return _queue(doc)


def test_a_share_worker_reads_its_topic_and_group_and_writes_its_dlq_output_and_own_topic_only():
    queue = _with_access("share", worker="User:brewer", producers=["User:till", "User:app"])
    got = {a.describe() for a in wanted_acls(queue)}
    assert got == {
        "User:brewer READ TOPIC:brew.orders.v1",
        "User:brewer READ GROUP:kitchen-service",
        "User:brewer READ GROUP:queueplane-spark:kitchen-service:*",
        "User:brewer WRITE TOPIC:brew.orders.v1.dlq",
        "User:brewer WRITE TOPIC:brew.ready.v1",
        "User:brewer WRITE TOPIC:brew.orders.v1",  # parks what the DLQ refuses
        "User:brewer DESCRIBE_CONFIGS CLUSTER:kafka-cluster",
        # the max.message.bytes of every topic it writes, which size its producers
        "User:brewer DESCRIBE_CONFIGS TOPIC:brew.orders.v1",
        "User:brewer DESCRIBE_CONFIGS TOPIC:brew.orders.v1.dlq",
        "User:brewer DESCRIBE_CONFIGS TOPIC:brew.ready.v1",
        "User:till WRITE TOPIC:brew.orders.v1",
        "User:app WRITE TOPIC:brew.orders.v1",
    }


def test_exactly_once_adds_the_workers_transactional_ids_and_kmq_its_markers_and_tracker():
    eos = {a.describe() for a in wanted_acls(_with_access("consumer", worker="User:ledger"))}
    assert "User:ledger WRITE TRANSACTIONAL_ID:queueplane:pay-ledger:*" in eos
    kmq = {a.describe() for a in wanted_acls(_with_access("kmq", worker="User:mailer"))}
    assert {
        "User:mailer READ TOPIC:mail.jobs.v1.markers",
        "User:mailer WRITE TOPIC:mail.jobs.v1.markers",
        "User:mailer READ GROUP:queueplane-kmq-tracker-mailer",
        "User:mailer DESCRIBE_CONFIGS TOPIC:mail.jobs.v1.markers",
    } <= kmq
    assert not any("TRANSACTIONAL_ID" in a for a in kmq)


def test_every_worker_may_park_in_its_own_topic():
    """A dead letter the DLQ refuses is written back to the queue's topic, whatever the group type."""
    for kind, worker, topic in (("consumer", "User:ledger", "pay.events.v1"), ("kmq", "User:mailer", "mail.jobs.v1")):
        assert f"{worker} WRITE TOPIC:{topic}" in {a.describe() for a in wanted_acls(_with_access(kind, worker=worker))}


def test_no_access_wants_no_acls():
    assert wanted_acls(_queue(spec("share"))) == []


A = Acl("User:w", "TOPIC", "t", "READ")
B = Acl("User:w", "TOPIC", "d", "WRITE")
C = Acl("User:p", "TOPIC", "t", "WRITE")


def test_only_recorded_acls_are_deleted_and_an_acl_granted_by_someone_else_is_never_recorded():
    # B was granted by hand before the spec wanted it: kept, never recorded as queueplane's.
    changes = acl_changes([A, B], live={B, C}, recorded=set())
    assert (changes.create, changes.delete, changes.record) == ([A], [], [A])
    # C is no longer wanted: deleted only because queueplane made it.
    changes = acl_changes([A], live={A, B, C}, recorded={A, C})
    assert (changes.create, changes.delete, changes.record) == ([], [C], [A])
    # A recorded ACL deleted by hand is drift: created again.
    changes = acl_changes([A], live=set(), recorded={A})
    assert (changes.create, changes.drifted, changes.record) == ([A], [A], [A])


def _state(acls, records=None) -> LiveState:
    return LiveState("c", [1], {}, acls=acls, acl_records=records or {})


def test_plan_shows_creates_deletes_and_drift_and_refuses_without_an_authorizer():
    queue = _with_access("share", worker="User:brewer")
    wanted = wanted_acls(queue)
    gone = Acl("User:old-till", "TOPIC", "brew.orders.v1", "WRITE")
    live = {(a.principal, a.resource, a.name, a.operation, a.prefixed) for a in [*wanted[1:], gone]}
    records = {"kitchen/brew-orders": [a.as_dict() for a in [wanted[0], gone]]}
    plan = diff([queue], _state(live, records), "t")
    lines = [(c.symbol, c.target, c.describe()) for c in plan.changes if c.kind == "acl"]
    assert lines == [
        ("+", wanted[0].describe(), "made by queueplane, deleted since (drift)"),
        ("-", gone.describe(), "no longer in the spec"),
    ]
    assert set(plan.acls["kitchen/brew-orders"].record) == {wanted[0]}

    (refused,) = [c for c in diff([queue], _state(None), "t").refused if c.kind == "acl"]
    assert refused.target == "kitchen/brew-orders" and "no authorizer" in refused.reason


def test_no_groups_transactional_id_prefix_covers_another_groups_ids():
    """Group ids may hold dots: the prefix of group g must not start the ids of group g.x."""
    from queueplane.kafka.names import transactional_id_prefix

    groups = ["pay-ledger", "pay-ledger.x", "pay-ledger-x", "pay", "pay.ledger"]
    for group in groups:
        for other in groups:
            if other != group:
                assert not transactional_id_prefix(other).startswith(transactional_id_prefix(group)), (group, other)
