"""The provisioning steps as functions: what the CLI, the Airflow operators and tests call.

Specs are checked offline first (schema and rules that need no broker), so a broken
spec is reported without touching the network; then the rules that depend on the
connected broker's limits run against the real numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from queueplane.deploy.kube_access import KubeAccess
from queueplane.errors import UsageError
from queueplane.kafka.cluster import Cluster, LiveState
from queueplane.kafka.target import KafkaTarget
from queueplane.provision import removal
from queueplane.provision.acls import wanted_acls
from queueplane.provision.apply import ApplyFailed, ApplyReport, apply_plan
from queueplane.provision.plan import MAX_MESSAGE_BYTES, Plan, RemovalOptions, brief, desired_state
from queueplane.spec.cache import SpecCache
from queueplane.spec.files import expand_paths, read_spec_file
from queueplane.spec.model import QueueSpec
from queueplane.spec.rules import Loaded, ShareBounds, check_files

VERIFY_TIMEOUT_S = 120.0


def check_specs(paths: list[str], persist: bool = True, root: str | None = None) -> Loaded:
    """Read and check every spec under ``paths`` without broker bounds, reusing earlier verdicts
    (kept on disk unless ``persist`` is False). ``root``: the tree whose platform files govern
    specs outside any git repository (see spec/platform.py)."""
    cache = SpecCache(persist=persist)
    files = [read_spec_file(p, cache.lookup) for p in expand_paths(paths)]
    loaded = check_files(files, None, root)
    cache.remember(files)
    return loaded


def validate(paths: list[str], target: KafkaTarget | None = None, wait_s: float = 0.0) -> list[QueueSpec]:
    """Valid queues under ``paths``; raises SpecInvalid with every problem. Connects only if given a
    target, waiting up to ``wait_s`` for it to answer (workers starting before their broker)."""
    loaded = check_specs(paths)
    if target is None:
        return loaded.with_bounds(ShareBounds()).raise_if_invalid()
    loaded.raise_if_invalid()
    return loaded.with_bounds(broker_bounds(Cluster.when_reachable(target, wait_s))).raise_if_invalid()


def broker_bounds(cluster: Cluster) -> ShareBounds:
    return ShareBounds.from_broker_configs(cluster.broker_configs(), cluster.target.label)


@dataclass
class Planned:
    queues: list[QueueSpec]
    plan: Plan
    cluster: Cluster
    live: LiveState  # what the plan read (a saved plan keeps its digest)
    paths: list[str] = field(default_factory=list)  # what was planned: orphans are found under them
    options: RemovalOptions = field(default_factory=RemovalOptions)


def _no_specs_under(paths: list[str]) -> bool:
    """Whether ``paths`` are folders holding no spec at all: their last specs were removed, and
    planning them removes what those specs made."""
    if not paths or not all(Path(p).is_dir() for p in paths):
        return False
    try:
        expand_paths(paths)
    except UsageError:
        return True
    return False


def plan(paths: list[str], target: KafkaTarget, options: RemovalOptions | None = None) -> Planned:
    """Check the specs, read the cluster in batched requests, and diff; queues whose specs are
    gone from ``paths`` are removed as ``options`` say (provision/removal.py)."""
    if _no_specs_under(paths):
        return plan_queues([], Cluster(target), paths, options)
    loaded = check_specs(paths)
    loaded.raise_if_invalid()
    cluster = Cluster(target)
    return plan_queues(loaded.with_bounds(broker_bounds(cluster)).raise_if_invalid(), cluster, paths, options)


def plan_queues(
    queues: list[QueueSpec], cluster: Cluster, paths: list[str] | None = None, options: RemovalOptions | None = None
) -> Planned:
    """The plan of ``queues``, and of the removal of every queue whose spec is gone from ``paths``
    (the planned files and folders, kept absolute so a saved plan finds them from anywhere)."""
    paths = [str(Path(p).resolve()) for p in (paths if paths is not None else [q.source for q in queues])]
    # The time the removal grace counts from is the plan's.
    options = replace(options or RemovalOptions(), now_ms=int(time.time() * 1000))
    topics, groups = desired_state(queues)
    configured = {t.name: list(t.config) for t in topics if t.managed and t.config}
    for topic in topics:  # a queue topic's size bounds its DLQ's (plan.dead_letter_config), set or not
        if topic.role == "queue":
            configured[topic.name] = sorted({*configured.get(topic.name, []), MAX_MESSAGE_BYTES})
    principals = {acl.principal for q in queues for acl in wanted_acls(q)}
    live = cluster.read_state(
        [t.name for t in topics], [g.id for g in groups], configured, principals, [q.owner for q in queues]
    )
    gone = removal.orphans(queues, live, paths)
    if gone:
        cluster.read_removals(live, *removal.reads(queues, live, gone))
    label = f"{cluster.target.label}, {len(cluster.broker_ids)} broker(s)"
    planned = removal.plan_with_removals(queues, live, label, paths, options, gone)
    return Planned(queues, planned, cluster, live, paths, options)


def apply(
    planned: Planned,
    on_step: Callable[[str, int], None] = lambda _s, _n: None,
    kinds: frozenset[str] | None = None,
    kube: KubeAccess | None = None,
) -> ApplyReport:
    """Apply the plan (only changes of ``kinds`` if given), then read the cluster back until it matches.

    Brokers pick up config changes from the metadata log a moment after the controller
    accepts them; reading back makes "apply finished" mean "a new plan has nothing to apply"
    (what a removal keeps or waits for stays in it). ``kube``: how to reach the Kubernetes
    cluster whose Helm releases a removal uninstalls.
    """
    plan = planned.plan.only(kinds) if kinds is not None else planned.plan
    report = apply_plan(planned.cluster, plan, on_step, kube)
    on_step("waiting for the brokers to show the changes", 0)
    deadline = time.monotonic() + VERIFY_TIMEOUT_S
    while True:
        latest = plan_queues(planned.queues, planned.cluster, planned.paths, planned.options).plan
        remaining = (latest.only(kinds) if kinds is not None else latest).actionable
        if not remaining:
            return report
        if time.monotonic() > deadline:
            raise ApplyFailed(
                f"every change was accepted, but after {VERIFY_TIMEOUT_S:.0f}s the cluster still differs: "
                f"{brief(remaining)}",
                report,
            )
        time.sleep(0.2)
