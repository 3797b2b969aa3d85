"""Applying a plan: everything is checked by the cluster first, then changed step by step.

A validate-only pass of every request comes first, so a change the cluster would refuse
stops the apply before anything moved. If a step still fails, the report lists exactly
what was applied, what failed and what was not attempted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka.admin import NewPartitions, NewTopic, ResourceType

from queueplane.errors import QueueplaneError
from queueplane.kafka.cluster import AclKey, Cluster
from queueplane.provision.acls import Acl
from queueplane.provision.plan import Change, Plan, brief


@dataclass
class ApplyReport:
    applied: list[Change] = field(default_factory=list)
    failed: list[tuple[Change, str]] = field(default_factory=list)
    not_attempted: list[Change] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        def line(c: Change) -> str:
            return f"{c.symbol} {c.kind} {c.target} {c.describe()}".rstrip()

        return {
            "applied": [line(c) for c in self.applied],
            "failed": [{"change": line(c), "error": e} for c, e in self.failed],
            "not_attempted": [line(c) for c in self.not_attempted],
        }


class ApplyFailed(QueueplaneError):
    def __init__(self, message: str, report: ApplyReport):
        self.report = report
        super().__init__(message)


def _step_requests(plan: Plan) -> list[tuple[str, list[Change], Callable[[Cluster, bool], dict[str, str | None]]]]:
    """The plan as ordered steps; each step is one batched admin request."""
    creates = [c for c in plan.changes if c.action == "create" and c.kind == "topic"]
    adopts = [c for c in plan.changes if c.action == "adopt"]
    partitions = [c for c in plan.changes if c.kind == "partitions" and c.action == "change"]
    topic_configs = [c for c in plan.changes if c.kind == "topic-config" and c.action == "change"]
    group_configs = [c for c in plan.changes if c.kind == "group-config" and c.action == "change"]
    group_claims = [c for c in plan.changes if c.kind == "group" and c.action == "create"]
    acls = [c for c in plan.changes if c.kind == "acl" and c.action in ("create", "delete")]

    def claim(cluster: Cluster, changes: list[Change], validate_only: bool) -> dict[str, str | None]:
        """Owner records first: a topic is never created or changed before its queue's claim on it
        is on the cluster, so a failed apply leaves no topic that plan would call unowned."""
        if validate_only:
            return {}
        return cluster.record_owners({c.target: plan.claims[c.target] for c in changes if c.target in plan.claims})

    def adopt_topics(cluster: Cluster, validate_only: bool) -> dict[str, str | None]:
        return claim(cluster, adopts, validate_only)

    def new_topics(cluster: Cluster, validate_only: bool) -> dict[str, str | None]:
        unclaimed = {t: e for t, e in claim(cluster, creates, validate_only).items() if e}
        if unclaimed:
            return {c.target: unclaimed.get(c.target, "not attempted: another claim failed") for c in creates}
        requests = []
        for change in creates:
            topic = plan.new_topics[change.target]
            requests.append(
                NewTopic(
                    topic.name,
                    num_partitions=topic.partitions,
                    replication_factor=topic.replication_factor or -1,
                    config=dict(topic.config),
                )
            )
        return cluster.create_topics(requests, validate_only)

    def more_partitions(cluster: Cluster, validate_only: bool) -> dict[str, str | None]:
        return cluster.create_partitions([NewPartitions(c.target, int(c.new or 0)) for c in partitions], validate_only)

    def grouped(changes: list[Change]) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for c in changes:
            out.setdefault(c.target, {})[c.field] = c.new or ""
        return out

    def set_topic_configs(cluster: Cluster, validate_only: bool) -> dict[str, str | None]:
        return cluster.set_configs(ResourceType.TOPIC, grouped(topic_configs), validate_only)

    def claim_groups(cluster: Cluster, validate_only: bool) -> dict[str, str | None]:
        """Group ids are claimed before their configs or ACLs change: a failed apply leaves no
        group queueplane touched that plan would call unclaimed."""
        if validate_only:
            return {}
        return cluster.record_group_owners({c.target: plan.group_claims[c.target] for c in group_claims})

    def set_group_configs(cluster: Cluster, validate_only: bool) -> dict[str, str | None]:
        return cluster.set_configs(ResourceType.GROUP, grouped(group_configs), validate_only)

    def set_acls(cluster: Cluster, validate_only: bool) -> dict[str, str | None]:
        """Record first what will exist (the final record and what is still to delete), then
        create and delete, then record what is left: a failure midway leaves no ACL that
        queueplane made unrecorded, so the next plan finishes the job."""
        create = [a for c in plan.acls.values() for a in c.create]
        delete = [a for c in plan.acls.values() for a in c.delete]
        if validate_only:  # Kafka has no validate-only mode for ACLs: check there is an authorizer
            return {} if cluster.has_authorizer() else {"acls": "the cluster has no authorizer"}

        def records(with_deleted: bool) -> dict[str, list[dict[str, object]]]:
            return {
                queue: [a.as_dict() for a in sorted({*c.record, *(c.delete if with_deleted else [])})]
                for queue, c in plan.acls.items()
            }

        def unrecorded(failed: dict[str, str | None], when: str) -> dict[str, str | None]:
            """Each failed queue's ACL changes, with the reason."""
            return {
                a.describe(): f"{when}: {error}"
                for queue, error in failed.items()
                if error
                for a in (*plan.acls[queue].create, *plan.acls[queue].delete)
            }

        refused = unrecorded(cluster.record_acls(records(True)), "recording the queue's ACLs failed")
        if refused:
            return refused
        acls = {_key(a): a for a in (*create, *delete)}
        changed = cluster.change_acls([_key(a) for a in create], [_key(a) for a in delete])
        outcomes = {acls[key].describe(): error for key, error in changed.items()}
        if any(outcomes.values()):
            return outcomes
        return {**outcomes, **unrecorded(cluster.record_acls(records(False)), "applied, but not recorded")}

    # Config changes go first: a broker publishes metadata changes in order, and one that
    # creates many partitions takes long to publish (it creates their logs), so configs
    # queued behind it would stay invisible for tens of seconds.
    return [
        ("adopt topics", adopts, adopt_topics),
        ("claim groups", group_claims, claim_groups),
        ("set group configs", group_configs, set_group_configs),
        ("set topic configs", topic_configs, set_topic_configs),
        ("create topics", creates, new_topics),
        ("add partitions", partitions, more_partitions),
        # Last: ACLs name topics and groups that now exist.
        ("set ACLs", acls, set_acls),
    ]


def _key(acl: Acl) -> AclKey:
    return (acl.principal, acl.resource, acl.name, acl.operation, acl.prefixed)


def apply_plan(cluster: Cluster, plan: Plan, on_step: Callable[[str, int], None] = lambda _s, _n: None) -> ApplyReport:
    """Make the cluster match the plan; raises with a report of what was and was not applied."""
    plan.raise_if_refused()
    steps = [s for s in _step_requests(plan) if s[1]]
    rejected: list[str] = []
    for title, _changes, run in steps:
        for target, error in run(cluster, True).items():
            if error:
                rejected.append(f"{title} {target}: {error}")
        on_step(f"checked: {title}", 0)
    if rejected:
        more = f" and {len(rejected) - 5} more" if len(rejected) > 5 else ""
        raise ApplyFailed(
            "the cluster rejected the plan in a dry run; nothing was applied: " + "; ".join(rejected[:5]) + more,
            ApplyReport(not_attempted=plan.actionable),
        )
    report = ApplyReport()
    for index, (title, changes, run) in enumerate(steps):
        outcomes = run(cluster, False)
        failed_targets = {t: e for t, e in outcomes.items() if e}
        for change in changes:
            if change.target in failed_targets:
                report.failed.append((change, failed_targets[change.target]))
            else:
                report.applied.append(change)
        on_step(title, len(changes))
        if failed_targets:
            for _, later, _ in steps[index + 1 :]:
                report.not_attempted.extend(later)
            raise ApplyFailed(_failure_message(report), report)
    return report


def _failure_message(report: ApplyReport) -> str:
    parts = [f"apply stopped: {len(report.failed)} change(s) failed:"]
    parts += [f"{c.kind} {c.target} {c.describe()}: {e.rstrip('.')};" for c, e in report.failed[:5]]
    parts.append(f"applied {len(report.applied)}: {brief(report.applied) or 'nothing'}.")
    if report.not_attempted:
        parts.append(f"Not attempted {len(report.not_attempted)}: {brief(report.not_attempted)}.")
    return " ".join(parts)
