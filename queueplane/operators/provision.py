"""Validate, plan and apply as Airflow tasks: each one call into queueplane.steps.

The plan task's XCom is the saved plan (provision/saved_plan.py): the plan as JSON, with
digests of its spec files and of the live state it read. Each apply task applies its part of
exactly that plan: it reads the spec and the cluster again and goes ahead only when its part of
the live state and its changes are still the saved ones. A task retried or cleared after the
cluster moved (a partial apply, a hand change) fails without retrying and changes nothing;
triggering the DAG again plans anew. An apply operator used without a plan task plans itself.

The removal of queues whose specs are gone (provision/removal.py) is applied by its own task,
the reconcile DAG's, and only when its run was approved; otherwise that task shows the
removals and ends skipped.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException
from rich.console import Console

from queueplane.errors import EXIT_FAILED, QueueplaneError
from queueplane.kafka.target import KafkaTarget
from queueplane.operators.hooks import KAFKA_CONN_ID, KUBERNETES_CONN_ID, kafka_target, kube_access, kubernetes_hook
from queueplane.provision import saved_plan, steps
from queueplane.provision.apply import ApplyReport
from queueplane.provision.plan import GROUP_KINDS, REMOVAL_KINDS, TOPIC_KINDS, Plan, RemovalOptions, brief
from queueplane.spec.model import QueueSpec


def switched_on(value: bool | str) -> bool:
    """A templated switch (``"{{ params.dry_run }}"``) as it renders: a bool, or its text.

    The operators take the switch as ``dry_run`` (the trigger form's name for it) and keep it as
    ``dry_run_switch``: an attribute ``dry_run`` would hide ``BaseOperator.dry_run()``.
    """
    return str(value).lower() == "true"


@contextmanager
def task_errors() -> Iterator[None]:
    """A queueplane error ends the task with its one-paragraph message.

    Bad input (a spec, a connection, a refused plan) fails at once; a cluster that failed
    may be retried.
    """
    try:
        yield
    except QueueplaneError as exc:
        kind = AirflowException if exc.exit_code == EXIT_FAILED else AirflowFailException
        raise kind(str(exc)) from None


def plan_text(plan: Plan) -> str:
    """The plan as `queueplane plan` prints it, for the task log."""
    from queueplane.provision.plan_text import render_plan

    buffer = io.StringIO()
    render_plan(plan, Console(file=buffer, width=160, color_system=None, highlight=False, emoji=False))
    return buffer.getvalue()


class _SpecOperator(BaseOperator):
    """A task about the specs under ``spec_path`` (a file or a directory) and one Kafka connection.

    ``spec_path`` is not a templated field: a team's file or folder name is data, and Jinja
    would run whatever ``{{ ... }}`` it holds.
    """

    template_fields: Sequence[str] = ("kafka_conn_id",)
    ui_color = "#e8f1fb"

    def __init__(self, *, spec_path: str, kafka_conn_id: str = KAFKA_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec_path = spec_path
        self.kafka_conn_id = kafka_conn_id


class ValidateSpecOperator(_SpecOperator):
    """Check the spec against the schema, the rules, and the connected broker's share-group bounds."""

    def execute(self, context: Any) -> list[dict[str, str]]:
        with task_errors():
            target = kafka_target(self.kafka_conn_id)
            queues = steps.validate([self.spec_path], target)
        for q in queues:
            self.log.info("ok %s %s/%s (%s group %s)", q.source, q.team, q.name, q.group.type, q.group.id)
        return [{"file": q.source, "team": q.team, "name": q.name, "group": q.group.type} for q in queues]


class PlanQueueOperator(_SpecOperator):
    """Diff the specs against the cluster; the plan goes to the log and to XCom.

    With ``fail_on_changes`` (the reconcile DAG's drift check) any change is drift, a removal
    too: the task fails and lists it, so an alert fires when the cluster no longer matches git.
    A queue whose spec is gone from ``spec_path`` is removed as ``removal_grace_s`` and
    ``force_delete_dlq`` (templated) say.
    """

    template_fields: Sequence[str] = (*_SpecOperator.template_fields, "force_delete_dlq_switch")

    def __init__(
        self,
        *,
        fail_on_changes: bool = False,
        removal_grace_s: int = RemovalOptions.grace_s,
        force_delete_dlq: bool | str = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.fail_on_changes = fail_on_changes
        self.removal_grace_s = removal_grace_s
        self.force_delete_dlq_switch = force_delete_dlq

    def execute(self, context: Any) -> dict[str, Any]:
        options = RemovalOptions(self.removal_grace_s, switched_on(self.force_delete_dlq_switch))
        with task_errors():
            planned = steps.plan([self.spec_path], kafka_target(self.kafka_conn_id), options)
            plan = planned.plan
            self.log.info("Plan:\n%s", plan_text(plan))
            plan.raise_if_refused()
        if self.fail_on_changes and plan.changes:
            raise AirflowFailException(
                f"drift: the cluster differs from {len(plan.specs)} spec(s) in {len(plan.changes)} place(s): "
                + brief(plan.changes, limit=20)
            )
        return saved_plan.saved(planned, f"the plan of task {self.task_id}").as_dict()


class _ApplyOperator(_SpecOperator):
    """Apply one part of the plan task's saved plan (``plan_task_id``; None: plan here);
    ``dry_run`` shows that part and ends skipped."""

    template_fields: Sequence[str] = (*_SpecOperator.template_fields, "dry_run_switch")
    kinds: frozenset[str] = frozenset()
    part = ""

    def __init__(self, *, dry_run: bool | str = False, plan_task_id: str | None = "plan", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dry_run_switch = dry_run
        self.plan_task_id = plan_task_id

    def execute(self, context: Any) -> dict[str, object]:
        with task_errors():
            target = kafka_target(self.kafka_conn_id)
            planned = self._planned(context, target)
            part = planned.plan.only(self.kinds)
            self.log.info("Plan (%s):\n%s", self.part, plan_text(part))
            part.raise_if_refused()
            dry = switched_on(self.dry_run_switch)
            if dry and part.changes:
                raise AirflowSkipException(f"dry run: {len(part.changes)} {self.part} change(s) not applied")
            if part.changes:

                def on_step(title: str, count: int) -> None:
                    self.log.info("%s%s", title, f" ({count})" if count else "")

                applied = steps.apply(planned, on_step, kinds=self.kinds)
                self.log.info("Applied %d %s change(s).", len(applied.applied), self.part)
                report = applied.as_dict()
            else:
                self.log.info("No %s changes.", self.part)
                report = ApplyReport().as_dict()
        if not dry:  # a dry run provisions nothing, so it announces nothing
            self._publish(context, planned.queues, target)
        return report

    def _planned(self, context: Any, target: KafkaTarget) -> steps.Planned:
        """The plan task's saved plan, made again and checked (PlanStale if it moved); without a
        plan task, a plan made here."""
        if self.plan_task_id is None:
            return steps.plan([self.spec_path], target)
        document = context["ti"].xcom_pull(task_ids=self.plan_task_id)
        if document is None:
            raise AirflowFailException(
                f"task {self.plan_task_id} left no plan to apply: run the DAG from its plan task"
            )
        saved = saved_plan.parse(document, f"the plan of task {self.plan_task_id}")
        return saved_plan.replan(saved, target, kinds=self.kinds)

    def _publish(self, context: Any, queues: list[QueueSpec], target: KafkaTarget) -> None:
        """Through each AssetAlias outlet, an asset event for every queue's topic in the Kafka provider's
        URI form (kafka://SERVER/TOPIC): the server is the connection's, known only at run time."""
        from airflow.providers.apache.kafka.assets.kafka import create_asset
        from airflow.sdk import AssetAlias

        for outlet in self.outlets:
            if isinstance(outlet, AssetAlias):
                for queue in queues:
                    asset = create_asset(server=target.first_server, topic=queue.topic.name)
                    context["outlet_events"][outlet].add(asset, extra={"team": queue.team, "queue": queue.name})
                    self.log.info("Published %s through %s", asset.uri, outlet.name)


class ApplyTopicsOperator(_ApplyOperator):
    """Create the queue, dead-letter, markers and output topics; add partitions; set topic configs."""

    kinds = TOPIC_KINDS
    part = "topic"


class ApplyGroupConfigsOperator(_ApplyOperator):
    """Set the share group's GROUP configs (lock duration, delivery limit, records in flight)."""

    kinds = GROUP_KINDS
    part = "group config"


class RemoveQueuesOperator(_ApplyOperator):
    """Apply the removals of the plan task's saved plan: the release, ACLs, groups, topics (as their
    policy says) and owner records of the queues whose specs are gone.

    ``approve`` (templated: the reconcile DAG's ``approve_removal`` param) must render true: the
    run's plan task showed the removals in its log first (the dry run), and this task applies
    exactly that plan or fails when the cluster moved since. Without the approval it shows them
    and ends skipped. A release is uninstalled through ``kubernetes_conn_id``; without that
    connection a removal that must uninstall one fails before anything is removed.
    """

    template_fields: Sequence[str] = (*_SpecOperator.template_fields, "approve_switch", "kubernetes_conn_id")
    kinds = REMOVAL_KINDS
    part = "removal"

    def __init__(
        self, *, approve: bool | str = False, kubernetes_conn_id: str = KUBERNETES_CONN_ID, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.approve_switch = approve
        self.kubernetes_conn_id = kubernetes_conn_id

    def execute(self, context: Any) -> dict[str, object]:
        with task_errors():
            planned = self._planned(context, kafka_target(self.kafka_conn_id))
            part = planned.plan.only(self.kinds)
            self.log.info("Removals:\n%s", plan_text(part))
            part.raise_if_refused()
            if not part.actionable:
                waiting = f" ({len(part.pending)} line(s) kept or waiting)" if part.pending else ""
                self.log.info("Nothing to remove now%s.", waiting)
                return ApplyReport().as_dict()
            if not switched_on(self.approve_switch):
                raise AirflowSkipException(
                    f"dry run: {len(part.actionable)} removal change(s) shown above, not applied; trigger "
                    f"{self.dag_id} with approve_removal: true to apply exactly the plan its run shows"
                )

            def on_step(title: str, count: int) -> None:
                self.log.info("%s%s", title, f" ({count})" if count else "")

            hook = kubernetes_hook(self.kubernetes_conn_id)
            with kube_access(hook) if hook is not None else nullcontext(None) as kube:
                applied = steps.apply(planned, on_step, kinds=self.kinds, kube=kube)
            self.log.info("Applied %d removal change(s).", len(applied.applied))
        return applied.as_dict()
