"""A spec's DAG run with dag.test() against the real local broker (deploy off)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from airflow.models.xcom import XComModel
from airflow.sdk.exceptions import AirflowFailException
from airflow.utils.session import create_session
from airflow_support import kafka_connection
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from helpers import tagged_examples, unique_tag

from queueplane.kafka import clients
from queueplane.operators.dag_factory import queue_dags, reconcile_dag

pytestmark = pytest.mark.kafka

COFFEE = "queue__cafe__coffee-orders"


@pytest.fixture
def specs(tmp_path: Path, kafka, airflow_db, monkeypatch) -> Iterator[tuple[Path, str]]:
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", kafka_connection(kafka))
    tag = unique_tag()
    tagged_examples(tmp_path / "specs", tag)
    yield tmp_path / "specs", tag


def _states(run) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def _xcom(run, task_id: str) -> object:
    with create_session() as session:
        row = session.query(XComModel).filter_by(dag_id=run.dag_id, run_id=run.run_id, task_id=task_id).one()
        return XComModel.deserialize_value(row)


def _admin(kafka) -> AdminClient:
    return clients.admin(kafka.settings)


def _config(admin: AdminClient, kind: ResourceType, name: str) -> dict[str, str]:
    resource = ConfigResource(kind, name)
    return {k: e.value for k, e in admin.describe_configs([resource])[resource].result().items()}


def test_spec_dag_provisions_kafka_and_a_second_run_changes_nothing(specs, kafka):
    root, tag = specs
    dag = queue_dags(root)[COFFEE]

    first = dag.test(run_conf={"deploy": False})

    assert first.state == "success", _states(first)
    assert _states(first) == {
        "validate": "success",
        "plan": "success",
        "apply_topics": "success",
        "apply_group_configs": "success",
        "deploy": "skipped",
        "wait_until_ready": "skipped",
    }
    planned = _xcom(first, "plan")["plan"]
    # Three topics and the group's claim.
    assert planned["summary"] == {
        "create": 4,
        "adopt": 0,
        "change": 5,
        "delete": 0,
        "refuse": 0,
        "retain": 0,
        "wait": 0,
    }
    admin = _admin(kafka)
    topics = admin.list_topics(timeout=10).topics
    for name in (f"{tag}.cafe.coffee-orders.v1", f"{tag}.cafe.coffee-orders.v1.dlq", f"{tag}.cafe.drinks-ready.v1"):
        assert name in topics
    assert len(topics[f"{tag}.cafe.coffee-orders.v1"].partitions) == 6
    assert _config(admin, ResourceType.TOPIC, f"{tag}.cafe.coffee-orders.v1")["retention.ms"] == "604800000"
    group = _config(admin, ResourceType.GROUP, f"{tag}-cafe-baristas")
    assert group["share.record.lock.duration.ms"] == "30000"
    assert group["share.delivery.count.limit"] == "7"  # deliveryLimit 5 plus the reserve deliveries
    assert group["share.isolation.level"] == "read_committed"
    assert len(_xcom(first, "apply_topics")["applied"]) == 3
    assert len(_xcom(first, "apply_group_configs")["applied"]) == 6  # the group's claim and its five configs

    # The topic's asset in the Kafka provider's URI form, published once apply succeeded.
    uri = f"kafka://{kafka.bootstrap}/{tag}.cafe.coffee-orders.v1"
    assert _asset_events(uri) == [{"team": "cafe", "queue": "coffee-orders"}]

    second = dag.test(run_conf={"deploy": False})

    assert second.state == "success", _states(second)
    nothing = {"create": 0, "adopt": 0, "change": 0, "delete": 0, "refuse": 0, "retain": 0, "wait": 0}
    assert _xcom(second, "plan")["plan"]["summary"] == nothing
    assert _xcom(second, "apply_topics")["applied"] == []
    assert _xcom(second, "apply_group_configs")["applied"] == []
    assert len(_asset_events(uri)) == 2, "a run that finds the queue provisioned says so again"


def _asset_events(uri: str) -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel

    with create_session() as session:
        events = (
            session.query(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .filter(AssetModel.uri == uri)
        )
        return [e.extra for e in events.all()]


def test_dry_run_plans_and_applies_nothing(specs, kafka):
    root, tag = specs
    run = queue_dags(root)["queue__payments__payment-events"].test(run_conf={"dry_run": True, "deploy": False})
    assert run.state == "success", _states(run)
    assert _states(run)["apply_topics"] == "skipped"
    assert _xcom(run, "plan")["plan"]["summary"]["create"] > 0
    assert f"{tag}.payments.events.v1" not in _admin(kafka).list_topics(timeout=10).topics
    assert _asset_events(f"kafka://{kafka.bootstrap}/{tag}.payments.events.v1") == [], "a dry run announces nothing"


def test_reconcile_passes_when_the_cluster_matches_and_fails_on_drift(specs, kafka):
    root, tag = specs
    for dag in queue_dags(root).values():
        assert dag.test(run_conf={"deploy": False}).state == "success"
    reconcile = reconcile_dag(root)
    assert reconcile.test().state == "success"

    admin = _admin(kafka)
    resource = ConfigResource(
        ResourceType.TOPIC,
        f"{tag}.cafe.coffee-orders.v1",
        incremental_configs=[ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)],
    )
    admin.incremental_alter_configs([resource])[resource].result()

    drifted = reconcile.test()
    assert drifted.state == "failed"
    assert _states(drifted) == {"plan_all": "success", "remove_queues": "success", "check_drift": "failed"}
    drift = rf"drift: .*topic-config {tag}\.cafe\.coffee-orders\.v1 retention\.ms: 3600000 -> 604800000"
    with pytest.raises(AirflowFailException, match=drift):
        reconcile.get_task("check_drift").execute(context={})


def test_reconcile_removes_a_removed_specs_queue_only_in_a_run_that_approves_it(specs, kafka):
    """The scheduled run is the dry run: it shows the removal, applies nothing and reports drift.
    A run triggered with approve_removal applies exactly what its plan_all showed."""
    from queueplane.kafka.owners import read_records
    from queueplane.provision import steps

    root, tag = specs
    refunds = root / "payments" / "refunds.yaml"
    refunds.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "queueplane.io/v1",
                "kind": "Queue",
                "metadata": {"name": "refunds", "team": "payments"},
                "spec": {
                    "topic": {"name": f"payments.{tag}.refunds.v1", "partitions": 1},
                    "group": {"type": "consumer", "id": f"payments-{tag}-refunds"},
                    "processing": {"handler": "payments.ledger:post"},
                    "deployment": {"target": "spark-submit"},
                },
            }
        )
    )
    steps.apply(steps.plan([str(root)], kafka))  # every queue provisioned: no drift but the removal
    refunds.unlink()
    topic, queue = f"payments.{tag}.refunds.v1", "payments/refunds"
    reconcile = reconcile_dag(root)

    dry = reconcile.test()
    assert _states(dry) == {"plan_all": "success", "remove_queues": "skipped", "check_drift": "failed"}
    shown = [c for c in _xcom(dry, "plan_all")["plan"]["changes"] if c["removes"] == queue]
    assert ("delete", "records", queue) in {(c["action"], c["kind"], c["target"]) for c in shown}
    assert ("retain", "topic", topic) in {(c["action"], c["kind"], c["target"]) for c in shown}
    assert f"acls:{queue}" in read_records(kafka) and f"group:payments-{tag}-refunds" in read_records(kafka)

    approved = reconcile.test(run_conf={"approve_removal": True})
    assert approved.state == "success", _states(approved)
    assert _states(approved) == {"plan_all": "success", "remove_queues": "success", "check_drift": "success"}
    records = read_records(kafka)
    assert not [k for k, v in records.items() if k == f"acls:{queue}" or v.get("queue") == queue]
    assert topic in _admin(kafka).list_topics(timeout=10).topics, "deletionPolicy retain keeps the topic"


def test_a_spec_dag_provisions_a_secured_cluster_through_the_kafka_connection(
    tmp_path, secure_kafka, airflow_db, monkeypatch
):
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", kafka_connection(secure_kafka.admin))
    tag = unique_tag()
    tagged_examples(tmp_path / "specs", tag)

    run = queue_dags(tmp_path / "specs")[COFFEE].test(run_conf={"deploy": False})

    assert run.state == "success", _states(run)
    assert _xcom(run, "plan")["plan"]["cluster"].startswith(secure_kafka.admin.bootstrap)
    topics = _admin(secure_kafka.admin).list_topics(timeout=10).topics
    assert {f"{tag}.cafe.coffee-orders.v1", f"{tag}.cafe.coffee-orders.v1.dlq"} <= set(topics)


def test_the_apply_tasks_apply_the_plan_tasks_plan_or_fail_if_the_cluster_moved(specs, kafka):
    """The apply tasks take the plan task's saved plan through XCom. With no change between plan
    and apply, each task applies its part of that plan. A managed config set by hand between
    them (which a plan made at apply time would simply set back) makes the topic task fail
    without retrying, and nothing is applied: what was approved is not what would be applied."""
    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.sdk import DAG

    from queueplane.operators.dag_factory import START
    from queueplane.operators.provision import ApplyGroupConfigsOperator, ApplyTopicsOperator, PlanQueueOperator

    root, tag = specs
    spec = str(root / "payments" / "payment-events.yaml")
    topic = f"{tag}.payments.events.v1"

    def run(between) -> object:
        # dag.test() runs only DAGs its bundle (the repository's dags/) holds: this one takes the
        # payments queue's DAG id, with a task between its plan and its applies.
        with DAG("queue__payments__payment-events", schedule=None, start_date=START) as dag:
            common = {"spec_path": spec}
            plan = PlanQueueOperator(task_id="plan", **common)
            meanwhile = PythonOperator(task_id="meanwhile", python_callable=between)
            topics = ApplyTopicsOperator(task_id="apply_topics", **common)
            groups = ApplyGroupConfigsOperator(task_id="apply_group_configs", **common)
            plan >> meanwhile >> topics >> groups
        return dag.test()

    kept = run(lambda: None)
    assert kept.state == "success", _states(kept)
    planned = {c["target"] for c in _xcom(kept, "plan")["plan"]["changes"] if c["kind"] == "topic"}
    assert {topic, f"{topic}.dlq"} <= planned
    assert planned <= set(_admin(kafka).list_topics(timeout=10).topics)
    admin = _admin(kafka)
    wanted = _config(admin, ResourceType.TOPIC, topic)["max.message.bytes"]

    def set_by_hand() -> None:
        resource = ConfigResource(
            ResourceType.TOPIC,
            topic,
            incremental_configs=[ConfigEntry("max.message.bytes", "1000", incremental_operation=AlterConfigOpType.SET)],
        )
        admin.incremental_alter_configs([resource])[resource].result()

    moved = run(set_by_hand)
    assert _xcom(moved, "plan")["plan"]["changes"] == [], "planned with the queue provisioned: nothing to do"
    assert _states(moved)["apply_topics"] == "failed"
    assert _states(moved)["apply_group_configs"] == "upstream_failed"
    assert _config(admin, ResourceType.TOPIC, topic)["max.message.bytes"] == "1000", "nothing was applied"
    assert wanted != "1000"
