"""Planning a removal is a pure function of the specs and a cluster snapshot: these snapshots are
what the owner records and the removed queue's topics and groups look like on a real broker
(tests/integration/test_removal.py applies them there)."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from specs_factory import dump, set_path, spec

from queueplane.kafka.cluster import GroupActivity, LiveState, LiveTopic, TopicContents
from queueplane.kafka.owners import Owner
from queueplane.provision.acls import Acl, wanted_acls
from queueplane.provision.plan import GROUP_KINDS, REMOVAL_KINDS, TOPIC_KINDS, RemovalOptions
from queueplane.provision.plan_text import render_plan
from queueplane.provision.removal import orphans, plan_with_removals
from queueplane.spec.rules import check_text

NOW_MS = 10_000_000_000
DAY_MS = 24 * 3600 * 1000
OPTIONS = RemovalOptions(grace_s=3600, now_ms=NOW_MS)
WORKER, TILL = "User:worker", "User:till"


def _queue(doc, source: str):
    return check_text(dump(doc), source).raise_if_invalid()[0]


def _consumer_doc(policy: str | None = None, target: str = "kubernetes"):
    doc = spec("consumer", name="pay-events", group="pay-ledger", topic="pay.events.v1")
    doc["spec"]["processing"]["exactlyOnce"] = False
    doc["spec"]["access"] = {"worker": WORKER, "producers": [TILL]}
    if policy:
        doc["spec"]["deletionPolicy"] = policy
    if target != "kubernetes":
        set_path(doc, "spec/deployment/target", target)
    return doc


def _applied(tmp_path: Path, doc, **record) -> tuple[LiveState, object]:
    """The cluster as apply left it for ``doc`` (written at tmp_path/specs/pay.yaml), spec since removed."""
    folder = tmp_path / "specs"
    folder.mkdir(exist_ok=True)
    source = str(folder / "pay.yaml")
    queue = _queue(doc, source)
    owner = queue.owner
    fields = {
        "spec": source,
        "specKey": None,
        "deletionPolicy": queue.deletion_policy,
        "groupType": queue.group.type,
        "application": queue.application,
        "namespace": queue.namespace,
        "target": queue.deploy_target,
        "released": False,
        "acls": [a.as_dict() for a in wanted_acls(queue)],
        **record,
    }
    live = LiveState(
        "c",
        [1],
        {},
        group_config_names=frozenset({"consumer.session.timeout.ms"}),
        topics={"pay.events.v1": LiveTopic(3, 1), "pay.events.v1.dlq": LiveTopic(3, 1)},
        owners={
            "pay.events.v1": Owner(owner, source, "queue"),
            "pay.events.v1.dlq": Owner(owner, source, "dead-letter"),
        },
        group_owners={"pay-ledger": Owner(owner, source, "group")},
        acl_records={owner: fields["acls"]},
        queue_records={owner: fields},
        acls={(a.principal, a.resource, a.name, a.operation, a.prefixed) for a in wanted_acls(queue)},
        removed_topics={
            "pay.events.v1": TopicContents(10, NOW_MS - DAY_MS),
            "pay.events.v1.dlq": TopicContents(0, None),
        },
        removed_groups={"pay-ledger": GroupActivity(True, 0, 0, ("consumer.session.timeout.ms",))},
    )
    return live, queue


def _plan(queues, live, tmp_path, options=OPTIONS):
    return plan_with_removals(queues, live, "test", [str(tmp_path / "specs")], options)


def _lines(plan) -> list[tuple[str, str, str]]:
    return [(c.symbol, c.kind, c.target) for c in plan.changes]


def test_a_removed_spec_plans_the_release_acls_group_and_records_going_and_its_topics_kept(tmp_path):
    live, _ = _applied(tmp_path, _consumer_doc())
    plan = _plan([], live, tmp_path)
    assert _lines(plan) == [
        ("-", "release", "payments/pay-events"),
        ("-", "queue-object", "payments/pay-events"),
        *[("-", "acl", a.describe()) for a in sorted(Acl(**a) for a in live.acl_records["payments/pay-events"])],
        ("-", "group", "pay-ledger"),
        ("-", "group-config", "pay-ledger"),
        ("=", "topic", "pay.events.v1"),
        ("=", "topic", "pay.events.v1.dlq"),
        ("-", "records", "payments/pay-events"),
    ]
    assert all(c.removes == "payments/pay-events" for c in plan.changes)
    producer = next(c for c in plan.changes if c.target == f"{TILL} WRITE TOPIC:pay.events.v1")
    assert producer.action == "delete", "the producers' grants go too"
    removal = plan.removals["payments/pay-events"]
    assert removal.release == ("payments", "pay-events") and removal.application == "payments/pay-events"
    assert removal.groups == ["pay-ledger"] and removal.group_configs == {"pay-ledger": ["consumer.session.timeout.ms"]}
    assert removal.topics == [], "deletionPolicy retain keeps the topics"
    assert sorted(removal.forget) == [
        "acls:payments/pay-events",
        "group:pay-ledger",
        "pay.events.v1",
        "pay.events.v1.dlq",
    ]
    # A part of its own: the DAG's topic and group tasks never apply it; counted as changes.
    assert plan.only(TOPIC_KINDS).changes == [] and plan.only(GROUP_KINDS).changes == []
    assert plan.only(REMOVAL_KINDS).changes == plan.changes
    assert plan.counts()["delete"] == len(plan.changes) - 2 and plan.counts()["retain"] == 2
    retained = next(c for c in plan.changes if c.target == "pay.events.v1")
    assert "spec.topic.adopt: true" in retained.reason


def test_only_queues_recorded_under_the_planned_paths_are_orphans(tmp_path):
    live, queue = _applied(tmp_path, _consumer_doc())
    assert list(orphans([], live, [str(tmp_path / "specs")])) == ["payments/pay-events"]
    assert list(orphans([], live, [str(tmp_path / "specs" / "pay.yaml")])) == ["payments/pay-events"]
    (tmp_path / "elsewhere").mkdir()
    assert orphans([], live, [str(tmp_path / "elsewhere")]) == {}
    assert orphans([queue], live, [str(tmp_path / "specs")]) == {}, "its spec is still planned"


def test_delete_topics_wait_for_the_worker_then_until_caught_up_and_the_grace(tmp_path):
    live, _ = _applied(tmp_path, _consumer_doc("delete"))
    live.removed_groups["pay-ledger"] = GroupActivity(True, 2, 5, ())
    plan = _plan([], live, tmp_path)
    # The release goes now (the worker drains); the topics, and the group whose offsets say
    # whether they are caught up, wait.
    assert ("-", "release", "payments/pay-events") in _lines(plan)
    assert [(s, k) for s, k, t in _lines(plan) if k in ("topic", "group")] == [
        (">", "group"),
        (">", "topic"),
        (">", "topic"),
    ]
    topic = next(c for c in plan.changes if c.target == "pay.events.v1")
    assert "the group has members" in topic.reason and "uninstalled first" in topic.reason
    removal = plan.removals["payments/pay-events"]
    assert removal.keep_record is not None and removal.keep_record["released"] is True
    assert removal.keep_record["acls"] == [], "revoked now"
    assert removal.forget == [] and removal.groups == [] and removal.topics == []

    # The next plan: the release is gone, the worker left; lag remains.
    live.queue_records["payments/pay-events"] = removal.keep_record
    live.acl_records["payments/pay-events"] = []
    live.acls = set()
    live.removed_groups["pay-ledger"] = GroupActivity(True, 0, 5, ("consumer.session.timeout.ms",))
    plan = _plan([], live, tmp_path)
    assert [s for s, k, t in _lines(plan)] == [">", ">", ">"], _lines(plan)
    assert "lag 5" in next(c for c in plan.changes if c.target == "pay.events.v1").reason
    assert plan.actionable == [], "nothing to apply: the record already says so"

    # Drained: lag 0, the newest record a day old (the grace is an hour): everything goes.
    live.removed_groups["pay-ledger"] = GroupActivity(True, 0, 0, ("consumer.session.timeout.ms",))
    plan = _plan([], live, tmp_path)
    assert _lines(plan) == [
        ("-", "group", "pay-ledger"),
        ("-", "group-config", "pay-ledger"),
        ("-", "topic", "pay.events.v1"),
        ("-", "topic", "pay.events.v1.dlq"),
        ("-", "records", "payments/pay-events"),
    ]
    assert plan.removals["payments/pay-events"].topics == ["pay.events.v1", "pay.events.v1.dlq"]

    # A record newer than the grace holds its topic back.
    live.removed_topics["pay.events.v1"] = TopicContents(10, NOW_MS - 60_000)
    plan = _plan([], live, tmp_path)
    topic = next(c for c in plan.changes if c.target == "pay.events.v1")
    newest = datetime.fromtimestamp((NOW_MS - 60_000 + 3600_000) / 1000, UTC)
    assert (
        topic.reason == f"waits for the removal grace (1h after its newest record): until {newest:%Y-%m-%dT%H:%M:%SZ}"
    )
    assert topic.symbol == ">"
    later = _plan([], live, tmp_path, RemovalOptions(3600, False, NOW_MS + 1000))
    assert later.changes == _plan([], live, tmp_path).changes, "what a plan says does not move with the clock"


def test_a_dead_letter_topic_with_records_goes_only_with_the_force(tmp_path):
    live, _ = _applied(tmp_path, _consumer_doc("delete"), released=True)
    live.removed_topics["pay.events.v1.dlq"] = TopicContents(3, NOW_MS - DAY_MS)
    held = next(c for c in _plan([], live, tmp_path).changes if c.target == "pay.events.v1.dlq")
    assert held.symbol == ">" and "holds 3 record(s)" in held.reason and "--force-delete-dlq" in held.reason
    forced = _plan([], live, tmp_path, RemovalOptions(3600, True, NOW_MS))
    assert ("-", "topic", "pay.events.v1.dlq") in _lines(forced)


def test_a_worker_queueplane_cannot_stop_makes_the_whole_removal_wait(tmp_path):
    live, _ = _applied(tmp_path, _consumer_doc(target="spark-submit"))
    live.removed_groups["pay-ledger"] = GroupActivity(True, 1, 0, ())
    plan = _plan([], live, tmp_path)
    assert {c.symbol for c in plan.changes} <= {">", "="}
    first = plan.changes[0]
    assert (first.kind, first.target) == ("queue", "payments/pay-events")
    assert "1 member(s): stop the worker first (kill its Spark driver)" in first.reason
    assert plan.actionable == [] and plan.removals["payments/pay-events"].waits_for_worker
    assert "release" not in {c.kind for c in plan.changes}, "spark-submit has no release"

    live.removed_groups["pay-ledger"] = GroupActivity(True, 0, 0, ())
    stopped = _plan([], live, tmp_path)
    assert ("-", "group", "pay-ledger") in _lines(stopped) and stopped.changes[0].kind == "acl"


def test_a_renamed_queue_takes_over_its_topics_group_and_grants_and_the_rest_is_removed(tmp_path):
    live, _ = _applied(tmp_path, _consumer_doc())
    renamed_doc = _consumer_doc()
    renamed_doc["metadata"]["name"] = "pay-ledger-events"
    renamed = _queue(renamed_doc, str(tmp_path / "specs" / "ledger.yaml"))
    plan = _plan([renamed], live, tmp_path)
    own = [(c.symbol, c.kind, c.target, c.describe()) for c in plan.changes if not c.removes]
    assert (
        "~",
        "topic",
        "pay.events.v1",
        "owner: queue payments/pay-events -> payments/pay-ledger-events (renamed)",
    ) in own
    assert (
        "~",
        "group",
        "pay-ledger",
        "owner: queue payments/pay-events -> payments/pay-ledger-events (renamed)",
    ) in own
    (note,) = [c for c in plan.changes if c.kind == "queue"]
    assert note.target == "payments/pay-ledger-events" and "renamed from queue payments/pay-events" in note.reason
    assert not [c for c in own if c[1] == "acl"], "the grants pass to the new queue as they are"
    assert plan.acls["payments/pay-ledger-events"].record, "and into its record"
    removed = [(c.symbol, c.kind, c.target) for c in plan.changes if c.removes]
    # Its release goes (the new name is a new application); nothing it handed over is touched.
    assert removed == [
        ("-", "release", "payments/pay-events"),
        ("-", "queue-object", "payments/pay-events"),
        ("-", "records", "payments/pay-events"),
    ]
    assert plan.removals["payments/pay-events"].forget == ["acls:payments/pay-events"]
    assert plan.removals["payments/pay-events"].renamed_to == ["payments/pay-ledger-events"]
    text = io.StringIO()
    render_plan(plan, Console(file=text, width=200, color_system=None))
    assert "(removed: queue payments/pay-events, renamed to payments/pay-ledger-events)" in text.getvalue()


def test_a_release_that_runs_other_queues_stays_and_grants_another_queue_recorded_stay(tmp_path):
    live, _ = _applied(tmp_path, _consumer_doc())
    sibling = dict(live.queue_records["payments/pay-events"], spec="/elsewhere/other.yaml")
    shared = Acl(WORKER, "CLUSTER", "kafka-cluster", "DESCRIBE_CONFIGS")
    sibling["acls"] = [shared.as_dict()]
    live.queue_records["payments/other"] = sibling
    live.acl_records["payments/other"] = sibling["acls"]
    live.removed_groups["pay-ledger"] = GroupActivity(True, 1, 0, ())
    plan = _plan([], live, tmp_path)
    first = plan.changes[0]
    assert first.symbol == ">" and "release payments/pay-events still runs it with payments/other" in first.reason
    assert plan.actionable == []

    live.removed_groups["pay-ledger"] = GroupActivity(True, 0, 0, ())
    plan = _plan([], live, tmp_path)
    assert "release" not in {c.kind for c in plan.changes}
    revoked = {c.target for c in plan.changes if c.kind == "acl"}
    assert shared.describe() not in revoked and f"{TILL} WRITE TOPIC:pay.events.v1" in revoked


def test_what_a_removal_reads_gone_since_is_only_forgotten(tmp_path):
    live, _ = _applied(tmp_path, _consumer_doc("delete"), released=True)
    live.removed_topics.clear()  # someone deleted the topics by hand
    live.removed_groups["pay-ledger"] = GroupActivity(False, 0, 0, ())
    live.acls = set()
    plan = _plan([], live, tmp_path)
    assert _lines(plan) == [("-", "records", "payments/pay-events")]
    assert sorted(plan.removals["payments/pay-events"].forget) == [
        "acls:payments/pay-events",
        "group:pay-ledger",
        "pay.events.v1",
        "pay.events.v1.dlq",
    ]
