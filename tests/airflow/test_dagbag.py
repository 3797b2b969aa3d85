"""The DAG files as Airflow's own DagBag loads them: one DAG per spec, broken specs as import errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk.definitions.timetables.simple import NullTimetable
from helpers import EXAMPLES, REPO

from queueplane.operators.dag_factory import RECONCILE_DAG_ID, SPECS_DIR_ENV
from queueplane.spec.files import PLATFORM_FILE_NAME

DAGS = REPO / "dags"
TASKS = ["validate", "plan", "apply_topics", "apply_group_configs", "deploy", "wait_until_ready"]


def _bag() -> DagBag:
    return DagBag(DAGS, bundle_path=DAGS)


def _expected_ids(directory: Path) -> dict[str, tuple[Path, dict]]:
    """dag_id -> (spec file, document) for every spec under ``directory``."""
    out = {}
    for path in sorted(directory.rglob("*.yaml")):
        if path.name == PLATFORM_FILE_NAME:
            continue
        doc = yaml.safe_load(path.read_text())
        out[f"queue__{doc['metadata']['team']}__{doc['metadata']['name']}"] = (path.resolve(), doc)
    return out


def _examples_and(tmp_path: Path, monkeypatch, where: str, doc: dict) -> None:
    """The DAG processor's specs folder: the examples (under their platform file) and ``doc`` at ``where``."""
    specs = tmp_path / "specs"
    shutil.copytree(EXAMPLES, specs / "examples")
    (specs / where).parent.mkdir(parents=True, exist_ok=True)
    (specs / where).write_text(yaml.safe_dump(doc, sort_keys=False))
    monkeypatch.setenv(SPECS_DIR_ENV, str(specs))


def test_every_example_spec_is_one_dag_and_nothing_fails_to_import(airflow_db, monkeypatch):
    monkeypatch.delenv(SPECS_DIR_ENV, raising=False)
    bag = _bag()
    assert bag.import_errors == {}
    expected = _expected_ids(REPO / "specs")
    assert set(bag.dag_ids) == {*expected, RECONCILE_DAG_ID}
    for dag_id, (path, doc) in expected.items():
        dag = bag.dags[dag_id]
        meta = doc["metadata"]
        assert dag.owner == meta["team"]
        assert dag.tags == {"queueplane", f"team:{meta['team']}", f"group:{doc['spec']['group']['type']}"}
        assert isinstance(dag.timetable, NullTimetable)  # schedule None: triggered by hand
        assert dict(dag.params) == {"dry_run": False, "deploy": True}
        assert meta["description"] in dag.doc_md
        assert doc["spec"]["topic"]["name"] in dag.doc_md
        assert [t.task_id for t in dag.topological_sort()] == TASKS
        assert {t.spec_path for t in dag.tasks} == {str(path)}
    assert bag.dags[RECONCILE_DAG_ID].timetable.expression == "0 * * * *"  # @hourly


def test_a_broken_spec_is_one_import_error_naming_file_and_field_while_the_others_load(
    airflow_db, monkeypatch, tmp_path
):
    broken = yaml.safe_load((EXAMPLES / "cafe" / "coffee-orders.yaml").read_text())
    broken["metadata"] = {"name": "tea-orders", "team": "tearoom"}
    broken["spec"]["topic"]["name"] = "tearoom.tea-orders.v1"
    broken["spec"]["group"]["id"] = "tearoom-brewers"
    broken["spec"]["group"]["type"] = "shared"
    del broken["spec"]["deadLetter"]
    del broken["spec"]["processing"]["output"]
    _examples_and(tmp_path, monkeypatch, "tearoom/tea-orders.yaml", broken)

    bag = _bag()

    assert list(bag.import_errors) == ["queue_spec_check.py"]
    message = bag.import_errors["queue_spec_check.py"]
    assert "tearoom/tea-orders.yaml: /spec/group/type: must be one of consumer, share, kmq" in message
    assert 'Hint: did you mean "share"?' in message
    assert set(bag.dag_ids) == {*_expected_ids(EXAMPLES), RECONCILE_DAG_ID}
    assert "queue__tearoom__tea-orders" not in bag.dag_ids


def test_a_spec_no_platform_file_governs_is_an_import_error_and_gets_no_dag(airflow_db, monkeypatch, tmp_path):
    """The DAG processor's specs folder, copied without .git: its platform files still govern it,
    and a new team's folder beside the governed one fails closed."""
    stray = yaml.safe_load((EXAMPLES / "payments" / "payment-events.yaml").read_text())
    stray["metadata"]["name"] = "payment-events-copy"
    stray["spec"]["topic"]["name"] = "payments.events-copy.v1"
    stray["spec"]["group"]["id"] = "payments-ledger-copy"
    stray["spec"]["processing"].pop("output", None)
    stray["spec"]["deployment"]["namespace"] = "kube-system"
    _examples_and(tmp_path, monkeypatch, "newteam/events.yaml", stray)

    bag = _bag()

    assert list(bag.import_errors) == ["queue_spec_check.py"]
    message = bag.import_errors["queue_spec_check.py"]
    assert "newteam/events.yaml: /metadata/team: the spec sits outside every platform file's folder" in message
    assert "queue__payments__payment-events-copy" not in bag.dag_ids
    assert set(bag.dag_ids) == {*_expected_ids(EXAMPLES), RECONCILE_DAG_ID}


def test_the_reconcile_schedule_is_configurable(airflow_db, monkeypatch):
    monkeypatch.setenv("QUEUEPLANE_RECONCILE_SCHEDULE", "*/15 * * * *")
    assert _bag().dags[RECONCILE_DAG_ID].timetable.expression == "*/15 * * * *"


def test_the_reconcile_dag_removes_only_once_a_run_approves_and_the_grace_is_the_platforms(airflow_db, monkeypatch):
    monkeypatch.delenv(SPECS_DIR_ENV, raising=False)
    monkeypatch.setenv("QUEUEPLANE_REMOVAL_GRACE", "6h")
    reconcile = _bag().dags[RECONCILE_DAG_ID]
    assert [t.task_id for t in reconcile.topological_sort()] == ["plan_all", "remove_queues", "check_drift"]
    assert dict(reconcile.params) == {"approve_removal": False, "force_delete_dlq": False}
    assert reconcile.get_task("remove_queues").plan_task_id == "plan_all"
    assert {reconcile.get_task(t).removal_grace_s for t in ("plan_all", "check_drift")} == {6 * 3600}
    assert reconcile.get_task("check_drift").trigger_rule == "all_done", "a dry run's skip still checks drift"


def test_a_removed_spec_takes_its_dag_with_it(airflow_db, monkeypatch, tmp_path):
    extra = yaml.safe_load((EXAMPLES / "payments" / "payment-events.yaml").read_text())
    extra["metadata"]["name"] = "refunds"
    extra["spec"]["topic"]["name"] = "payments.refunds.v1"
    extra["spec"]["group"]["id"] = "payments-refunds"
    extra["spec"]["processing"].pop("output", None)
    _examples_and(tmp_path, monkeypatch, "examples/payments/refunds.yaml", extra)
    before = _bag()
    assert before.import_errors == {}
    assert "queue__payments__refunds" in before.dag_ids

    (tmp_path / "specs" / "examples" / "payments" / "refunds.yaml").unlink()
    after = _bag()

    assert after.import_errors == {}
    assert set(after.dag_ids) == set(before.dag_ids) - {"queue__payments__refunds"}


def test_parsing_writes_nothing_and_a_tasks_parse_builds_only_its_dag(airflow_db, monkeypatch, tmp_path):
    monkeypatch.delenv(SPECS_DIR_ENV, raising=False)
    monkeypatch.delenv("QUEUEPLANE_HOME", raising=False)  # state would go to the working directory
    monkeypatch.chdir(tmp_path)
    everything = _bag()
    assert everything.import_errors == {}
    queues = {d for d in everything.dag_ids if d != RECONCILE_DAG_ID}
    assert len(queues) == 3
    assert list(tmp_path.iterdir()) == [], "parsing wrote into the DAG processor's working directory"

    # A task's parse: Airflow names the DAG in the parsing context, and only that queue's DAG is built.
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "queue__cafe__coffee-orders")
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_TASK_ID", "plan")
    one = _bag()
    assert one.import_errors == {}
    assert {d for d in one.dag_ids if d != RECONCILE_DAG_ID} == {"queue__cafe__coffee-orders"}
