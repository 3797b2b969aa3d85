"""Removal: what goes when a spec is gone, found from the cluster's owner records.

A spec removed from git leaves nothing in the checkout that says what it made; apply recorded
it on the cluster (kafka/owners.py): each topic it created or adopted, its group id, and the
queue's record (its ACLs, its spec's place, ``deletionPolicy``, group type and worker). A queue
whose records name a spec under the planned paths, and that no planned spec declares, is an
orphan. Plan removes everything its records say it made, one line each, in the order apply
removes it:

1. the worker. A Kubernetes deploy's Helm release is uninstalled (``helm uninstall --wait``:
   the worker drains on SIGTERM, see run/driver/termination.py, and the Queue object goes with the
   release). A worker queueplane cannot stop (a spark-submit driver, a local ``queueplane run``,
   a release that still runs other queues of its application) makes the whole removal wait
   (``>``) while the group has members: stop the worker first.
2. the ACLs apply made for the queue, the producers' WRITE grants too, except those a planned
   spec wants or another queue's record holds (a worker principal's CLUSTER grant is shared).
3. the group: its committed offsets or share state (DeleteGroups), then its GROUP configs
   (an IncrementalAlterConfigs DELETE: they outlive the group, and would apply to a new group of
   the same id).
4. its topics, as ``deletionPolicy`` says. ``retain`` (the default) keeps them with their data;
   they are no longer owned, so a spec takes them over with ``adopt: true``. ``delete`` deletes
   them once the queue is caught up (no members, lag 0) and its newest record is older than the
   removal grace, a dead-letter topic holding records only with ``--force-delete-dlq``. Until
   then they wait, and so does the group, whose offsets say whether the queue is caught up.
5. the owner records, last, so a removal that stops midway is found again by the next plan. A
   removal that waits keeps the queue's record (noting an uninstalled release) and the records
   of what it still has to remove.

A planned spec that claims an orphan's topic or group id takes it over (a rename): those pass
to it with the ACLs it wants, and the rest of the orphan is removed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from queueplane.kafka import names as kn
from queueplane.kafka.cluster import GroupActivity, LiveState, TopicContents
from queueplane.kafka.owners import ACLS_KEY, GROUP_KEY, QueueRecord, recorded_under
from queueplane.provision.acls import Acl, wanted_acls
from queueplane.provision.plan import Action, Change, Kind, Plan, Removal, RemovalOptions, diff, recorded_acls
from queueplane.spec.durations import format_ms
from queueplane.spec.model import QueueSpec

_ADOPT_FIELD = {"queue": "topic", "dead-letter": "deadLetter", "markers": "markers"}


@dataclass(frozen=True)
class Orphan:
    """A queue being removed, as its owner records describe it."""

    record: QueueRecord
    spec: str  # the removed spec, as the plan names it (its path in the repository when known)
    topics: Mapping[str, str]  # topic -> role
    groups: tuple[str, ...]

    @property
    def queue_topic(self) -> str | None:
        return next((name for name, role in self.topics.items() if role == "queue"), None)

    def all_groups(self) -> list[str]:
        """Its recorded group ids, and a kmq queue's tracker group (named after its group)."""
        extra = [kn.kmq_tracker_group(g) for g in self.groups] if self.record.group_type == "kmq" else []
        return [*self.groups, *extra]


def orphans(queues: list[QueueSpec], live: LiveState, paths: Iterable[str]) -> dict[str, Orphan]:
    """The queues whose records name a spec under ``paths`` that no spec in ``queues`` declares."""
    paths = list(paths)
    planned = {q.owner for q in queues}
    topics: dict[str, dict[str, str]] = {}
    groups: dict[str, list[str]] = {}
    specs: dict[str, set[str]] = {}
    for name, owner in live.owners.items():
        topics.setdefault(owner.queue, {})[name] = owner.role
        specs.setdefault(owner.queue, set()).add(owner.spec)
    for group, owner in live.group_owners.items():
        groups.setdefault(owner.queue, []).append(group)
        specs.setdefault(owner.queue, set()).add(owner.spec)
    found: dict[str, Orphan] = {}
    for queue in sorted({*topics, *groups, *live.queue_records} - planned):
        record = QueueRecord.from_record(queue, live.queue_records.get(queue))
        places = [(record.spec, record.spec_key)] if record.spec or record.spec_key else []
        places += [(spec, None) for spec in sorted(specs.get(queue, ())) if spec]
        if not any(recorded_under(spec, key, paths) for spec, key in places):
            continue
        shown = record.spec_key or record.spec or next(iter(sorted(specs.get(queue, ()))), queue)
        found[queue] = Orphan(record, shown, topics.get(queue, {}), tuple(sorted(groups.get(queue, []))))
    return found


def _taken(queues: list[QueueSpec]) -> tuple[set[str], set[str]]:
    """The topics and group ids the planned specs claim: never removed, whoever owned them."""
    return {name for q in queues for _, name in q.owned_topics()}, {q.group.id for q in queues}


def reads(
    queues: list[QueueSpec], live: LiveState, gone: Mapping[str, Orphan]
) -> tuple[list[str], dict[str, tuple[str | None, str | None]], set[str]]:
    """What planning the removals reads from the cluster (Cluster.read_removals): the orphans'
    topics, their groups (group type, queue topic) and the principals of their recorded ACLs."""
    topics, _ = _taken(queues)
    read_topics = sorted({name for o in gone.values() for name in o.topics if name not in topics})
    read_groups: dict[str, tuple[str | None, str | None]] = {}
    for orphan in gone.values():
        kind = orphan.record.group_type
        for group in orphan.all_groups():  # a group taken over too: its offsets say the old topics' lag
            tracker = group not in orphan.groups  # kmq's tracker group: members only
            read_groups[group] = (kind, None if tracker else orphan.queue_topic)
    principals = {a["principal"] for queue in gone for a in live.acl_records.get(queue, [])}
    return read_topics, read_groups, principals


def plan_with_removals(
    queues: list[QueueSpec],
    live: LiveState,
    cluster_label: str,
    paths: list[str],
    options: RemovalOptions,
    gone: Mapping[str, Orphan] | None = None,
) -> Plan:
    """The whole plan: ``diff`` of the specs, then the removal of every orphan under ``paths``."""
    gone = orphans(queues, live, paths) if gone is None else gone
    plan = diff(queues, live, cluster_label, gone)
    plan.paths, plan.options = list(paths), options
    plan_removals(plan, queues, live, gone)
    return plan


def plan_removals(plan: Plan, queues: list[QueueSpec], live: LiveState, gone: Mapping[str, Orphan]) -> None:
    """Each orphan's lines and what apply removes of it (``plan.removals``)."""
    released: set[tuple[str, str]] = set()  # an application's orphans share one release line
    for queue, orphan in sorted(gone.items()):
        removal = _OrphanRemoval(queue, orphan, queues, live, gone, plan.options)
        removal.plan(released)
        plan.changes += removal.lines
        plan.removals[queue] = removal.removal


class _OrphanRemoval:
    """One orphan's removal, planned in apply's order."""

    def __init__(
        self,
        queue: str,
        orphan: Orphan,
        queues: list[QueueSpec],
        live: LiveState,
        gone: Mapping[str, Orphan],
        options: RemovalOptions,
    ) -> None:
        self.queue, self.orphan, self.queues, self.live, self.gone, self.options = (
            queue,
            orphan,
            queues,
            live,
            gone,
            options,
        )
        self.taken_topics, self.taken_groups = _taken(queues)
        takers = {
            q.owner
            for q in queues
            if {name for _, name in q.owned_topics()} & set(orphan.topics) or q.group.id in orphan.groups
        }
        self.removal = Removal(orphan.spec, renamed_to=sorted(takers))
        self.lines: list[Change] = []
        self.activity = {g: live.removed_groups.get(g, GroupActivity(False, 0, 0)) for g in orphan.all_groups()}
        self.own_groups = [g for g in orphan.all_groups() if g not in self.taken_groups]
        # Members of a group a planned spec took over are its new worker's: only the orphan's own count.
        self.members = _members(self.activity[g] for g in self.own_groups)
        self.uninstalling = False

    def line(self, action: Action, kind: Kind, target: str, reason: str) -> Change:
        change = Change(action, kind, target, self.orphan.spec, reason=reason, removes=self.queue)
        self.lines.append(change)
        return change

    def plan(self, released: set[tuple[str, str]]) -> None:
        self._worker(released)
        self._acls()
        topic_lines, forget_topics = self._topics()
        waits = any(c.action == "wait" for c in topic_lines)
        forget_groups = self._groups(waits)
        self.lines += topic_lines
        self._records(forget_topics, forget_groups, waits)
        if self.removal.waits_for_worker:
            self.lines = [_waiting(c) for c in self.lines]
            self.removal = Removal(self.orphan.spec, renamed_to=self.removal.renamed_to, waits_for_worker=True)

    def _worker(self, released: set[tuple[str, str]]) -> None:
        """Uninstall the worker's release, or wait for a worker queueplane cannot stop."""
        record, stopped = self.orphan.record, self.members == 0
        where = f"{record.namespace}/{record.application}"
        siblings = _siblings(self.queue, record, self.queues, self.live, self.gone)
        note = ""
        if record.target == "kubernetes" and not record.released and not siblings:
            self.uninstalling = True
            release = (record.namespace, record.application)
            if release not in released:  # the application's other removed queues go with the same release
                released.add(release)
                self.removal.release = release
                self.removal.application = f"{self.queue.split('/', 1)[0]}/{record.application}"
                reason = "helm uninstall --wait: the worker drains (SIGTERM) and stops"
                self.line("delete", "release", where, reason)
            queue_object = f"{record.namespace}/{self.queue.split('/', 1)[1]}"
            self.removal.queue_object = (queue_object, release)
            self.line("delete", "queue-object", queue_object, f"goes with release {where} (kubectl get queues)")
        elif not stopped and siblings:
            note = f"release {where} still runs it with {', '.join(siblings)}: deploy the application without it first"
        elif not stopped:
            note = (
                f"stop the worker first ({'kill its Spark driver' if record.target == 'spark-submit' else 'stop it'})"
            )
        if note:
            counted = "an unknown number of" if self.members is None else str(self.members)
            self.line(
                "wait", "queue", self.queue, f"the group has {counted} member(s): {note}; nothing goes until then"
            )
            self.removal.waits_for_worker = True

    def _acls(self) -> None:
        """Revoke what apply granted for the queue, but what a planned spec wants or another queue recorded."""
        kept = {acl for q in self.queues for acl in wanted_acls(q)}
        for other in self.live.acl_records:
            if other != self.queue and other not in self.gone:
                kept |= recorded_acls(self.live, other)
        live, granted = self.live.acls, recorded_acls(self.live, self.queue)
        for acl in sorted(granted - kept):
            if live is not None and (acl.principal, acl.resource, acl.name, acl.operation, acl.prefixed) in live:
                self.line("delete", "acl", acl.describe(), "revoked: " + _acl_role(acl, granted))
                self.removal.acls.append(acl)

    def _topics(self) -> tuple[list[Change], list[str]]:
        """Each topic's line (shown after the group's) and the topics whose records go."""
        record = self.orphan.record
        lines: list[Change] = []
        forget: list[str] = []
        for name, role in sorted(self.orphan.topics.items()):
            if name in self.taken_topics:
                continue  # a planned spec took it over
            contents = self.live.removed_topics.get(name)
            if contents is None:
                forget.append(name)  # deleted by hand since: only its record is left
                continue
            spec, queue = self.orphan.spec, self.queue
            if record.deletion_policy != "delete":
                reason = (
                    f"kept with its data ({role}; deletionPolicy retain): no longer owned by a queue, a spec takes it "
                    f"over with spec.{_ADOPT_FIELD.get(role, 'topic')}.adopt: true"
                )
                lines.append(Change("retain", "topic", name, spec, reason=reason, removes=queue))
                forget.append(name)
                continue
            caught_up = {g: self.activity[g] for g in self.orphan.groups}  # a kmq tracker's group has no lag
            why = _waits(role, contents, caught_up, self.members, self.uninstalling, self.options)
            if why:
                lines.append(Change("wait", "topic", name, spec, reason=why, removes=queue))
                continue
            reason = f"deleted ({role}; deletionPolicy delete): caught up, {_age(contents, self.options)}"
            lines.append(Change("delete", "topic", name, spec, reason=reason, removes=queue))
            self.removal.topics.append(name)
            forget.append(name)
        return lines, forget

    def _groups(self, topics_wait: bool) -> list[str]:
        """Delete the groups and their configs (kept while a topic waits: their offsets say whether the
        queue is caught up); the recorded groups whose records go."""
        forget: list[str] = []
        for group in self.own_groups:
            seen = self.activity[group]
            if topics_wait:
                if not (seen.exists or seen.configs):
                    continue  # nothing to keep: the group never ran
                self.line(
                    "wait",
                    "group",
                    group,
                    "kept until the queue's topics are caught up and deleted: its offsets say how far they are",
                )
                continue
            if seen.exists:
                state = "share-partition state" if self.orphan.record.group_type == "share" else "committed offsets"
                self.line("delete", "group", group, f"deleted with its {state} (DeleteGroups)")
                self.removal.groups.append(group)
            if seen.configs:
                self.line(
                    "delete",
                    "group-config",
                    group,
                    f"{', '.join(seen.configs)} deleted (GROUP configs outlive the group)",
                )
                self.removal.group_configs[group] = list(seen.configs)
            if group in self.orphan.groups:
                forget.append(group)
        return forget

    def _records(self, topics: list[str], groups: list[str], waits: bool) -> None:
        """Forget the records of what goes; while a topic waits, keep the queue's record (noting what
        is done already) and the records of what waits."""
        keys = [*topics, *(GROUP_KEY + g for g in groups)]
        rewrite = False
        if waits:
            left = sorted(recorded_acls(self.live, self.queue) - set(self.removal.acls))
            kept = {
                **self.orphan.record.fields(),
                "released": self.orphan.record.released or self.uninstalling,
                "acls": [a.as_dict() for a in left],
            }
            rewrite = self.live.queue_records.get(self.queue) != kept
            self.removal.keep_record = kept if rewrite else None
        elif self.queue in self.live.queue_records:
            keys.append(ACLS_KEY + self.queue)
        if keys or rewrite:
            note = "; the queue's record stays, for what waits" if rewrite else ""
            self.line("delete", "records", self.queue, f"{len(keys)} owner record(s) forgotten{note}")
            self.removal.forget = keys


def _members(activity: Iterable[GroupActivity]) -> int | None:
    """The members of the orphan's groups (None: some group's cannot be read)."""
    total = 0
    for seen in activity:
        if seen.members is None:
            return None
        total += seen.members
    return total


def _siblings(
    queue: str, record: QueueRecord, queues: list[QueueSpec], live: LiveState, gone: Mapping[str, Orphan]
) -> list[str]:
    """The other queues the orphan's release runs: its application's, planned, or recorded and not removed."""
    if record.target != "kubernetes":
        return []
    team, release = queue.split("/", 1)[0], (record.namespace, record.application)
    planned = {
        q.owner
        for q in queues
        if q.team == team and q.deploy_target == "kubernetes" and (q.namespace, q.application) == release
    }
    recorded = set()
    for other, value in live.queue_records.items():
        if other == queue or other in gone or other.split("/", 1)[0] != team:
            continue
        theirs = QueueRecord.from_record(other, value)
        if theirs.target == "kubernetes" and (theirs.namespace, theirs.application) == release:
            recorded.add(other)
    return sorted(planned | recorded)


def _acl_role(acl: Acl, granted: set[Acl]) -> str:
    """Whose grant it was: a producer's (a principal granted only writes to the queue) or the worker's."""
    if all(a.operation == "WRITE" and a.resource == "TOPIC" for a in granted if a.principal == acl.principal):
        return "a producer of the removed queue"
    return "the removed queue's worker"


def _waits(
    role: str,
    contents: TopicContents,
    activity: Mapping[str, GroupActivity],
    members: int | None,
    uninstalling: bool,
    options: RemovalOptions,
) -> str:
    """Why a ``deletionPolicy: delete`` topic is not deleted yet ("" when it goes now)."""
    after = " (the release is uninstalled first: plan again once it is)" if uninstalling else ""
    if members is None:
        return f"waits until the queue is caught up: the group's members cannot be read on this listener{after}"
    if members:
        return f"waits until the queue is caught up: the group has members, the worker still runs{after}"
    lag = sum((seen.lag or 0) for seen in activity.values())
    if any(seen.lag is None and seen.exists for seen in activity.values()):
        return "waits until the queue is caught up: the queue's lag cannot be read"
    if lag:
        return f"waits until the queue is caught up: lag {lag} (records the worker has not finished)"
    if role == "dead-letter" and contents.records and not options.force_delete_dlq:
        return (
            f"waits: the dead-letter topic holds {contents.records} record(s); inspect or redrive them "
            "(queueplane dlq), or plan with --force-delete-dlq"
        )
    if contents.newest_ms is not None and options.now_ms - contents.newest_ms < options.grace_s * 1000:
        until = datetime.fromtimestamp((contents.newest_ms + options.grace_s * 1000) / 1000, UTC)
        grace = format_ms(options.grace_s * 1000)
        return f"waits for the removal grace ({grace} after its newest record): until {until:%Y-%m-%dT%H:%M:%SZ}"
    return ""


def _age(contents: TopicContents, options: RemovalOptions) -> str:
    """How old the topic's data is, in words that stay the same from one plan to the next (a saved
    plan is made again when applied, and must read the same)."""
    if contents.newest_ms is None:
        return "empty"
    return f"its newest record older than the removal grace of {format_ms(options.grace_s * 1000)}"


def _waiting(change: Change) -> Change:
    """A removal line while the worker still runs: shown as what will go, applied later."""
    if change.action in ("retain", "wait"):
        return change
    return replace(change, action="wait", reason=f"after the worker stops: {change.reason}")
