"""One Airflow DAG per queue spec, and the reconcile DAG over all of them.

The DAG files in dags/ call these functions at parse time. Parsing stays offline: specs
are checked against the schema and the rules that need no broker (the validate task
checks the broker's bounds at run time). A spec that fails is left out of the queue DAGs
and reported by the spec-check DAG file as an import error, so one team's typo never
hides another team's DAG. Parsing writes nothing (no spec cache in the DAG processor's
working directory), and a task's parse, whose parsing context names its DAG, builds that one.

A spec removed from the folder takes its DAG with it: the DAG file no longer defines it, and
Airflow's DAG processor marks it stale. What the spec made on the cluster is removed by the
reconcile DAG, once a person approves the removal its dry run showed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, AssetAlias, BaseOperator, Param, TriggerRule, get_parsing_context

from queueplane.errors import Problem, SpecInvalid, UsageError
from queueplane.operators import (
    ApplyGroupConfigsOperator,
    ApplyTopicsOperator,
    HelmDeployOperator,
    PlanQueueOperator,
    QueueReadySensor,
    RemoveQueuesOperator,
    SparkDriverReadySensor,
    SparkSubmitDeployOperator,
    ValidateSpecOperator,
)
from queueplane.operators.hooks import KAFKA_CONN_ID
from queueplane.provision.plan import RemovalOptions
from queueplane.provision.steps import check_specs
from queueplane.spec import durations
from queueplane.spec.model import QueueSpec
from queueplane.spec.rules import ShareBounds

SPECS_DIR_ENV = "QUEUEPLANE_SPECS_DIR"
RECONCILE_SCHEDULE_ENV = "QUEUEPLANE_RECONCILE_SCHEDULE"
REMOVAL_GRACE_ENV = "QUEUEPLANE_REMOVAL_GRACE"  # the platform's, like the schedule: not a trigger's choice
RECONCILE_DAG_ID = "queueplane__reconcile"
START = datetime(2026, 1, 1)


def specs_dir(default: Path) -> Path:
    """Where the specs live: $QUEUEPLANE_SPECS_DIR, else ``default`` (the repository's specs/)."""
    return Path(os.environ.get(SPECS_DIR_ENV) or default).resolve()


def dag_id(queue: QueueSpec) -> str:
    return f"queue__{queue.team}__{queue.name}"


def provisioned_alias(queue: QueueSpec) -> str:
    """The AssetAlias through which a queue's DAG publishes its topic's asset when apply succeeds.

    Schedule a downstream DAG on ``Asset("kafka://SERVER/TOPIC")`` (the Kafka provider's form,
    SERVER the first of the connection's bootstrap servers) or on this alias.
    """
    return f"queueplane/{queue.team}/{queue.name}"


def checked_specs(root: Path) -> tuple[list[QueueSpec], list[Problem]]:
    """The specs under ``root`` with no problem at all, and every problem of the others."""
    try:
        # root: where the DAG processor's specs were copied without .git, their platform files still govern
        loaded = check_specs([str(root)], persist=False, root=str(root)).with_bounds(ShareBounds())
    except UsageError as exc:  # no spec files at all: nothing to build, nothing broken
        return [], [Problem(str(root), "", str(exc))]
    broken = {p.file for p in loaded.problems}
    return [q for q in loaded.queues if q.source not in broken], loaded.problems


def raise_spec_problems(root: Path) -> None:
    """Raise every problem of the specs under ``root`` (an import error in Airflow, one line per problem)."""
    _, problems = checked_specs(root)
    if problems:
        raise SpecInvalid(problems)


_HOW = {"kubernetes": "with Helm", "spark-submit": "with spark-submit"}


def _doc_md(queue: QueueSpec) -> str:
    source = Path(queue.source).read_text(encoding="utf-8")
    rows = [
        ("spec", f"`{queue.source}`"),
        ("group", f"{queue.group.type} `{queue.group.id}`"),
        ("topic", f"`{queue.topic.name}` ({queue.topic.partitions} partitions)"),
        ("dead-letter topic", f"`{queue.dead_letter.name}`"),
        ("handler", f"`{queue.handler}`"),
        ("executors", f"{queue.min_executors}..{queue.max_executors}, target lag {queue.target_lag_seconds}s"),
        ("deploy", f"`{queue.namespace}` (Helm)" if queue.deploy_target == "kubernetes" else "spark-submit"),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return (
        f"# {queue.team}/{queue.name}\n\n{queue.description}\n\n| | |\n|---|---|\n{table}\n\n"
        "Trigger to validate, plan and apply the Kafka side, then deploy the worker "
        f"({_HOW[queue.deploy_target]}) and wait until it keeps up. `dry_run` shows the plan and applies "
        "nothing; `deploy` off stops after Kafka. Nothing else is chosen at trigger time: cluster values and "
        "spark-submit settings are the platform's Airflow Variables.\n\n"
        f"```yaml\n{source}\n```\n"
    )


def trigger_form(queue: QueueSpec) -> dict[str, Param]:
    """What whoever may trigger the queue's DAG chooses: only what the queue's team may, each a closed schema.

    Cluster values and spark-submit settings are not here: they are the platform's (the Airflow
    Variables queueplane_cluster_values and queueplane_spark_submit), and the deploy task refuses
    a run whose conf carries anything this form does not offer.
    """
    return {
        "dry_run": Param(False, type="boolean", description="Show the plan, change nothing."),
        "deploy": Param(
            True, type="boolean", description=f"Deploy the worker ({_HOW[queue.deploy_target]}) after Kafka."
        ),
    }


def queue_dag(queue: QueueSpec, kafka_conn_id: str = KAFKA_CONN_ID, siblings: Sequence[QueueSpec] = ()) -> DAG:
    """validate → plan → apply topics → apply group configs → deploy → wait until ready.

    The deploy is a Helm release (``deployment.target: kubernetes``) or a spark-submit to a
    standalone master (``spark-submit``); the readiness check follows the target. A Helm
    release is the queue's worker application: ``siblings``, the other queues of that
    application, are deployed with it.
    """
    spec = str(Path(queue.source).resolve())
    form = trigger_form(queue)
    with DAG(
        dag_id=dag_id(queue),
        description=queue.description or f"Kafka queue {queue.team}/{queue.name}",
        doc_md=_doc_md(queue),
        schedule=None,
        start_date=START,
        catchup=False,
        tags=["queueplane", f"team:{queue.team}", f"group:{queue.group.type}"],
        default_args={"owner": queue.team, "retries": 1, "retry_delay": timedelta(seconds=30)},
        params=form,
        render_template_as_native_obj=True,
        max_active_runs=1,
    ) as dag:
        common = {"spec_path": spec, "kafka_conn_id": kafka_conn_id}
        validate = ValidateSpecOperator(task_id="validate", **common)
        plan = PlanQueueOperator(task_id="plan", **common)
        topics = ApplyTopicsOperator(task_id="apply_topics", dry_run="{{ params.dry_run }}", **common)
        groups = ApplyGroupConfigsOperator(
            task_id="apply_group_configs",
            dry_run="{{ params.dry_run }}",
            outlets=[AssetAlias(provisioned_alias(queue))],  # the topic's kafka:// asset, once applied
            **common,
        )
        switches = {"deploy": "{{ params.deploy }}", "dry_run": "{{ params.dry_run }}"}
        if queue.deploy_target == "spark-submit":
            deploy: BaseOperator = SparkSubmitDeployOperator(
                task_id="deploy",
                run_choices=form,
                trigger_rule=TriggerRule.NONE_FAILED,  # a dry run skips the applies but still shows the submission
                **common,
                **switches,
            )
            ready: BaseOperator = SparkDriverReadySensor(task_id="wait_until_ready", **common)
        else:
            deploy = HelmDeployOperator(
                task_id="deploy",
                spec_path=spec,
                application_specs=[str(Path(q.source).resolve()) for q in siblings],
                run_choices=form,
                trigger_rule=TriggerRule.NONE_FAILED,  # a dry run skips the applies but still renders
                **switches,
            )
            ready = QueueReadySensor(task_id="wait_until_ready", **common)
        validate >> plan >> topics >> groups >> deploy >> ready
    return dag


def queue_dags(root: Path) -> dict[str, DAG]:
    """One DAG per valid spec under ``root``, by dag_id; only the one a task runs in, when Airflow says which."""
    queues, _ = checked_specs(root)
    wanted = get_parsing_context().dag_id
    return {
        dag_id(q): queue_dag(q, siblings=[s for s in queues if s.application == q.application and s is not q])
        for q in queues
        if wanted is None or dag_id(q) == wanted
    }


def removal_grace_s() -> int:
    """The removal grace: $QUEUEPLANE_REMOVAL_GRACE (a duration), else a day."""
    text = os.environ.get(REMOVAL_GRACE_ENV)
    if not text:
        return RemovalOptions.grace_s
    try:
        return int(durations.parse_seconds(text))
    except ValueError as exc:
        raise UsageError(f"${REMOVAL_GRACE_ENV}: {exc}") from None


def reconcile_dag(root: Path) -> DAG:
    """plan_all → remove_queues → check_drift, on a schedule.

    plan_all plans every spec, and the removal of every queue whose spec is gone (its log is the
    dry run). remove_queues applies exactly those removals, and only in a run triggered with
    ``approve_removal`` on; otherwise it ends skipped. check_drift plans again and fails, listing
    each difference, when the cluster still does not match the specs (a removal waiting for its
    approval, its drain or its grace among them).
    """
    with DAG(
        dag_id=RECONCILE_DAG_ID,
        description="Plan every queue spec against the cluster; remove what removed specs made, once approved",
        doc_md=(
            f"Plans every spec under `{root}` against `{KAFKA_CONN_ID}`, and the removal of every queue whose "
            "spec is gone (found by the cluster's owner records): `plan_all`'s log shows it, a dry run. "
            "`remove_queues` applies exactly those removals (the release uninstalled first, then the ACLs, the "
            "group, the topics as each spec's `deletionPolicy` said, the owner records) only in a run triggered "
            "with `approve_removal` on, and fails if the cluster moved since `plan_all`; otherwise it ends "
            "skipped. `check_drift` fails, listing each difference, when the cluster still does not match the "
            "specs (someone changed a config by hand, a spec was merged but not applied, a removal waits). "
            "Trigger the queue's DAG to converge a spec's queue."
        ),
        schedule=os.environ.get(RECONCILE_SCHEDULE_ENV, "@hourly"),
        start_date=START,
        catchup=False,
        tags=["queueplane", "reconcile"],
        default_args={"owner": "queueplane"},
        params={
            "approve_removal": Param(
                False,
                type="boolean",
                description="Apply the removals this run's plan_all shows. Off: show them only (a dry run).",
            ),
            "force_delete_dlq": Param(
                False,
                type="boolean",
                description="Also delete a removed queue's dead-letter topic that still holds records "
                "(deletionPolicy: delete).",
            ),
        },
        render_template_as_native_obj=True,
        max_active_runs=1,
    ) as dag:
        plan = PlanQueueOperator(
            task_id="plan_all",
            spec_path=str(root),
            removal_grace_s=removal_grace_s(),
            force_delete_dlq="{{ params.force_delete_dlq }}",
        )
        remove = RemoveQueuesOperator(
            task_id="remove_queues",
            spec_path=str(root),
            plan_task_id="plan_all",
            approve="{{ params.approve_removal }}",
        )
        drift = PlanQueueOperator(
            task_id="check_drift",
            spec_path=str(root),
            fail_on_changes=True,
            removal_grace_s=removal_grace_s(),
            force_delete_dlq="{{ params.force_delete_dlq }}",
            trigger_rule=TriggerRule.ALL_DONE,  # after a dry run (skipped) too
        )
        plan >> remove >> drift
    return dag
