"""Spec validation: the JSON Schema first, then the rules a schema cannot say.

Validation never stops at the first problem: a run reports everything wrong in every
file, each problem naming its file and field, so a team fixes a spec in one go.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from queueplane.errors import Problem, SpecInvalid
from queueplane.kafka import names as kn
from queueplane.spec import durations
from queueplane.spec.files import SpecFile, expand_paths, parse_text, read_spec_file
from queueplane.spec.model import SHARE_RESERVE_DELIVERIES, QueueSpec, build
from queueplane.spec.platform import Platforms, platform_problems
from queueplane.spec.schema_errors import schema_problems


@dataclass(frozen=True)
class ShareBounds:
    """The range a broker accepts for share-group settings, and where the numbers came from."""

    lock_ms: tuple[int, int] = (15_000, 60_000)
    delivery_limit: tuple[int, int] = (2, 10)
    max_record_locks: tuple[int, int] = (100, 4_000)
    source: str = "Kafka's default broker bounds (no broker connected)"

    @classmethod
    def from_broker_configs(cls, configs: dict[str, str], broker: str) -> ShareBounds:
        """Bounds from a broker's DescribeConfigs answer; a missing name keeps the documented default."""
        default = cls()

        def pair(lo: str, hi: str, fallback: tuple[int, int]) -> tuple[int, int]:
            return (int(configs.get(lo, fallback[0])), int(configs.get(hi, fallback[1])))

        return cls(
            lock_ms=pair(kn.BROKER_SHARE_LOCK_MIN, kn.BROKER_SHARE_LOCK_MAX, default.lock_ms),
            delivery_limit=pair(kn.BROKER_SHARE_DELIVERY_MIN, kn.BROKER_SHARE_DELIVERY_MAX, default.delivery_limit),
            max_record_locks=pair(kn.BROKER_SHARE_LOCKS_MIN, kn.BROKER_SHARE_LOCKS_MAX, default.max_record_locks),
            source=f"bounds of broker {broker}",
        )


def semantic_problems(spec: SpecFile, queue: QueueSpec) -> list[Problem]:
    """Rules that need more than one field."""
    raw_spec = spec.data["spec"]
    group = queue.group
    out: list[Problem] = []

    def add(ptr: str, message: str, hint: str | None = None) -> None:
        out.append(spec.problem(ptr, message, hint))

    if group.type in ("share", "kmq") and group.ordering != "none":
        add(
            "/spec/group/ordering",
            f'must be "none" for {group.type} groups; got "{group.ordering}"',
            "share and kmq queues hand records to many workers at once; use group.type consumer for order",
        )
    if queue.exactly_once and group.type != "consumer":
        add(
            "/spec/processing/exactlyOnce",
            f"is supported only for consumer groups, not {group.type}",
            "Kafka transactions commit consumer-group offsets (KIP-447); share and kmq acknowledge per record",
        )
    if "markers" in raw_spec and group.type != "kmq":
        add("/spec/markers", f"applies only to kmq groups, not {group.type}", "remove it")
    if "retry" in raw_spec and group.type == "share":
        add(
            "/spec/retry",
            "does not apply to share groups: the broker redelivers after a release",
            "remove it; lockDuration and deliveryLimit govern share redelivery",
        )
    reserved = kn.reserved_group_use(group.id)
    if reserved is not None:
        add("/spec/group/id", f'"{group.id}" {reserved}', "choose another group id")
    if group.lock_duration_ms <= 0:
        add("/spec/group/lockDuration", "must be longer than 0s")
    written = [("/spec/processing/output/topic", queue.output_topic)] if queue.output_topic else []
    for ptr, name in [*queue.owned_topics(), *written]:
        if kn.is_internal_topic(name):
            add(
                ptr,
                f'"{name}" is an internal topic of Kafka or its tools',
                "queueplane never creates, alters or writes one",
            )
    if queue.dead_letter.name == queue.topic.name:
        add(
            "/spec/deadLetter/topic",
            f'must differ from the queue topic "{queue.topic.name}"',
            "records sent to the DLQ would be consumed again",
        )
    if queue.output_topic is not None:
        for ptr, name in queue.owned_topics():
            if queue.output_topic == name:
                add(
                    "/spec/processing/output/topic",
                    f'must differ from {ptr} "{name}"',
                    "outputs written there would loop back into this queue",
                )
    if queue.markers is not None:
        for ptr, name in queue.owned_topics()[:2]:
            if queue.markers.name == name:
                add("/spec/markers/topic", f'must differ from {ptr} "{name}"')
        retention_ms = int(queue.markers.config[kn.RETENTION_MS])
        if retention_ms < 2 * group.lock_duration_ms:
            add(
                "/spec/markers/retention",
                f"{durations.format_ms(retention_ms)} is shorter than twice lockDuration "
                f"({durations.format_ms(2 * group.lock_duration_ms)})",
                "markers must outlive the deliveries they track",
            )
    if queue.retry_backoff_ms > queue.retry_max_backoff_ms:
        add(
            "/spec/retry/backoff",
            f"{durations.format_ms(queue.retry_backoff_ms)} is longer than maxBackoff "
            f"{durations.format_ms(queue.retry_max_backoff_ms)}",
        )
    if queue.image is not None and _unpinned(queue.image):
        add(
            "/spec/deployment/image",
            f'"{queue.image}" is not pinned to a version',
            "use an explicit tag other than latest, or a @sha256 digest, so every pod runs the same code",
        )
    if queue.min_executors > queue.max_executors:
        add("/spec/autoscaling/minExecutors", f"{queue.min_executors} is more than maxExecutors {queue.max_executors}")
    if queue.deploy_target == "spark-submit":
        for field in ("namespace", "image"):
            if field in raw_spec.get("deployment", {}):
                add(
                    f"/spec/deployment/{field}",
                    "applies to target kubernetes only",
                    "a spark-submit worker runs on the Spark cluster's nodes with their Python; remove it",
                )
    return out


def _unpinned(image: str) -> bool:
    if "@sha256:" in image:
        return False
    last = image.rsplit("/", 1)[-1]
    return ":" not in last or last.rsplit(":", 1)[1] == "latest"


RESERVE_HINT = (
    f"; the group's share.delivery.count.limit is deliveryLimit + {SHARE_RESERVE_DELIVERIES}, reserve deliveries "
    "that send a record to the DLQ when its last delivery ended without an outcome"
)


def bound_problems(spec: SpecFile, queue: QueueSpec, bounds: ShareBounds) -> list[Problem]:
    """Share-group settings inside the range the broker accepts."""
    group = queue.group
    if group.type != "share":
        return []
    # The group's share.delivery.count.limit is deliveryLimit plus the reserve deliveries.
    low_limit, high_limit = bounds.delivery_limit
    checks: list[tuple[str, int, tuple[int, int], Callable[[int], str], tuple[str, str]]] = [
        (
            "/spec/group/lockDuration",
            group.lock_duration_ms,
            bounds.lock_ms,
            durations.format_ms,
            (kn.BROKER_SHARE_LOCK_MIN, kn.BROKER_SHARE_LOCK_MAX),
        ),
        (
            "/spec/group/deliveryLimit",
            group.delivery_limit,
            (max(1, low_limit - SHARE_RESERVE_DELIVERIES), high_limit - SHARE_RESERVE_DELIVERIES),
            str,
            (kn.BROKER_SHARE_DELIVERY_MIN, kn.BROKER_SHARE_DELIVERY_MAX),
        ),
        (
            "/spec/group/maxInFlight",
            group.max_in_flight,
            bounds.max_record_locks,
            str,
            (kn.BROKER_SHARE_LOCKS_MIN, kn.BROKER_SHARE_LOCKS_MAX),
        ),
    ]
    return [
        spec.problem(
            ptr,
            f"{show(value)} is outside the share-group range {show(lo)}..{show(hi)} ({bounds.source})",
            f"the broker bounds are {names[0]} and {names[1]}"
            + (RESERVE_HINT if ptr == "/spec/group/deliveryLimit" else ""),
        )
        for ptr, value, (lo, hi), show, names in checks
        if not lo <= value <= hi
    ]


def _collision_key(topic: str) -> str:
    # Kafka refuses topics whose names differ only in '.' versus '_' (metric names collide).
    return topic.replace(".", "_")


# What the queues of one application share (one driver pod, one executor pool, one release):
# the spec field, and how to read it from a queue.
APPLICATION_SHARED: tuple[tuple[str, Callable[[QueueSpec], object]], ...] = (
    ("/metadata/team", lambda q: q.team),
    ("/spec/deployment/namespace", lambda q: q.namespace),
    ("/spec/deployment/target", lambda q: q.deploy_target),
    ("/spec/deployment/image", lambda q: q.image),
    ("/spec/deployment/driver", lambda q: q.driver),
    ("/spec/deployment/executor", lambda q: q.executor),
)


def application_problems(queues: list[tuple[SpecFile, QueueSpec]]) -> list[Problem]:
    """Queues of one application agree on what they share; each disagreement names the first spec's file."""
    out: list[Problem] = []
    first: dict[str, tuple[SpecFile, QueueSpec]] = {}
    for spec, queue in queues:
        if queue.application not in first:
            first[queue.application] = (spec, queue)
            continue
        other_spec, other = first[queue.application]
        if queue.deploy_target == other.deploy_target == "spark-submit":
            out.append(
                spec.problem(
                    "/spec/deployment/application",
                    f'"{queue.application}" is also the application of {other_spec.path}, and a spark-submit '
                    "worker runs one queue",
                    "several queues share one application on target kubernetes; give this queue its own application",
                )
            )
        for ptr, read in APPLICATION_SHARED:
            if read(queue) != read(other):
                out.append(
                    spec.problem(
                        ptr,
                        f"is {_shown(read(queue))} here and {_shown(read(other))} in {other_spec.path}, which runs in "
                        f'the same worker application "{queue.application}"',
                        "the queues of one application share its driver, executors and Helm release: make them "
                        "agree, or give this queue its own /spec/deployment/application",
                    )
                )
    return out


def _shown(value: object) -> str:
    return "not set" if value is None else json.dumps(value, sort_keys=True)


def cross_spec_problems(queues: list[tuple[SpecFile, QueueSpec]]) -> list[Problem]:
    """Ownership rules across every spec of one run: names, group ids and topics are owned once,
    and the queues of one application agree on what they share."""
    out: list[Problem] = application_problems(queues)
    names: dict[str, str] = {}
    groups: dict[str, str] = {}
    topics: dict[str, tuple[str, str]] = {}
    colliding: dict[str, tuple[str, str]] = {}
    for spec, queue in queues:
        if queue.name in names:
            out.append(
                spec.problem(
                    "/metadata/name",
                    f'"{queue.name}" is already the name of {names[queue.name]}',
                    "queue names are unique across all specs",
                )
            )
        names.setdefault(queue.name, spec.path)
        if queue.group.id in groups:
            out.append(
                spec.problem(
                    "/spec/group/id",
                    f'group "{queue.group.id}" is already used by {groups[queue.group.id]}',
                    "two queues sharing one group would steal each other's records",
                )
            )
        groups.setdefault(queue.group.id, spec.path)
        for ptr, topic in queue.owned_topics():
            if topic in topics:
                owner_file, owner_ptr = topics[topic]
                where = "this spec" if owner_file == spec.path else owner_file
                out.append(spec.problem(ptr, f'topic "{topic}" is already owned by {where} ({owner_ptr})'))
                continue
            topics[topic] = (spec.path, ptr)
            key = _collision_key(topic)
            if key in colliding and colliding[key][0] != topic:
                other, other_file = colliding[key]
                out.append(
                    spec.problem(
                        ptr,
                        f'topic "{topic}" collides with "{other}" in {other_file}',
                        "Kafka treats '.' and '_' alike in topic metric names; rename one",
                    )
                )
            colliding.setdefault(key, (topic, spec.path))
    return out


@dataclass
class Loaded:
    """The outcome of loading specs: the valid queues, and every problem found."""

    queues: list[QueueSpec]
    problems: list[Problem]
    # Every spec that passed the schema (its rules can still fail), for with_bounds.
    checked: list[tuple[SpecFile, QueueSpec]] = field(default_factory=list, repr=False)

    def raise_if_invalid(self) -> list[QueueSpec]:
        if self.problems:
            raise SpecInvalid(self.problems)
        return self.queues

    def with_bounds(self, bounds: ShareBounds) -> Loaded:
        """Add the broker-bound rules without parsing or schema-checking the files again."""
        found = [p for spec, queue in self.checked for p in bound_problems(spec, queue, bounds)]
        failed = {p.file for p in found}
        return Loaded([q for q in self.queues if q.source not in failed], _sorted(self.problems + found), self.checked)


def _sorted(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: (p.file, p.line or 0, p.pointer))


Checked = list[tuple[SpecFile, QueueSpec]]


def _platform_checked(valid: Checked, root: str | None = None) -> tuple[Checked, list[Problem]]:
    """The specs their platform file allows, and the problems of those it does not (or of the
    platform file itself, which then allows none of its specs). Where platform files exist a
    spec none of them governs is refused (``Platforms.closed_problems``). Run every time,
    outside the spec cache: the verdict depends on the platform files and on where the spec sits."""
    platforms = Platforms(root)
    allowed: Checked = []
    problems: list[Problem] = []
    for spec, queue in valid:
        platform, platform_file_problems, governed = platforms.for_spec(spec.path)
        problems.extend(platform_file_problems)
        found = platforms.closed_problems(spec, governed)
        if platform is not None:
            found += platform_problems(spec, queue, platform, partial(platforms.team_queues, platform))
        problems.extend(found)
        if not found and (platform is not None or not governed):
            allowed.append((spec, queue))
    return allowed, problems


def check_files(files: Iterable[SpecFile], bounds: ShareBounds | None, root: str | None = None) -> Loaded:
    """Check parsed files; ``bounds`` None leaves out the rules that need a broker's limits."""
    problems: list[Problem] = []
    built: list[tuple[SpecFile, QueueSpec]] = []
    valid: list[tuple[SpecFile, QueueSpec]] = []
    for spec in files:
        problems.extend(spec.problems)
        if spec.data is None or spec.problems:
            continue
        if not spec.rules_passed:
            found = schema_problems(spec)
            if found:
                problems.extend(found)
                continue
        queue = build(spec.data, spec.path)
        built.append((spec, queue))
        found = [] if spec.rules_passed else semantic_problems(spec, queue)
        problems.extend(found)
        if not found:
            spec.rules_passed = True
            valid.append((spec, queue))
    valid, refused = _platform_checked(valid, root)
    problems.extend(refused)
    problems.extend(cross_spec_problems(valid))
    loaded = Loaded([q for _, q in valid], _sorted(problems), built)
    return loaded.with_bounds(bounds) if bounds is not None else loaded


def load_specs(paths: list[str], bounds: ShareBounds | None = ShareBounds()) -> Loaded:
    """Read and check every spec under ``paths`` (files or directories)."""
    return check_files([read_spec_file(p) for p in expand_paths(paths)], bounds)


def check_text(text: str, source: str = "spec.yaml", bounds: ShareBounds | None = ShareBounds()) -> Loaded:
    """Check one spec given as YAML text (tests, and the Airflow DAG factory's import errors)."""
    return check_files([parse_text(text, source)], bounds)
