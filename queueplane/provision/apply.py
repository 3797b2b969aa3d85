"""Applying a plan: everything is checked by the cluster first, then changed step by step.

A validate-only pass of every request comes first, so a change the cluster would refuse
stops the apply before anything moved. If a step still fails, the report lists exactly
what was applied, what failed and what was not attempted.

Removals (provision/removal.py) come after everything else, so a renamed queue's new owner
records are written before the old queue's are forgotten, in the order that drains first:
uninstall the worker's release, revoke the ACLs, delete the groups and their configs, delete
the topics their policy lets go, and forget the owner records last.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka.admin import NewPartitions, NewTopic, ResourceType

from queueplane.deploy.kube_access import KubeAccess
from queueplane.errors import QueueplaneError
from queueplane.kafka.cluster import AclKey, Cluster
from queueplane.provision.acls import Acl
from queueplane.provision.plan import Change, Plan, brief

Step = tuple[str, list[Change], Callable[[Cluster, bool], dict[str, str | None]]]
RECORD_QUEUES = "record queues"  # the one step that runs without lines of its own (see _queue_records)
# How long DeleteGroups is asked again after a release was uninstalled, while the stopped
# worker's members leave the group (a consumer's session is queueplane's 10 s, KIP-848's 45 s at most).
MEMBERS_LEAVE_S = 60.0


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


def _step_requests(plan: Plan, kube: KubeAccess | None = None) -> list[Step]:
    """The plan as ordered steps; each step is one batched admin request."""
    own = [c for c in plan.changes if not c.removes]
    creates = [c for c in own if c.action == "create" and c.kind == "topic"]
    # Topics taken over as they are, or from a queue being removed (a rename): claimed, not created.
    adopts = [c for c in own if c.action == "adopt" or (c.kind == "topic" and c.field == "owner")]
    partitions = [c for c in own if c.kind == "partitions" and c.action == "change"]
    topic_configs = [c for c in own if c.kind == "topic-config" and c.action == "change"]
    group_configs = [c for c in own if c.kind == "group-config" and c.action == "change"]
    group_claims = [c for c in own if c.kind == "group" and (c.action == "create" or c.field == "owner")]
    acls = [c for c in own if c.kind == "acl" and c.action in ("create", "delete")]
    queue_records = [c for c in own if c.kind == "queue" and c.action == "change"]

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

        refused = unrecorded(cluster.record_acls(records(True), plan.queue_fields), "recording the queue's ACLs failed")
        if refused:
            return refused
        acls = {_key(a): a for a in (*create, *delete)}
        changed = cluster.change_acls([_key(a) for a in create], [_key(a) for a in delete])
        outcomes = {acls[key].describe(): error for key, error in changed.items()}
        if any(outcomes.values()):
            return outcomes
        recorded = cluster.record_acls(records(False), plan.queue_fields)
        return {**outcomes, **unrecorded(recorded, "applied, but not recorded")}

    def record_queues(cluster: Cluster, validate_only: bool) -> dict[str, str | None]:
        """The record of every queue with a change (its ACLs as planned, set_acls rewrites them): what
        a removal reads once the spec is gone. First, like the other owner records."""
        if validate_only:
            return {}
        queues = sorted(q for q in plan.record_queues if q in plan.queue_fields)
        return cluster.record_acls({q: plan.queue_fields[q]["acls"] for q in queues}, plan.queue_fields)

    # Config changes go first: a broker publishes metadata changes in order, and one that
    # creates many partitions takes long to publish (it creates their logs), so configs
    # queued behind it would stay invisible for tens of seconds.
    return [
        (RECORD_QUEUES, queue_records, record_queues),
        ("adopt topics", adopts, adopt_topics),
        ("claim groups", group_claims, claim_groups),
        ("set group configs", group_configs, set_group_configs),
        ("set topic configs", topic_configs, set_topic_configs),
        ("create topics", creates, new_topics),
        ("add partitions", partitions, more_partitions),
        # Last: ACLs name topics and groups that now exist.
        ("set ACLs", acls, set_acls),
        *_removal_steps(plan, kube),
    ]


def _needed(step: Step, plan: Plan) -> bool:
    """Whether a step runs: it has lines, or it writes the records of queues whose other changes
    are the lines (a queue's record goes with any change of it, shown or not)."""
    return bool(step[1]) or (step[0] == RECORD_QUEUES and bool(plan.record_queues))


def _removal_steps(plan: Plan, kube: KubeAccess | None) -> list[Step]:
    """The removals' steps, in the order that drains first (see the module's docstring)."""
    removing = [c for c in plan.changes if c.removes and c.applicable]
    of = {kind: [c for c in removing if c.kind == kind] for kind in ("release", "acl", "group", "group-config")}
    uninstalled = [c for c in removing if c.kind in ("release", "queue-object")]
    topics = [c for c in removing if c.kind == "topic"]
    records = [c for c in removing if c.kind == "records"]
    removals = plan.removals

    def uninstall(cluster: Cluster, validate_only: bool) -> dict[str, str | None]:
        """Each release, and with it the Queue objects of its removed queues (the chart's objects)."""
        from queueplane.deploy import release

        outcomes: dict[tuple[str, str], str | None] = {}
        for removal in removals.values():
            if removal.release is None:
                continue
            namespace, name = removal.release
            problem = release.uninstall_problem(namespace, name, removal.application, kube)
            if problem or validate_only or kube is None:
                outcomes[removal.release] = problem
                continue
            outcomes[removal.release] = release.uninstall(namespace, name, kube)
        by_target = {f"{namespace}/{name}": error for (namespace, name), error in outcomes.items()}
        for removal in removals.values():
            if removal.queue_object is not None and removal.queue_object[1] in outcomes:
                by_target[removal.queue_object[0]] = outcomes[removal.queue_object[1]]
        return by_target

    def revoke(cluster: Cluster, validate_only: bool) -> dict[str, str | None]:
        acls = {_key(a): a for r in removals.values() for a in r.acls}
        if validate_only:
            return {} if cluster.has_authorizer() else {"acls": "the cluster has no authorizer"}
        return {acls[key].describe(): error for key, error in cluster.change_acls([], list(acls)).items()}

    def delete_groups(cluster: Cluster, validate_only: bool) -> dict[str, str | None]:
        if validate_only:
            return {}
        wait_s = MEMBERS_LEAVE_S if of["release"] else 0.0  # a worker just stopped: its members leave
        return cluster.delete_groups([g for r in removals.values() for g in r.groups], wait_s)

    def delete_group_configs(cluster: Cluster, validate_only: bool) -> dict[str, str | None]:
        configs = {g: names for r in removals.values() for g, names in r.group_configs.items()}
        return cluster.delete_group_configs(configs, validate_only)

    def delete_topics(cluster: Cluster, validate_only: bool) -> dict[str, str | None]:
        if validate_only:
            return {}
        return cluster.delete_topics([t for r in removals.values() for t in r.topics])

    def forget(cluster: Cluster, validate_only: bool) -> dict[str, str | None]:
        """Last: a removal that failed before here is found again by the next plan."""
        if validate_only:
            return {}
        outcomes: dict[str, str | None] = {}
        for queue, removal in sorted(removals.items()):
            written = cluster.forget(removal.forget)
            if removal.keep_record is not None:
                kept = removal.keep_record
                written.update(cluster.record_acls({queue: kept["acls"]}, {queue: kept}))
            errors = [f"{key}: {error}" for key, error in written.items() if error]
            outcomes[queue] = "; ".join(errors) or None
        return outcomes

    return [
        ("uninstall releases", uninstalled, uninstall),
        ("revoke ACLs", of["acl"], revoke),
        ("delete groups", of["group"], delete_groups),
        ("delete group configs", of["group-config"], delete_group_configs),
        ("delete topics", topics, delete_topics),
        ("forget owner records", records, forget),
    ]


def _key(acl: Acl) -> AclKey:
    return (acl.principal, acl.resource, acl.name, acl.operation, acl.prefixed)


def apply_plan(
    cluster: Cluster,
    plan: Plan,
    on_step: Callable[[str, int], None] = lambda _s, _n: None,
    kube: KubeAccess | None = None,
) -> ApplyReport:
    """Make the cluster match the plan; raises with a report of what was and was not applied.
    ``kube``: the Kubernetes cluster whose releases the plan's removals uninstall."""
    plan.raise_if_refused()
    steps = [s for s in _step_requests(plan, kube) if _needed(s, plan)]
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
        shown = {c.target for c in changes}
        for target, error in sorted(failed_targets.items()):  # a queue's record written without a line of its own
            if target not in shown:
                report.failed.append((Change("change", "records", target, "", reason=title), error))
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
